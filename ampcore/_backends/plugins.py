"""Plugin loading: entry points of group ``ampcore``, each loaded in isolation.

pluggy's ``load_setuptools_entrypoints`` stops at the first plugin that fails to import, so
the entry points are iterated here one by one: a plugin that fails to import, raises, has
an invalid hook signature or a misspelled hook is recorded, reported with a
:class:`PluginWarning` naming it and its distribution, and skipped.  Every other plugin
still loads.  With ``AMPCORE_STRICT_PLUGINS=1`` the first broken plugin raises.  An import
that never returns is waited for at most ``AMPCORE_PLUGIN_IMPORT_TIMEOUT`` seconds
(:mod:`.importing`); contract-1 plugins load through :mod:`.contract1` with a warning; two
plugins claiming one backend name resolve as :mod:`.claims` says.

Each plugin is known by a unique name: its entry-point name, or ``distribution:entry-point``
when entry points of two distributions share that name (ampcore's ``npu`` and a vendor's).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, final

import pluggy

from .. import hookspec as _hookspec
from .._errors import AmpcoreError, PluginError, PluginWarning, warn_at
from .._forklock import LOCK
from .backend import Backend
from .claims import claim_status, conflict_message, replacement_message, resolve_claims
from .contract import SPEC_NAMES, check_contract, unknown_hooks
from .contract1 import adapt, warn_deprecated
from .importing import ENV_IMPORT_TIMEOUT, ImportTimeout, call_bounded, import_timeout
from .sources import (
    NOT_PLUGINS,
    describe_failure,
    env_list,
    load_entry_point,
    module_file,
    origin_of_entry_point,
    unique_entry_points,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_BLOCK",
    "ENV_DISABLE_AUTOLOAD",
    "ENV_IMPORT_TIMEOUT",
    "ENV_PLUGINS",
    "ENV_STRICT",
    "PluginInfo",
    "PluginManager",
    "PluginStatus",
]

ENTRY_POINT_GROUP: Final = _hookspec.ENTRY_POINT_GROUP
ENV_DISABLE_AUTOLOAD: Final = "AMPCORE_DISABLE_PLUGIN_AUTOLOAD"
ENV_PLUGINS: Final = "AMPCORE_PLUGINS"
ENV_BLOCK: Final = "AMPCORE_BLOCK_PLUGINS"
ENV_STRICT: Final = "AMPCORE_STRICT_PLUGINS"

PluginStatus = Literal["loaded", "failed", "blocked", "not-allowed", "disabled", "conflict", "replaced"]
PluginSource = Literal["entry-point", "in-process"]

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_logger: Final = logging.getLogger("ampcore")


@dataclass
class PluginInfo:
    """What ampcore knows about one plugin (shown by ``ampcore info``).

    ``name`` is unique: the entry-point name, or ``distribution:entry-point`` when two
    distributions use one entry-point name.  ``status`` is one of ``loaded``, ``failed``
    (see ``error``), ``blocked`` (``AMPCORE_BLOCK_PLUGINS``), ``not-allowed`` (not in
    ``AMPCORE_PLUGINS``), ``disabled`` (``AMPCORE_DISABLE_PLUGIN_AUTOLOAD``), ``conflict``
    (another plugin that is not first-party claims its backend name) or ``replaced`` (a
    first-party adapter whose backend name another plugin claims; ``error`` names it).
    ``contract`` is the adapter contract the plugin targets (once it was imported).
    """

    name: str
    distribution: str | None
    version: str | None
    source: PluginSource
    status: PluginStatus
    error: str | None = None
    backend: str | None = None
    contract: int | None = None


@final
class PluginManager:
    """Loads adapter plugins and owns the backends they describe.

    All state lives on the instance; :func:`ampcore.get_backend` and friends use one
    process-wide instance created on first use.

    Args:
        environ: where the ``AMPCORE_*`` controls are read (default ``os.environ``).
        entry_points: returns the entry points to load (default: installed distributions'
            entry points of group ``ampcore``).

    Example::

        >>> pm = PluginManager(environ={"AMPCORE_PLUGINS": "cpu"})
        >>> [(p.name, p.status) for p in pm.plugins() if p.name in ("cpu", "cuda")]
        [('cpu', 'loaded'), ('cuda', 'not-allowed')]
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        entry_points: Callable[[], Iterable[importlib.metadata.EntryPoint]] | None = None,
    ) -> None:
        if environ is not None and not isinstance(environ, Mapping):
            raise AmpcoreError(
                f"PluginManager(environ={environ!r}): expected a mapping of environment variables "
                "such as os.environ or {'AMPCORE_PLUGINS': 'cpu'}, or None for os.environ"
            )
        if entry_points is not None and not callable(entry_points):
            raise AmpcoreError(
                f"PluginManager(entry_points={entry_points!r}): expected a callable returning entry "
                "points, or None for the installed ones"
            )
        self._environ = os.environ if environ is None else environ
        self._entry_points = entry_points or (lambda: importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        self._pm = self._new_pluggy()
        self._lock = LOCK  # a fork never interrupts plugin loading (see ampcore._forklock)
        self._loaded = False
        self._infos: dict[str, PluginInfo] = {}
        self._claims: dict[str, list[Backend]] = {}
        #: bumped on every change, so that callers can cache resolutions.
        self.generation = 0

    @property
    def strict(self) -> bool:
        """``AMPCORE_STRICT_PLUGINS``: raise on the first broken plugin instead of warning."""
        return self._environ.get(ENV_STRICT, "").strip().lower() in _TRUE

    # -- loading -------------------------------------------------------------------------
    @staticmethod
    def _new_pluggy() -> pluggy.PluginManager:
        pm = pluggy.PluginManager(_hookspec.PROJECT_NAME)
        pm.add_hookspecs(_hookspec)
        return pm

    @property
    def loaded(self) -> bool:
        """Whether the entry points were loaded (:meth:`load_entry_points` completed)."""
        return self._loaded

    def load_entry_points(self) -> None:
        """Load every entry point of group ``ampcore`` once, honouring the env controls.

        All or nothing: when loading stops half-way (strict mode raising, a
        ``KeyboardInterrupt``), everything this attempt registered is dropped and the next
        call starts again, so it raises the same error again instead of reporting that no
        plugin is loaded.
        """
        with self._lock:
            if self._loaded:
                return
            infos, claims = dict(self._infos), {name: list(b) for name, b in self._claims.items()}
            try:
                self._load_all()
            except BaseException:
                # Only reachable before anything else was registered (register() loads first).
                self._pm, self._infos, self._claims = self._new_pluggy(), infos, claims
                raise
            self._loaded = True
            self.generation += 1

    def _load_all(self) -> None:
        disabled = self._environ.get(ENV_DISABLE_AUTOLOAD, "").strip().lower() in _TRUE
        allow = env_list(self._environ, ENV_PLUGINS)
        block = set(env_list(self._environ, ENV_BLOCK))
        timeout_s = import_timeout(self._environ)
        entries = unique_entry_points(self._entry_points())
        known: set[str | None] = set()
        for key, ep in entries:
            dist = ep.dist.name if ep.dist is not None else None
            version = ep.dist.version if ep.dist is not None else None
            names = {ep.name, dist, key, f"{dist}:{ep.name}" if dist else None}
            known |= names
            info = PluginInfo(key, dist, version, "entry-point", "loaded")
            self._infos[key] = info
            if names & block:
                info.status, info.error = "blocked", f"blocked by {ENV_BLOCK}"
            elif allow and not names & set(allow):
                info.status, info.error = "not-allowed", f"not listed in {ENV_PLUGINS}"
            elif disabled and not allow:
                info.status, info.error = "disabled", f"{ENV_DISABLE_AUTOLOAD} is set"
            else:
                self._load_one(ep, info, timeout_s)
        missing = [name for name in allow if name not in known]
        if missing:
            warn_at(
                f"{ENV_PLUGINS} names {missing}, but no such plugin is installed; "
                f"installed plugins: {sorted(key for key, _ in entries) or 'none'}",
                PluginWarning,
                None,
            )

    def _load_one(self, ep: importlib.metadata.EntryPoint, info: PluginInfo, timeout_s: float | None) -> None:
        try:
            plugin = call_bounded(lambda: load_entry_point(ep), timeout_s, info.name)
            backend = self._register(plugin, info)
        except (Exception, SystemExit) as exc:  # a plugin calling exit() must not end the program
            message = describe_failure(exc)
            info.status, info.error = "failed", message
            if self._pm.get_plugin(info.name) is not None:
                self._pm.unregister(name=info.name)
            text = (
                f'Error loading ampcore plugin "{info.name}" ({origin_of_entry_point(info.distribution)}, '
                f'entry point "{ep.value}"): {message}; the plugin was skipped'
            )
            if self.strict:
                raise PluginError(info.name, message, info.distribution) from exc
            # (no look-up of a hung module's file: finding it may import its package again)
            warn_at(text, PluginWarning, None if isinstance(exc, ImportTimeout) else module_file(ep.value))
            return
        info.backend = backend.name
        self._add_claim(backend)

    def _mark_broken(self, name: str, message: str) -> None:
        """A lazily called hook of plugin ``name`` broke the contract: report it as failed."""
        info = self._infos.get(name)
        if info is not None:
            info.status, info.error = "failed", message
        self.generation += 1
        warn_at(f'ampcore plugin "{name}" broke the adapter contract: {message}', PluginWarning, None)

    def _register(self, plugin: object, info: PluginInfo) -> Backend:
        name, distribution = info.name, info.distribution
        if isinstance(plugin, NOT_PLUGINS):
            raise PluginError(
                name,
                f"expected a module or an object with @ampcore.hookimpl functions "
                f"({', '.join(_hookspec.REQUIRED_HOOKS)}), got {type(plugin).__name__} {plugin!r}",
                distribution,
            )
        info.contract = contract = check_contract(plugin, name, distribution)
        unknown = unknown_hooks(plugin, contract)
        if unknown:
            raise PluginError(
                name,
                f"unknown hook(s) {', '.join(unknown)}; valid hooks: {', '.join(sorted(SPEC_NAMES))}",
                distribution,
            )
        original = plugin
        if contract in _hookspec.DEPRECATED_CONTRACTS:
            plugin = adapt(plugin, name, distribution)
        self._check_markers(plugin, name, distribution)
        try:
            self._pm.register(plugin, name=name)
        except ValueError as exc:  # pluggy: name or object already registered
            raise PluginError(name, str(exc), distribution) from exc
        except pluggy.PluginValidationError as exc:
            raise PluginError(name, str(exc), distribution) from exc
        try:
            backend = Backend(
                self._pm, plugin, name, distribution, info.version, on_broken=lambda m: self._mark_broken(name, m)
            )
            if plugin is not original:  # (inside: a warning turned into an error undoes the registration)
                warn_deprecated(original, name, distribution)
        except BaseException:
            self._pm.unregister(plugin)
            raise
        return backend

    def _check_markers(self, plugin: object, name: str, distribution: str | None) -> None:
        """Every function named like a hook must carry ``@ampcore.hookimpl``: pluggy would
        skip an unmarked one silently (an availability or overflow-flag hook lost)."""
        for hook in sorted(SPEC_NAMES):
            function = getattr(plugin, hook, None)
            if callable(function) and self._pm.parse_hookimpl_opts(plugin, hook) is None:
                raise PluginError(
                    name, f"{hook} is not marked as a hook: decorate it with @ampcore.hookimpl", distribution
                )

    def _add_claim(self, backend: Backend) -> None:
        self._claims.setdefault(backend.name, []).append(backend)
        self._refresh_statuses(backend.name)
        if self._winner(backend.name) is None:
            if self.strict:
                raise self._conflict_error(backend.name)
            warn_at(str(self._conflict_error(backend.name)), PluginWarning, None)

    # -- in-process registration ---------------------------------------------------------
    def register(self, plugin: object, name: str | None = None) -> Backend:
        """Register an adapter object or module in process; raise :class:`PluginError` if it
        breaks the contract.  Returns the backend it describes."""
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise AmpcoreError(
                f"register_plugin(name={name!r}): expected a non-empty str, or None for the plugin's __name__"
            )
        if isinstance(plugin, NOT_PLUGINS):
            raise PluginError(
                repr(plugin),
                f"register_plugin({plugin!r}): expected a module or an object with @ampcore.hookimpl "
                f"functions ({', '.join(_hookspec.REQUIRED_HOOKS)}), got {type(plugin).__name__}",
            )
        self.load_entry_points()
        with self._lock:
            default = getattr(plugin, "__name__", None)
            name = name or (default if isinstance(default, str) and default else None) or f"plugin-{id(plugin):x}"
            if name in self._infos and self._infos[name].status not in ("failed",):
                raise PluginError(
                    name, "a plugin of this name is already registered; unregister it first or choose another name"
                )
            previous = self._infos.get(name)
            info = PluginInfo(name, None, None, "in-process", "loaded")
            backend = self._register(plugin, info)
            info.backend = backend.name
            self._infos[name] = info
            try:
                self._add_claim(backend)
            except BaseException:  # strict mode refused a conflict: undo the registration
                self._drop_claim(backend)
                if previous is None:
                    del self._infos[name]
                else:
                    self._infos[name] = previous
                self._pm.unregister(name=name)
                raise
            self.generation += 1
            return backend

    def unregister(self, name: str) -> None:
        """Remove a plugin registered under ``name`` (in process or from an entry point)."""
        with self._lock:
            info = self._infos.pop(name, None) if isinstance(name, str) else None
            if info is None:
                raise AmpcoreError(f"unregister_plugin({name!r}): no such plugin; registered: {sorted(self._infos)}")
            if self._pm.get_plugin(name) is not None:
                self._pm.unregister(name=name)
            for backend in self._claims.get(info.backend or "", []):
                if backend.plugin_name == name:
                    self._drop_claim(backend)
                    break
            self.generation += 1

    def _drop_claim(self, backend: Backend) -> None:
        claims = [b for b in self._claims.get(backend.name, []) if b is not backend]
        if claims:
            self._claims[backend.name] = claims
            self._refresh_statuses(backend.name)
        else:
            self._claims.pop(backend.name, None)

    # -- queries -------------------------------------------------------------------------
    def plugins(self) -> list[PluginInfo]:
        """Every plugin seen, loaded or not, sorted by name."""
        self.load_entry_points()
        return sorted(self._infos.values(), key=lambda info: info.name)

    def backend_names(self) -> list[str]:
        """Names of every backend some loaded plugin claims (conflicted ones included)."""
        self.load_entry_points()
        return sorted(self._claims)

    def backends(self) -> list[Backend]:
        """Backends that resolve to one plugin, sorted by name (conflicted ones left out)."""
        self.load_entry_points()
        winners = (self._winner(name) for name in sorted(self._claims))
        return [b for b in winners if b is not None]

    def backend(self, name: str) -> Backend:
        """The backend called ``name``; raises for unknown names (a ``KeyError`` that lists the
        known backends and what each plugin became) and unresolved conflicts."""
        self.load_entry_points()
        if name not in self._claims:
            plugins = ", ".join(f"{i.name} -> {i.backend or i.status}" for i in self._infos.values()) or "none loaded"
            known = ", ".join(sorted(self._claims)) or "none"
            raise KeyError(f"unknown backend {name!r}; known backends: {known} (plugins: {plugins})")
        winner = self._winner(name)
        if winner is None:
            raise self._conflict_error(name)
        return winner

    def _winner(self, name: str) -> Backend | None:
        return resolve_claims(self._claims[name]).winner

    def _refresh_statuses(self, name: str) -> None:
        """Set the status of every plugin claiming backend ``name`` (see :mod:`.claims`)."""
        resolution = resolve_claims(self._claims[name])
        for claim in self._claims[name]:
            info = self._infos.get(claim.plugin_name)
            if info is None:
                continue
            was_replaced = info.status == "replaced"
            info.status, info.error = claim_status(name, claim, resolution)
            if info.status == "replaced" and resolution.winner is not None and not was_replaced:
                _logger.info("ampcore: %s", replacement_message(name, resolution.winner, claim, ENV_BLOCK))

    def _conflict_error(self, name: str) -> AmpcoreError:
        return AmpcoreError(conflict_message(name, resolve_claims(self._claims[name]).conflict, ENV_BLOCK))
