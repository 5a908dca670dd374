"""Device memory and synchronisation, answered by the adapter's hooks or by ``torch.accelerator``.

``torch.accelerator`` answers only for device types torch knows the allocator and streams
of: a PrivateUse1 device registered from Python is torch's current accelerator, yet its
memory calls trip an INTERNAL ASSERT ("Allocator for <name> is not a DeviceAllocator") and
``synchronize`` is unsupported.  Such refusals read as "unavailable" (``None``), never as a
crash.  An adapter's own hooks are called through :meth:`Backend.hook`: their exceptions and
an answer of the wrong type (``{"in_use": "lots"}``) are :class:`ampcore.PluginError` naming
``ampcore_memory`` and the plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from .backend import Backend
from .checks import MEMORY_KEYS, memory_problem

__all__ = [
    "MEMORY_KEYS",
    "can_synchronize",
    "device_memory",
    "memory_in_use",
    "peak_memory",
    "reset_peak_memory",
    "synchronize",
]

#: key -> what ``torch.accelerator`` answers when the backend drives the current accelerator
_ACCELERATOR_FALLBACKS: Final[dict[str, Callable[[int], Any]]] = {
    "total": lambda index: torch.accelerator.get_memory_info(index)[1],
    "in_use": lambda index: torch.accelerator.memory_allocated(index),
    "reset_peak": lambda index: torch.accelerator.reset_peak_memory_stats(index),
    "peak": lambda index: torch.accelerator.max_memory_allocated(index),
}


def _drives_current_accelerator(backend: Backend) -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return False
    current = accelerator.current_accelerator()
    return current is not None and current.type == backend.device_type


def _accelerator(backend: Backend, key: str, device_index: int) -> Any:
    if _drives_current_accelerator(backend):
        try:
            return _ACCELERATOR_FALLBACKS[key](device_index)
        except (RuntimeError, NotImplementedError, AttributeError):
            return None  # torch cannot tell for this device type: unavailable
    return None


def _ask(backend: Backend, key: str, device_index: int) -> int | None:
    """One value of the adapter's ``ampcore_memory`` answer (else ``torch.accelerator``'s)."""
    function = backend.hook("ampcore_memory")
    if function is None:
        value = _accelerator(backend, key, device_index)
        return None if value is None else int(value)
    stats = function(device_index=device_index, reset_peak=False)
    problem = memory_problem(stats)
    if problem is not None:
        raise backend.broken(f"ampcore_memory({device_index}, reset_peak=False) returned {stats!r}; {problem}")
    value = (stats or {}).get(key)
    return None if value is None else int(value)


def device_memory(backend: Backend, device_index: int = 0) -> int | None:
    """Total device memory in bytes, or None for host-memory backends."""
    return _ask(backend, "total", device_index)


def memory_in_use(backend: Backend, device_index: int = 0) -> int | None:
    """Bytes in use now, or None when the backend cannot tell."""
    return _ask(backend, "in_use", device_index)


def reset_peak_memory(backend: Backend, device_index: int = 0) -> None:
    """Start a new peak-memory measurement."""
    function = backend.hook("ampcore_memory")
    if function is None:
        _accelerator(backend, "reset_peak", device_index)
    else:
        function(device_index=device_index, reset_peak=True)


def peak_memory(backend: Backend, device_index: int = 0) -> int | None:
    """Peak bytes in use since :func:`reset_peak_memory`, or None when it cannot be measured."""
    return _ask(backend, "peak", device_index)


def _module_synchronize(backend: Backend) -> Callable[[], Any] | None:
    function = getattr(getattr(torch, backend.device_type, None), "synchronize", None)
    return function if callable(function) else None  # torch.cpu.synchronize: a no-op


def can_synchronize(backend: Backend) -> bool:
    """Whether :func:`synchronize` can wait for the backend's device: an adapter with
    ``ampcore_synchronize``, the current accelerator, or a device module with
    ``synchronize`` (the host's, ``torch.cpu.synchronize``, has nothing to wait for;
    ``False``: a device whose work cannot be timed)."""
    return (
        backend.hook("ampcore_synchronize") is not None
        or _drives_current_accelerator(backend)
        or _module_synchronize(backend) is not None
    )


def synchronize(backend: Backend, device_index: int = 0) -> None:
    """Wait for the device's queued work (for timing); nothing for host backends.

    The adapter's ``ampcore_synchronize``; else ``torch.accelerator.synchronize`` when the
    backend drives the current accelerator and torch supports it there; else the device
    module's ``synchronize`` (``torch.<device_type>.synchronize``) when it has one.
    """
    function = backend.hook("ampcore_synchronize")
    if function is not None:
        function(device_index=device_index)
        return
    if _drives_current_accelerator(backend):
        try:
            torch.accelerator.synchronize(device_index)
            return
        except (RuntimeError, NotImplementedError):
            pass  # unsupported for this device type: ask its device module
    module_synchronize = _module_synchronize(backend)
    if module_synchronize is not None:
        module_synchronize()
