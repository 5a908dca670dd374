"""What :class:`ampcore.GradScaler` keeps between iterations, as one explicit record: the
settings, the scale and its two counters (as Python values until first use, then as
one-element tensors on the device), and the checkpoint round trip.

The training-loop state machine (per optimizer, per iteration) is in ``iteration.py``; the
public getters and setters in ``settings_api.py``; the class itself in ``grad_scaler.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

import torch

from .._backends.backend import Backend, dtype_name
from .._backends.registry import DeviceLike, get_backend, resolve_device
from .._backends.support import resolve_dtype
from .options import ScalerOptions
from .state import ScalerState

__all__ = ["CALL", "ScaleStore", "ScaleTensors", "make_store"]

CALL: Final = "ampcore.GradScaler"
_logger: Final = logging.getLogger("ampcore")


@dataclass(frozen=True)
class ScaleTensors:
    """The scale (float32) and the two counters (int32), one-element tensors on one device."""

    scale: torch.Tensor
    growth_tracker: torch.Tensor
    overflow_tracker: torch.Tensor


class ScaleStore:
    """The settings, scale and counters of one scaler.

    The tensors are created on first use (so constructing a scaler touches no device) from
    ``pending``, the Python values that checkpoints loaded before that first use also set.

    Attributes:
        backend, index: the backend and device index the scale lives on (index ``None``:
            the backend's current device, or the device of the first tensor scaled).
        dtype: the low-precision training dtype.
        options: the settings (an immutable :class:`ScalerOptions`, replaced by setters).
        active: ``False`` for ``enabled=False`` (the scaler does nothing at all).
        scaling: whether the loss is scaled (``False``: scale 1, non-finite steps still skipped).
        pending: the scale and counters as Python values (read before the tensors exist).
        tensors: the scale tensors once created, else ``None``.
    """

    def __init__(
        self,
        backend: Backend,
        index: int | None,
        dtype: torch.dtype,
        options: ScalerOptions,
        active: bool,
        scaling: bool,
    ) -> None:
        self.backend = backend
        self.index = index
        self.dtype = dtype
        self.options = options
        self.active = active
        self.scaling = scaling
        self.pending = ScalerState(options, options.init_scale if scaling else 1.0, 0, 0)
        self.tensors: ScaleTensors | None = None

    def describe(self) -> str:
        """The scaler's repr."""
        mode = "scaling" if self.scaling else ("no-op, skips non-finite steps" if self.active else "disabled")
        return f"{CALL}(device={self.backend.name!r}, dtype=torch.{dtype_name(self.dtype)}, {mode})"

    # -- scale tensors -----------------------------------------------------------------
    def home(self, hint: torch.device | None = None) -> torch.device:
        """The device of the scale: the named index, else ``hint`` if it is of the backend's
        device type, else the backend's current device."""
        if self.index is not None:
            return torch.device(self.backend.device_type, self.index)
        if hint is not None and hint.type == self.backend.device_type:
            return hint
        return torch.device(self.backend.device_type)

    def ensure_tensors(self, hint: torch.device | None = None) -> ScaleTensors:
        """The scale tensors, created on first use from the pending Python values."""
        if self.tensors is None:
            device = self.home(hint)
            pending = self.pending
            self.tensors = ScaleTensors(
                torch.full((), pending.scale, dtype=torch.float32, device=device),
                torch.full((), pending.growth_tracker, dtype=torch.int32, device=device),
                torch.full((), pending.overflow_tracker, dtype=torch.int32, device=device),
            )
        return self.tensors

    def scale_value(self) -> float:
        """The current scale as a Python float (1.0 when not scaling; reads the device)."""
        if not self.scaling:
            return 1.0
        return self.pending.scale if self.tensors is None else float(self.tensors.scale.item())

    # -- settings ----------------------------------------------------------------------
    def cap_trackers(self) -> None:
        """Keep both counters below their limits (on the device: no sync)."""
        options, pending = self.options, self.pending
        self.pending = ScalerState(
            options,
            pending.scale,
            min(pending.growth_tracker, options.growth_interval - 1),
            min(pending.overflow_tracker, options.hysteresis - 1),
        )
        if self.tensors is not None:
            self.tensors.growth_tracker.clamp_(max=options.growth_interval - 1)
            self.tensors.overflow_tracker.clamp_(max=options.hysteresis - 1)

    def reset_scale(self, options: ScalerOptions) -> None:
        """Adopt ``options`` and set the scale to its ``init_scale`` (kept at 1 when not scaling)."""
        self.options = options
        if not self.scaling:
            return
        pending = self.pending
        self.pending = ScalerState(options, options.init_scale, pending.growth_tracker, pending.overflow_tracker)
        if self.tensors is not None:
            self.tensors.scale.fill_(options.init_scale)

    # -- checkpoints -------------------------------------------------------------------
    def current_state(self) -> ScalerState:
        """The settings, scale and counters as Python values (reads the device)."""
        tensors = self.tensors
        if tensors is None:
            return ScalerState(
                self.options, self.pending.scale, self.pending.growth_tracker, self.pending.overflow_tracker
            )
        return ScalerState(
            self.options,
            float(tensors.scale.item()),
            int(tensors.growth_tracker.item()),
            int(tensors.overflow_tracker.item()),
        )

    def restore(self, state: ScalerState) -> None:
        """Adopt a checked state (settings, scale, counters)."""
        self.options = state.options
        self.pending = state
        if self.tensors is not None:
            self.tensors.scale.fill_(state.scale)
            self.tensors.growth_tracker.fill_(state.growth_tracker)
            self.tensors.overflow_tracker.fill_(state.overflow_tracker)

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (and ``copy.deepcopy``): the backend by name, the tensors as Python values
        that the copy turns into tensors on first use, as torch's GradScaler does."""
        state = self.__dict__.copy()
        state.update(backend=self.backend.name, tensors=None, pending=self.current_state())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.backend = get_backend(state["backend"])


def make_store(
    device: DeviceLike, dtype: torch.dtype | None, enabled: bool | None, options: ScalerOptions
) -> ScaleStore:
    """The scaler's record: its backend and device, its dtype and whether it scales."""
    if enabled is False:  # a disabled scaler must not need the device
        backend, index = get_backend(device), None
    else:
        resolved = resolve_device(device)
        backend, index = resolved.backend, resolved.index
    if enabled is False:
        checked = backend.check_dtype(dtype, call=CALL)
    else:
        checked = resolve_dtype(backend, dtype, index, CALL)
        if any(i.severity == "error" for i in backend.capability_issues(checked, index or 0)):
            backend.enforce_capability(checked, index or 0)  # raises, naming the dtype and the device
    scaling = enabled is True or (enabled is None and backend.needs_loss_scaling(checked))
    if enabled is not False and not scaling:
        _logger.info(
            "%s(device=%r, dtype=torch.%s): backend %r says this dtype needs no loss scaling, so the "
            "scaler does not scale (scale 1) but still skips steps with non-finite gradients; "
            "pass enabled=True to scale anyway",
            CALL,
            backend.name,
            dtype_name(checked),
            backend.name,
        )
    return ScaleStore(backend, index, checked, options, active=enabled is not False, scaling=scaling)
