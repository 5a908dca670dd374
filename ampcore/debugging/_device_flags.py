"""The device overflow flags :class:`~ampcore.debugging.check_numerics` reads per op.

A chip whose arithmetic saturates (clamps to the dtype's largest value, as Ascend NPUs do
outside INF_NAN mode) leaves no inf or nan to find: its results sit at the limit and a
global status flag rises instead.  The backend's adapter exposes it
(``ampcore_device_overflow_flag`` / ``ampcore_clear_device_overflow_flag``); the checker
reads it after every op that produced a tensor on such a device and clears it, so the op
that raised it is named.

Clearing consumes what :class:`ampcore.GradScaler` reads at ``step()``.  So every flag the
checker found raised (at entry, or after an op in report mode) is raised again when the
region ends, by an overflow on the device itself (``max * 2`` in the first dtype whose
overflow raises the flag): the scaler still skips that iteration's step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._backends.registry import list_backends

__all__ = ["DeviceFlags"]

#: The dtypes tried, in order, to raise a consumed flag again.
_RAISE_WITH = (torch.float16, torch.bfloat16, torch.float32)


class _Flag:
    """One backend's hooks for one device."""

    def __init__(self, read: Callable[..., Any], clear: Callable[..., Any], device: torch.device) -> None:
        self._read, self._clear, self.device = read, clear, device

    def raised(self) -> bool:
        flag = self._read(device=self.device)
        return flag is not None and bool((flag.reshape(-1)[:1] > 0).any().cpu())

    def clear(self) -> None:
        self._clear(device=self.device)


class DeviceFlags:
    """The overflow flags of the devices a checking region met (found once per device).

    ``consumed`` lists the devices whose raised flag was cleared by the checker.
    """

    def __init__(self) -> None:
        self._flags: dict[torch.device, _Flag | None] = {}
        self.consumed: set[torch.device] = set()
        self.raised_before: list[torch.device] = []

    def _flag(self, device: torch.device) -> _Flag | None:
        if device in self._flags:
            return self._flags[device]
        found: _Flag | None = None
        if device.type not in ("cpu", "meta"):
            for backend in list_backends():
                read = backend.hook("ampcore_device_overflow_flag")
                clear = backend.hook("ampcore_clear_device_overflow_flag")
                if backend.device_type == device.type and read and clear and backend.is_available:
                    found = _Flag(read, clear, device)
                    break
        self._flags[device] = found
        if found is not None and found.raised():  # raised before the region: not an op of it
            self.raised_before.append(device)
            self.consumed.add(device)
            found.clear()
        return found

    def meet(self, devices: Iterable[torch.device]) -> None:
        """Find the flags of ``devices`` before an op runs on them (a flag already raised
        then was raised before the region: cleared, and raised again at its end)."""
        for device in devices:
            self._flag(device)

    def raised_by(self, devices: Iterable[torch.device]) -> list[torch.device]:
        """Those of ``devices`` whose flag the op just raised (each is cleared)."""
        raised = []
        for device in devices:
            flag = self._flag(device)
            if flag is not None and flag.raised():
                raised.append(device)
                self.consumed.add(device)
                flag.clear()
        return raised

    def restore(self) -> list[torch.device]:
        """Raise the consumed flags again; returns the devices where that failed."""
        failed = []
        for device in sorted(self.consumed, key=str):
            flag = self._flags.get(device)
            if flag is None or not any(_overflow_raises(flag, dtype) for dtype in _RAISE_WITH):
                failed.append(device)
        self.consumed.clear()
        return failed


def _overflow_raises(flag: _Flag, dtype: torch.dtype) -> bool:
    try:
        torch.full((1,), torch.finfo(dtype).max, dtype=dtype, device=flag.device).mul_(2)
    except RuntimeError:  # the dtype does not run on the device
        return False
    return flag.raised()
