"""Plugin loading: entry points of group ``ampcore``, each loaded in isolation.

pluggy's ``load_setuptools_entrypoints`` stops at the first plugin that fails to import, so
the entry points are iterated here one by one: a plugin that fails to import, raises, has
an invalid hook signature or a misspelled hook is recorded, reported with a
:class:`PluginWarning` naming it and its distribution, blocked, and skipped.  Every other
plugin still loads.  With ``AMPCORE_STRICT_PLUGINS=1`` the first broken plugin raises.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, final

import pluggy

from .. import hookspec as _hookspec
from .._errors import AmpcoreError, PluginError, PluginWarning, warn_at
from .._forklock import LOCK
from .backend import Backend, origin
from .contract import SPEC_NAMES, check_contract, unknown_hooks
from .sources import NOT_PLUGINS, describe_failure, env_list, module_file, origin_of_entry_point

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_BLOCK",
    "ENV_DISABLE_AUTOLOAD",
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

PluginStatus = Literal["loaded", "failed", "blocked", "not-allowed", "disabled", "conflict"]
PluginSource = Literal["entry-point", "in-process"]

_TRUE: Final = frozenset({"1", "true", "yes", "on"})


@dataclass
class PluginInfo:
    """What ampcore knows about one plugin (shown by ``ampcore info``).

    ``status`` is one of ``loaded``, ``failed`` (see ``error``), ``blocked``
    (``AMPCORE_BLOCK_PLUGINS``), ``not-allowed`` (not in ``AMPCORE_PLUGINS``), ``disabled``
    (``AMPCORE_DISABLE_PLUGIN_AUTOLOAD``) or ``conflict`` (two plugins claim its backend
    name).
    """

    name: str
    distribution: str | None
    version: str | None
    source: PluginSource
    status: PluginStatus
    error: str | None = None
    backend: str | None = None


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
        self._entry_points = entry_points or (
            lambda: importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        )
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
        seen: set[tuple[str, str]] = set()
        names: set[str] = set()
        known: set[str | None] = set()
        for ep in self._entry_points():
            dist = ep.dist.name if ep.dist is not None else None
            version = ep.dist.version if ep.dist is not None else None
            if (ep.name, ep.value) in seen:  # the same distribution found twice on sys.path
                continue
            seen.add((ep.name, ep.value))
            names.add(ep.name)
            keys = {ep.name, dist}
            known |= keys
            info = PluginInfo(ep.name, dist, version, "entry-point", "loaded")
            self._infos[ep.name] = info
            if keys & block:
                info.status, info.error = "blocked", f"blocked by {ENV_BLOCK}"
                self._pm.set_blocked(ep.name)
            elif allow and not keys & set(allow):
                info.status, info.error = "not-allowed", f"not listed in {ENV_PLUGINS}"
            elif disabled and not allow:
                info.status, info.error = "disabled", f"{ENV_DISABLE_AUTOLOAD} is set"
            else:
                self._load_one(ep, info)
        missing = [name for name in allow if name not in known]
        if missing:
            warn_at(
                f"{ENV_PLUGINS} names {missing}, but no such plugin is installed; "
                f"installed plugins: {sorted(names) or 'none'}",
                PluginWarning,
                None,
            )

    def _load_one(self, ep: importlib.metadata.EntryPoint, info: PluginInfo) -> None:
        try:
            plugin = ep.load()
            backend = self._register(plugin, ep.name, info.distribution, info.version)
        except (Exception, SystemExit) as exc:  # a plugin calling exit() must not end the program
            message = describe_failure(exc)
            info.status, info.error = "failed", message
            if self._pm.get_plugin(ep.name) is not None:
                self._pm.unregister(name=ep.name)
            self._pm.set_blocked(ep.name)
            text = (
                f'Error loading ampcore plugin "{ep.name}" ({origin_of_entry_point(info.distribution)}, '
                f'entry point "{ep.value}"): {message}; the plugin was skipped'
            )
            if self.strict:
                raise PluginError(ep.name, message, info.distribution) from exc
            warn_at(text, PluginWarning, module_file(ep.value))
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

    def _register(self, plugin: object, name: str, distribution: str | None, version: str | None) -> Backend:
        if isinstance(plugin, NOT_PLUGINS):
            raise PluginError(
                name,
                f"expected a module or an object with @ampcore.hookimpl functions "
                f"({', '.join(_hookspec.REQUIRED_HOOKS)}), got {type(plugin).__name__} {plugin!r}",
                distribution,
            )
        check_contract(plugin, name, distribution)
        unknown = unknown_hooks(plugin)
        if unknown:
            raise PluginError(
                name,
                f"unknown hook(s) {', '.join(unknown)}; valid hooks: {', '.join(sorted(SPEC_NAMES))}",
                distribution,
            )
        for required in _hookspec.REQUIRED_HOOKS:
            function = getattr(plugin, required, None)
            if function is not None and self._pm.parse_hookimpl_opts(plugin, required) is None:
                raise PluginError(
                    name, f"{required} is not marked as a hook: decorate it with @ampcore.hookimpl", distribution
                )
        try:
            self._pm.register(plugin, name=name)
        except ValueError as exc:  # pluggy: name or object already registered
            raise PluginError(name, str(exc), distribution) from exc
        except pluggy.PluginValidationError as exc:
            raise PluginError(name, str(exc), distribution) from exc
        try:
            return Backend(
                self._pm,
                plugin,
                name,
                distribution,
                version,
                on_broken=lambda message: self._mark_broken(name, message),
            )
        except BaseException:
            self._pm.unregister(plugin)
            raise

    def _add_claim(self, backend: Backend) -> None:
        self._claims.setdefault(backend.name, []).append(backend)
        self._refresh_statuses(backend.name)
        if self.strict and self._winner(backend.name) is None:
            raise self._conflict_error(backend.name)

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
            backend = self._register(plugin, name, None, None)
            previous = self._infos.get(name)
            self._infos[name] = PluginInfo(name, None, None, "in-process", "loaded", backend=backend.name)
            try:
                self._add_claim(backend)
            except BaseException:  # strict mode refused a conflict: undo the registration
                self._claims[backend.name].remove(backend)
                if self._claims[backend.name]:
                    self._refresh_statuses(backend.name)
                else:
                    del self._claims[backend.name]
                if previous is None:
                    del self._infos[name]
                else:
                    self._infos[name] = previous
                self._pm.unregister(plugin)
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
            if info.backend is not None:
                claims = [b for b in self._claims.get(info.backend, []) if b.plugin_name != name]
                if claims:
                    self._claims[info.backend] = claims
                    self._refresh_statuses(info.backend)
                else:
                    self._claims.pop(info.backend, None)
            self.generation += 1

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
        claims = self._claims[name]
        return claims[0] if len(claims) == 1 else None

    def _refresh_statuses(self, name: str) -> None:
        winner = self._winner(name)
        for claim in self._claims[name]:
            info = self._infos.get(claim.plugin_name)
            if info is None:
                continue
            if winner is None:
                info.status, info.error = "conflict", f'another plugin also claims backend "{name}"'
            else:
                info.status, info.error = "loaded", None

    def _conflict_error(self, name: str) -> AmpcoreError:
        who = ", ".join(f'plugin "{b.plugin_name}" ({origin(b.distribution)})' for b in self._claims[name])
        return AmpcoreError(
            f'backend "{name}" is claimed by more than one plugin: {who}. Uninstall one, or block '
            f"one with {ENV_BLOCK}=<plugin>"
        )
