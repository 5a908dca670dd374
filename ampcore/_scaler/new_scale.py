"""The two checks of :meth:`ampcore.GradScaler.update` beyond the dynamic update: setting the
scale by hand (``update(new_scale=...)``) and ``raise_at_min_scale``."""

from __future__ import annotations

import torch

from .._errors import AmpcoreError
from .options import ScalerOptions, check_scale
from .store import CALL, ScaleTensors

__all__ = ["LossScaleAtMinimumError", "raise_if_stuck", "set_scale_"]


class LossScaleAtMinimumError(AmpcoreError):
    """Gradients keep overflowing whatever the loss scale: training on would skip every step.

    Raised by :meth:`GradScaler.update` when the scaler was built with
    ``raise_at_min_scale=True`` and the scale is already at ``min_scale``, or with
    ``on_collapse="raise"`` after ``collapse_patience`` skipped steps in a row.
    """


def set_scale_(scale: torch.Tensor, new_scale: float | torch.Tensor, options: ScalerOptions) -> None:
    """``update(new_scale=...)``: a float is checked against the bounds; a tensor is copied
    and clamped into them on the device (no host sync), ignored if it is nan, zero, negative
    or ``+inf`` without ``max_scale``."""
    if isinstance(new_scale, torch.Tensor):
        if new_scale.numel() != 1 or new_scale.requires_grad or not new_scale.is_floating_point():
            raise AmpcoreError(
                f"{CALL}.update(new_scale=...): expected a float or a one-element floating tensor "
                f"with requires_grad=False, got shape {tuple(new_scale.shape)}, dtype {new_scale.dtype}"
            )
        # No host sync to check it: on the device, a nan, zero or negative value (or +inf
        # without max_scale) is ignored, anything else clamped into the bounds.
        candidate = new_scale.detach().reshape(()).to(scale.device, torch.float32, non_blocking=True)
        clamped = candidate
        if options.min_scale is not None or options.max_scale is not None:
            clamped = candidate.clamp(min=options.min_scale, max=options.max_scale)
        scale.copy_(torch.where((candidate > 0) & torch.isfinite(clamped), clamped, scale))
        return
    value = check_scale(f"{CALL}.update", "new_scale", new_scale)
    if value is None or not options.in_bounds(value):
        raise AmpcoreError(
            f"{CALL}.update(new_scale={new_scale!r}): expected a positive number within "
            f"[min_scale, max_scale] = [{options.min_scale}, {options.max_scale}]"
        )
    scale.fill_(value)


def raise_if_stuck(tensors: ScaleTensors, found_inf: torch.Tensor, options: ScalerOptions) -> None:
    """The one host read of ``raise_at_min_scale``: raise before changing anything."""
    minimum = options.min_scale
    if minimum is None:  # ScalerOptions refuses raise_at_min_scale without min_scale
        return
    due = (found_inf > 0) & (tensors.overflow_tracker + 1 >= options.hysteresis)
    if bool((due & (tensors.scale <= minimum)).item()):
        raise LossScaleAtMinimumError(
            f"{CALL}.update(): gradients overflowed {options.hysteresis} step(s) in a row while the "
            f"loss scale is already at min_scale={options.min_scale}; training on would skip every "
            "step (raise_at_min_scale=True). Look for the op that overflows (e.g. run it in float32), "
            "lower the learning rate, or lower min_scale."
        )
