"""The process-wide plugin manager and device resolution (``"cuda:1"`` -> backend, index).

This layer knows nothing of the policy engine above it: it announces every backend it finds
available to the listeners of :func:`on_backend_available` (the policy layer subscribes at
import, to provide autocast for device types without kernels of their own), so every
import arrow between the subpackages points one way (``tests/test_house.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._errors import AmpcoreError, BackendUnavailableError, closest
from .._forklock import LOCK
from .backend import Backend
from .plugins import PluginInfo, PluginManager

__all__ = [
    "DeviceLike",
    "ResolvedDevice",
    "get_backend",
    "get_manager",
    "list_backends",
    "loaded_generation",
    "list_plugins",
    "on_backend_available",
    "register_plugin",
    "resolve_device",
    "unregister_plugin",
]

DeviceLike = str | torch.device | None


@dataclass(frozen=True)
class ResolvedDevice:
    """A backend and a device index (``None`` when the user named no index)."""

    backend: Backend
    index: int | None


class _Holder:
    """Owns the one process-wide manager and a resolution cache tied to its generation."""

    def __init__(self) -> None:
        self.lock = LOCK  # fork-safe (see ampcore._forklock)
        self.manager: PluginManager | None = None
        self.cache: dict[object, ResolvedDevice] = {}
        self.generation = -1


_holder = _Holder()

#: Called with every backend found available, in subscription order.  Process-wide, as the
#: dispatcher registrations the policy layer's listener makes.
_available_listeners: list[Callable[[Backend], None]] = []


def on_backend_available(listener: Callable[[Backend], None]) -> None:
    """Call ``listener(backend)`` whenever :func:`resolve_device` or :func:`get_backend`
    finds ``backend`` available, from then on (once per listener however often it
    subscribes).  A listener must be idempotent: it hears of a backend on every resolution
    that is not cached."""
    if listener not in _available_listeners:
        _available_listeners.append(listener)


def _announce_available(backend: Backend) -> None:
    for listener in _available_listeners:
        listener(backend)


def get_manager() -> PluginManager:
    """The process-wide :class:`PluginManager` (created and loaded on first use)."""
    manager = _holder.manager
    if manager is None:
        with _holder.lock:
            if _holder.manager is None:
                _holder.manager = PluginManager()
            manager = _holder.manager
    manager.load_entry_points()
    return manager


def loaded_generation() -> int | None:
    """The manager's generation once its plugins are loaded, else None: what a memo of
    resolved arguments is keyed by (no lock, no loading: a region's construction reads it)."""
    manager = _holder.manager  # its flag, not its property: a region made per step reads it
    return manager.generation if manager is not None and manager._loaded else None


def register_plugin(plugin: object, name: str | None = None) -> Backend:
    """Register an adapter plugin (a module or object with ``@ampcore.hookimpl`` functions)
    in this process, for tests and notebooks.

    Raises :class:`ampcore.PluginError` when it breaks the contract.

    Example::

        >>> import torch, ampcore
        >>> class Demo:
        ...     AMPCORE_CONTRACT = 2
        ...     @ampcore.hookimpl
        ...     def ampcore_backend(self):
        ...         return ampcore.BackendSpec(name="demo", device_type="cpu", dtypes=[torch.bfloat16])
        >>> ampcore.register_plugin(Demo(), name="demo").name
        'demo'
        >>> ampcore.unregister_plugin("demo")
    """
    return get_manager().register(plugin, name)


def unregister_plugin(name: str) -> None:
    """Remove the plugin registered under ``name`` (and its backend).

    Example: the last line of :func:`register_plugin`'s example removes the plugin it
    registered (``ampcore.unregister_plugin("demo")``).
    """
    get_manager().unregister(name)


def list_plugins() -> list[PluginInfo]:
    """Every plugin ampcore has seen, with its distribution, status and load error.

    Example::

        >>> import ampcore
        >>> info = {p.name: p for p in ampcore.list_plugins()}
        >>> info["cpu"].distribution, info["cpu"].status
        ('ampcore', 'loaded')
    """
    return get_manager().plugins()


def list_backends() -> list[Backend]:
    """Every known backend, available or not, sorted by name.

    Example::

        >>> import ampcore
        >>> "cpu" in [b.name for b in ampcore.list_backends()]
        True
    """
    return get_manager().backends()


def _parse(device: DeviceLike) -> tuple[str | None, int | None]:
    if device is None:
        return None, None
    if isinstance(device, torch.device):
        return device.type, device.index
    if not isinstance(device, str):
        raise AmpcoreError(
            f"device={device!r}: expected a backend name such as 'cuda', 'cuda:1', a torch.device or None"
        )
    name, sep, index = device.strip().partition(":")
    if not sep:
        return name, None
    # str.isdigit() is True for '²' and '٣', which int() refuses or reads: ASCII digits only
    if not (index.isascii() and index.isdigit()):
        raise AmpcoreError(
            f"device={device!r}: the index must be a non-negative integer in ASCII digits after ':' (e.g. 'cuda:0')"
        )
    return name, int(index)


def _describe(manager: PluginManager) -> str:
    parts = []
    for backend in manager.backends():
        reason = backend.unavailable_reason
        parts.append(f"{backend.name} ({'available' if reason is None else 'unavailable: ' + reason})")
    return "; ".join(parts) or "none (no adapter plugin is loaded; see `ampcore info`)"


def _lookup(manager: PluginManager, name: str, device: DeviceLike) -> Backend:
    try:
        return manager.backend(name)
    except KeyError:
        pass
    by_type = [b for b in manager.backends() if b.device_type == name]
    if len(by_type) == 1:
        return by_type[0]
    hint = closest(name, manager.backend_names(), n=1)
    raise AmpcoreError(
        f"device={device!r}: unknown backend {name!r}"
        + (f" (did you mean {hint[0]!r}?)" if hint else "")
        + f". Known backends: {_describe(manager)}"
        + _not_loaded(manager, name)
    )


#: Why a plugin that was found is not loaded, and what to do about it.
_REMEDY = {
    "disabled": "{env_disable} is set; set AMPCORE_PLUGINS={name} to load it anyway",
    "not-allowed": "it is not listed in AMPCORE_PLUGINS; add {name} there",
    "blocked": "it is blocked by AMPCORE_BLOCK_PLUGINS; remove {name} there",
}


def _not_loaded(manager: PluginManager, name: str) -> str:
    """A sentence on plugins that were found but not loaded (the likely reason a backend
    is unknown): the one named like the backend, else all of them."""
    from .plugins import ENV_DISABLE_AUTOLOAD

    idle = [p for p in manager.plugins() if p.status in (*_REMEDY, "failed")]
    same = [p for p in idle if p.name == name or p.name.endswith(f":{name}")]  # "ampcore:npu" too
    parts = []
    for plugin in same or idle:
        remedy = _REMEDY.get(plugin.status)
        if remedy is None:
            why = f"it failed to load: {plugin.error}"
        else:
            why = remedy.format(env_disable=ENV_DISABLE_AUTOLOAD, name=plugin.name)
        parts.append(f"plugin {plugin.name!r} is not loaded: {why}")
    return ("; " + "; ".join(parts)) if parts else ""


def _best(manager: PluginManager) -> Backend:
    ranked = sorted(manager.backends(), key=lambda b: (-b.priority, b.name))
    for backend in ranked:
        if backend.is_available:
            return backend
    raise BackendUnavailableError(f"device=None: no available backend. Known backends: {_describe(manager)}")


def resolve_device(device: DeviceLike) -> ResolvedDevice:
    """Resolve ``device`` to an *available* backend and device index.

    Raises :class:`ampcore.AmpcoreError` for unknown names (listing the known backends and
    their availability), :class:`ampcore.BackendUnavailableError` with the adapter's reason,
    and for an index beyond the visible devices.
    """
    manager = get_manager()
    key = device if isinstance(device, (str, torch.device)) or device is None else None
    if key is not None or device is None:
        if _holder.generation == manager.generation:
            hit = _holder.cache.get(key)
            if hit is not None:
                return hit
        else:
            _holder.cache.clear()
            _holder.generation = manager.generation
    name, index = _parse(device)
    backend = _best(manager) if name is None else _lookup(manager, name, device)
    backend.require_available()
    _announce_available(backend)
    if index is not None:
        count = backend.device_count()
        if index >= count:
            raise AmpcoreError(
                f"device={device!r}: backend {backend.name!r} has {count} visible device(s); "
                f"valid indices are 0..{count - 1}"
            )
    resolved = ResolvedDevice(backend, index)
    if key is not None or device is None:
        _holder.cache[key] = resolved
    return resolved


def get_backend(device: DeviceLike = None) -> Backend:
    """The backend for ``device`` (a name, ``"name:N"``, a ``torch.device`` or ``None`` for
    the best available one).  Unlike :func:`resolve_device` it also returns unavailable
    backends, so that their ``unavailable_reason`` can be read.

    Example::

        >>> import ampcore
        >>> ampcore.get_backend("cpu").default_dtype
        torch.bfloat16
    """
    manager = get_manager()
    name, _ = _parse(device)
    backend = _best(manager) if name is None else _lookup(manager, name, device)
    if backend.is_available:
        _announce_available(backend)
    return backend
