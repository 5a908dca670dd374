"""What :class:`ampcore.GradScaler` holds between iterations: settings, scale, counters,
their accessors and checkpoints (and the nest walker of ``scale()``).  The training-loop
state machine is in ``_scaler.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch

from .._backends.backend import Backend, dtype_name
from .._errors import AmpcoreError
from .._backends.registry import get_backend
from .kernels import ScalerKernels
from .options import ScalerOptions
from .state import ScalerState, build_state_dict, parse_state_dict

__all__ = ["CALL", "ScaleTensors", "ScalerBase", "map_tensors"]

CALL: Final = "ampcore.GradScaler"


@dataclass(frozen=True)
class ScaleTensors:
    """The scale (float32) and the two counters (int32), one-element tensors on one device."""

    scale: torch.Tensor
    growth_tracker: torch.Tensor
    overflow_tracker: torch.Tensor


class ScalerBase:
    """Settings, scale tensors, accessors and state dicts of a scaler.

    The tensors are created on first use (so constructing a scaler touches no device) from
    the pending Python values, which checkpoints loaded before that first use also set.
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
        self._backend = backend
        self._index = index
        self._dtype = dtype
        self._options = options
        self._active = active
        self._scaling = scaling
        self._kernels = ScalerKernels(backend)
        self._pending = ScalerState(options, options.init_scale if scaling else 1.0, 0, 0)
        self._tensors: ScaleTensors | None = None

    def __repr__(self) -> str:
        mode = "scaling" if self._scaling else ("no-op, skips non-finite steps" if self._active else "disabled")
        return f"{CALL}(device={self._backend.name!r}, dtype=torch.{dtype_name(self._dtype)}, {mode})"

    # -- scale tensors -----------------------------------------------------------------
    def _home(self, hint: torch.device | None = None) -> torch.device:
        """The device of the scale: the named index, else ``hint`` if it is of the backend's
        device type, else the backend's current device."""
        if self._index is not None:
            return torch.device(self._backend.device_type, self._index)
        if hint is not None and hint.type == self._backend.device_type:
            return hint
        return torch.device(self._backend.device_type)

    def _state_tensors(self, hint: torch.device | None = None) -> ScaleTensors:
        """The scale tensors, created on first use from the pending Python values."""
        if self._tensors is None:
            device = self._home(hint)
            pending = self._pending
            self._tensors = ScaleTensors(
                torch.full((), pending.scale, dtype=torch.float32, device=device),
                torch.full((), pending.growth_tracker, dtype=torch.int32, device=device),
                torch.full((), pending.overflow_tracker, dtype=torch.int32, device=device),
            )
        return self._tensors

    # -- accessors ---------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when not scaling).

        Syncs with the host (reads the device).
        """
        if not self._scaling:
            return 1.0
        return self._pending.scale if self._tensors is None else float(self._tensors.scale.item())

    def is_enabled(self) -> bool:
        """Whether the scaler scales the loss.

        ``False`` when constructed with ``enabled=False``, and for a dtype that needs no loss
        scaling (then it still skips steps with non-finite gradients).
        """
        return self._scaling

    def get_growth_factor(self) -> float:
        """The factor the scale grows by."""
        return self._options.growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor (> 1)."""
        self._options = self._options.with_values(f"{CALL}.set_growth_factor", growth_factor=new_factor)

    def get_backoff_factor(self) -> float:
        """The factor the scale backs off by."""
        return self._options.backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor (in (0, 1))."""
        self._options = self._options.with_values(f"{CALL}.set_backoff_factor", backoff_factor=new_factor)

    def get_growth_interval(self) -> int:
        """How many consecutive clean steps grow the scale."""
        return self._options.growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval (>= 1).  A clean-step count already at or past it grows the
        scale at the next clean step."""
        self._options = self._options.with_values(f"{CALL}.set_growth_interval", growth_interval=new_interval)
        self._cap_trackers()

    def get_hysteresis(self) -> int:
        """How many consecutive overflow steps back the scale off."""
        return self._options.hysteresis

    def set_hysteresis(self, new_hysteresis: int) -> None:
        """Set the hysteresis (>= 1).  An overflow count already at or past it backs off at the
        next overflow step."""
        self._options = self._options.with_values(f"{CALL}.set_hysteresis", hysteresis=new_hysteresis)
        self._cap_trackers()

    def get_min_scale(self) -> float | None:
        """The lower bound of the scale (``None``: none)."""
        return self._options.min_scale

    def get_max_scale(self) -> float | None:
        """The upper bound of the scale (``None``: none)."""
        return self._options.max_scale

    def _cap_trackers(self) -> None:
        """Keep both counters below their limits (on the device: no sync)."""
        options, pending = self._options, self._pending
        self._pending = ScalerState(
            options,
            pending.scale,
            min(pending.growth_tracker, options.growth_interval - 1),
            min(pending.overflow_tracker, options.hysteresis - 1),
        )
        if self._tensors is not None:
            self._tensors.growth_tracker.clamp_(max=options.growth_interval - 1)
            self._tensors.overflow_tracker.clamp_(max=options.hysteresis - 1)

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: the scale, both counters and the settings, as
        plain Python values (torch's five keys plus ampcore's; see docs/scaler.md).

        ``{}`` when the scaler does not scale.  Syncs with the host; call it after
        :meth:`update`.

        Example::

            >>> import ampcore
            >>> s = ampcore.GradScaler("cpu", enabled=True, hysteresis=2)
            >>> s.state_dict()["hysteresis"], s.state_dict()["_overflow_tracker"]
            (2, 0)
        """
        if not self._scaling:
            return {}
        return build_state_dict(self._current_state())

    def _current_state(self) -> ScalerState:
        """The settings, scale and counters as Python values (reads the device)."""
        tensors = self._tensors
        if tensors is None:
            return ScalerState(self._options, self._pending.scale, self._pending.growth_tracker, self._pending.overflow_tracker)
        return ScalerState(
            self._options,
            float(tensors.scale.item()),
            int(tensors.growth_tracker.item()),
            int(tensors.overflow_tracker.item()),
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (and ``copy.deepcopy``): the backend by name, the tensors as Python values
        that the copy turns into tensors on first use, as torch's GradScaler does."""
        state = self.__dict__.copy()
        state.update(_backend=self._backend.name, _kernels=None, _tensors=None, _pending=self._current_state())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._backend = get_backend(state["_backend"])
        self._kernels = ScalerKernels(self._backend)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state saved by :meth:`state_dict`, or by ``torch.amp.GradScaler`` (its five
        keys; this scaler's hysteresis, bounds and flags stay, the overflow count starts at 0).

        Missing, extra or wrongly typed entries raise :class:`ampcore.AmpcoreError` and leave
        the scaler unchanged.  A scaler that does not scale checks the dict, then ignores it.

        Example::

            >>> import torch, ampcore
            >>> theirs = torch.amp.GradScaler("cpu", init_scale=256.0)
            >>> ours = ampcore.GradScaler("cpu", enabled=True)
            >>> ours.load_state_dict(theirs.state_dict())
            >>> ours.get_scale()
            256.0
        """
        call = f"{CALL}.load_state_dict"
        if isinstance(state_dict, dict) and not state_dict:
            if not self._scaling:
                return
            raise AmpcoreError(
                f"{call}(): The source state dict is empty, possibly because it was saved from a "
                "disabled instance of GradScaler (or from one whose dtype needs no loss scaling)."
            )
        state = parse_state_dict(call, state_dict, self._options)
        if not self._scaling:
            return
        self._options = state.options
        self._pending = state
        if self._tensors is not None:
            self._tensors.scale.fill_(state.scale)
            self._tensors.growth_tracker.fill_(state.growth_tracker)
            self._tensors.overflow_tracker.fill_(state.overflow_tracker)


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor of a nest of lists, tuples (named too) and mappings."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        items = [(key, map_tensors(item, fn)) for key, item in value.items()]
        return dict(items) if type(value) is dict else type(value)(items)  # type: ignore[call-arg]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_tensors(item, fn) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(item, fn) for item in value)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return map(lambda item: map_tensors(item, fn), value)
    raise AmpcoreError(
        f"{CALL}.scale(): outputs must be a Tensor or lists, tuples or dicts of Tensors; got {type(value).__name__}"
    )
