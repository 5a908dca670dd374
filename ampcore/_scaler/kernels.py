"""The on-device work of :class:`ampcore.GradScaler`: unscale + non-finite check, scale update.

Nothing here reads a tensor on the host.  The kernels are chosen once, not on every call:

1. at construction, from the backend adapter: its device overflow flag
   (``ampcore_device_overflow_flag`` and its clearing hook), or nothing;
2. the first time a device type (and gradient dtype) is met: torch's fused kernel
   (``torch._amp_foreach_non_finite_check_and_unscale_``, ``torch._amp_update_scale_``)
   where a one-element probe call runs, else a portable version written with foreach and
   tensor ops, which runs on any device.  The probe's answer is cached on the
   :class:`ScalerKernels` instance (no module state).

``torch._amp_update_scale_`` has neither hysteresis nor bounds: one ``clamp_`` after it
applies the bounds, and for ``hysteresis > 1`` a few tensor ops before it count overflows and
hide from it those the hysteresis absorbs (:func:`_absorb_by_hysteresis_`).  The portable
update computes ``scale * factor`` in float64 where the device has it, as torch's kernels do,
and rounds to float32, so both paths give bit-identical scales.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .._backends.backend import Backend
from .._errors import AmpcoreError, PluginError
from .options import ScalerOptions

__all__ = ["ScalerKernels", "or_non_finite_", "portable_unscale_", "portable_update_scale_"]

_ByDevice = dict[torch.device, dict[torch.dtype, list[torch.Tensor]]]


def portable_unscale_(grads: Sequence[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    """Multiply ``grads`` by ``inv_scale`` in place; set ``found_inf`` to 1.0 if any is non-finite.

    Works on any device with foreach ops (torch falls back to a per-tensor loop where a
    device has no fused foreach kernel).  The check is :func:`or_non_finite_`.
    """
    grads = [g for g in grads if g.numel() > 0]
    if not grads:
        return
    torch._foreach_mul_(grads, inv_scale)
    or_non_finite_(grads, found_inf)


def or_non_finite_(grads: Sequence[torch.Tensor], found_inf: torch.Tensor) -> None:
    """Set ``found_inf`` to 1.0 if any of ``grads`` (one device) holds an inf or a nan,
    reading them only, no copy: their max-norms (inf or nan exactly when a tensor holds an
    inf or a nan; unlike a sum they cannot overflow), one multi-tensor op where torch has
    fused foreach kernels for the device; elsewhere torch's foreach ops loop over the
    tensors anyway, and one ``aminmax`` pass per tensor is faster (half the time of the
    norm on the CPU)."""
    grads = [g for g in grads if g.numel() > 0]
    if not grads:
        return
    if _fused_foreach(grads[0].device):
        extremes = list(torch._foreach_norm(grads, ord=math.inf))
    else:
        extremes = [value for grad in grads for value in torch.aminmax(grad)]
    bad = torch.stack(extremes).isfinite().logical_not().any()
    found_inf.copy_(torch.maximum(found_inf, bad.to(found_inf.dtype)))


def _fused_foreach(device: torch.device) -> bool:
    """Whether torch runs ``_foreach_`` ops on ``device`` as fused multi-tensor kernels
    (torch's own list, which its optimizers consult; True where this torch has none)."""
    try:
        from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices
    except ImportError:
        return True
    return device.type in _get_foreach_kernels_supported_devices()


def portable_update_scale_(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    overflow_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    options: ScalerOptions,
    wide: torch.dtype = torch.float64,
) -> None:
    """The dynamic-scale update with hysteresis and bounds, as tensor ops on the device.

    ``found_inf > 0``: the overflow tracker counts up and the growth tracker resets; once the
    overflow tracker reaches ``hysteresis`` the scale is multiplied by ``backoff_factor``
    (not below ``min_scale``) and the overflow tracker resets.  Otherwise the growth tracker
    counts up and the overflow tracker resets; once the growth tracker reaches
    ``growth_interval`` the scale is multiplied by ``growth_factor`` (kept when the product is
    not finite, never above ``max_scale``) and the growth tracker resets.
    """
    overflow = found_inf > 0
    bad = torch.where(overflow, overflow_tracker + 1, 0)
    good = torch.where(overflow, 0, growth_tracker + 1)
    back_off = bad >= options.hysteresis
    grow = good >= options.growth_interval
    widened = scale.to(wide)
    lower = (widened * options.backoff_factor).to(scale.dtype)
    higher = (widened * options.growth_factor).to(scale.dtype)
    higher = torch.where(higher.isfinite(), higher, scale)
    if options.min_scale is not None:
        lower = lower.clamp(min=options.min_scale)
    if options.max_scale is not None:
        higher = higher.clamp(max=options.max_scale)
    scale.copy_(torch.where(back_off, lower, torch.where(grow, higher, scale)))
    overflow_tracker.copy_(torch.where(back_off, 0, bad))
    growth_tracker.copy_(torch.where(grow, 0, good))


def _runs(probe: Callable[[], Any]) -> bool:
    try:
        probe()
    except (RuntimeError, TypeError):  # NotImplementedError is a RuntimeError
        return False
    return True


class ScalerKernels:
    """The kernels of one scaler: the adapter's hooks (chosen at construction) and torch's
    fused kernels or the portable ones (chosen per device type and dtype, once).
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        flag_hook = backend.hook("ampcore_device_overflow_flag")
        clear_hook = backend.hook("ampcore_clear_device_overflow_flag")
        self.or_device_overflow_: Callable[[torch.Tensor], None] = (
            _no_flag if flag_hook is None else functools.partial(self._or_adapter_flag_, flag_hook)
        )
        self.clear_device_overflow: Callable[[torch.device], None] = (
            _no_clear if clear_hook is None else functools.partial(_clear_adapter_flag, clear_hook)
        )
        self._native_unscale: dict[tuple[str, torch.dtype], bool] = {}
        self._native_update: dict[str, bool] = {}
        self._wide: dict[str, torch.dtype] = {}

    # -- probes ----------------------------------------------------------------------
    def has_native_unscale(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether torch has a fused unscale kernel for ``dtype`` gradients on ``device``."""
        key = (device.type, dtype)
        known = self._native_unscale.get(key)
        if known is None:
            known = self._native_unscale[key] = _runs(
                lambda: torch._amp_foreach_non_finite_check_and_unscale_(
                    [torch.zeros(1, dtype=dtype, device=device)],
                    torch.zeros((), device=device),
                    torch.ones((), device=device),
                )
            )
        return known

    def has_native_update(self, device: torch.device) -> bool:
        """Whether torch has ``_amp_update_scale_`` on ``device``."""
        known = self._native_update.get(device.type)
        if known is None:
            known = self._native_update[device.type] = _runs(
                lambda: torch._amp_update_scale_(
                    torch.ones((), device=device),
                    torch.zeros((), dtype=torch.int32, device=device),
                    torch.zeros((), device=device),
                    2.0,
                    0.5,
                    1,
                )
            )
        return known

    def wide_dtype(self, device: torch.device) -> torch.dtype:
        """float64 where ``device`` supports it (for the reciprocal and the scale update)."""
        wide = self._wide.get(device.type)
        if wide is None:
            ok = _runs(lambda: torch.ones((), dtype=torch.float64, device=device).reciprocal())
            wide = self._wide[device.type] = torch.float64 if ok else torch.float32
        return wide

    # -- operations ------------------------------------------------------------------
    def unscale_optimizer_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        allow_fp16: bool,
        process_group: dist.ProcessGroup | None,
        sync_found_inf: bool,
    ) -> torch.Tensor:
        """Unscale every gradient of ``optimizer`` in place; return its found-inf flag
        (see :meth:`unscale_params_`)."""
        params = [param for group in optimizer.param_groups for param in group["params"]]
        return self.unscale_params_(params, inv_scale, allow_fp16, process_group, sync_found_inf)

    def unscale_params_(
        self,
        params: Iterable[torch.Tensor],
        inv_scale: torch.Tensor,
        allow_fp16: bool,
        process_group: dist.ProcessGroup | None,
        sync_found_inf: bool,
        checked: Sequence[torch.Tensor] = (),
    ) -> torch.Tensor:
        """Unscale the gradients of ``params`` in place and check ``checked`` (gradients
        whose unscaling the optimizer's update does: ``ampcore/_o2/scaled_update.py``)
        read-only; return the found-inf flag.

        The flag lies on ``inv_scale``'s device; the device overflow flags are ORed into it,
        and it is all-reduced (MAX) over ``process_group`` when ``torch.distributed`` is
        initialised and ``sync_found_inf`` is set.  Raises before changing any gradient.
        """
        by_device = _by_device(params, allow_fp16)
        read_only: _ByDevice = defaultdict(lambda: defaultdict(list))
        for grad in checked:
            read_only[grad.device][grad.dtype].append(grad)
        with torch.no_grad():
            found_inf = torch.zeros((), dtype=torch.float32, device=inv_scale.device)
            for device in {**by_device, **read_only}:
                local = found_inf if device == found_inf.device else torch.zeros((), device=device)
                if device in by_device:
                    local_inv = inv_scale.to(device, non_blocking=True)
                    for grads in by_device[device].values():
                        self.unscale_(grads, local, local_inv)
                for grads in read_only.get(device, {}).values():
                    or_non_finite_(grads, local)
                if device.type == self.backend.device_type:
                    self.or_device_overflow_(local)
                if local is not found_inf:
                    found_inf.add_(local.to(found_inf.device, non_blocking=True))
        if sync_found_inf and dist.is_available() and dist.is_initialized():
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=process_group)
        return found_inf

    def inv_scale(self, scale: torch.Tensor) -> torch.Tensor:
        """``1 / scale`` as float32, computed in the widest float the device has."""
        return scale.to(self.wide_dtype(scale.device)).reciprocal().float()

    def unscale_(self, grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
        """Unscale ``grads`` (one device, one dtype) in place and OR non-finiteness into ``found_inf``:
        torch's fused kernel where the device has one for the dtype, else the portable one."""
        if self.has_native_unscale(grads[0].device, grads[0].dtype):
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        else:
            portable_unscale_(grads, found_inf, inv_scale)

    def _or_adapter_flag_(self, hook: Callable[..., Any], found_inf: torch.Tensor) -> None:
        """OR the adapter's device overflow flag into ``found_inf``."""
        flag = hook(device=found_inf.device)
        if flag is None:
            return
        if not isinstance(flag, torch.Tensor) or flag.numel() != 1:
            raise PluginError(
                self.backend.plugin_name,
                f"ampcore_device_overflow_flag() returned {flag!r}; expected a one-element tensor or None",
                self.backend.distribution,
            )
        raised = flag.reshape(()).to(found_inf.device, non_blocking=True) > 0
        found_inf.copy_(torch.maximum(found_inf, raised.to(found_inf.dtype)))

    def update_scale_(
        self,
        scale: torch.Tensor,
        growth_tracker: torch.Tensor,
        overflow_tracker: torch.Tensor,
        found_inf: torch.Tensor,
        options: ScalerOptions,
    ) -> None:
        """Apply one dynamic update to ``scale`` and the trackers, on the device."""
        if not self.has_native_update(scale.device):
            portable_update_scale_(
                scale, growth_tracker, overflow_tracker, found_inf, options, self.wide_dtype(scale.device)
            )
            return
        if options.hysteresis > 1:
            found_inf = _absorb_by_hysteresis_(growth_tracker, overflow_tracker, found_inf, options.hysteresis)
        torch._amp_update_scale_(
            scale, growth_tracker, found_inf, options.growth_factor, options.backoff_factor, options.growth_interval
        )
        if options.min_scale is not None or options.max_scale is not None:
            scale.clamp_(min=options.min_scale, max=options.max_scale)


def _by_device(params: Iterable[torch.Tensor], allow_fp16: bool) -> _ByDevice:
    """The gradients of ``params`` by device and dtype (the values of sparse ones; a
    float16 sparse gradient is coalesced first); raises on float16 ones unless allowed."""
    by_device: _ByDevice = defaultdict(lambda: defaultdict(list))
    for param in params:
        grad = param.grad
        if grad is None:
            continue
        if not allow_fp16 and grad.dtype == torch.float16:
            raise AmpcoreError(_fp16_grads_message(param))
        if grad.is_sparse:
            if grad.dtype == torch.float16:  # duplicates may overflow once summed
                param.grad = grad = grad.coalesce()
            grad = grad._values()
        by_device[grad.device][grad.dtype].append(grad)
    return by_device


def _no_flag(found_inf: torch.Tensor) -> None:
    """No adapter overflow flag: nothing to OR in."""


def _no_clear(device: torch.device) -> None:
    """No adapter overflow flag: nothing to clear."""


def _clear_adapter_flag(hook: Callable[..., Any], device: torch.device) -> None:
    """Reset the adapter's device overflow flag."""
    hook(device=device)


def _absorb_by_hysteresis_(
    growth_tracker: torch.Tensor, overflow_tracker: torch.Tensor, found_inf: torch.Tensor, hysteresis: int
) -> torch.Tensor:
    """Prepare ``torch._amp_update_scale_`` for hysteresis (half the ops of the portable update).

    Counts the overflow; returns the found-inf flag the kernel must see: set only when the
    count reaches ``hysteresis`` (then the count restarts).  An overflow the hysteresis
    absorbs must leave the scale alone but still restart the growth count: the growth tracker
    is set to -1, which the kernel, seeing a clean step, counts to 0 (never the interval,
    which is >= 1, so no growth).
    """
    overflow = found_inf > 0
    bad = overflow_tracker.add(1).mul_(overflow)
    back_off = bad >= hysteresis
    growth_tracker.masked_fill_(overflow.logical_xor(back_off), -1)
    overflow_tracker.copy_(bad.masked_fill_(back_off, 0))
    return back_off.to(found_inf.dtype)


def _fp16_grads_message(param: torch.Tensor) -> str:
    """The error for float16 gradients the scaler was asked to unscale, with the fix."""
    from .._o2.no_optimizer import FIX, no_master_reason

    base = (
        "ampcore.GradScaler.unscale_(): Attempting to unscale FP16 gradients. Unscaled float16 gradients "
        "underflow: the optimizer must update float32 master weights."
    )
    reason = no_master_reason(param)
    if reason is not None:
        return f"{base} This float16 parameter has none because {reason}. Fix: {FIX}."
    return (
        f"{base} Fix: for level O2, {FIX}; for O1, keep the parameters float32 and run the forward "
        "under ampcore.autocast."
    )
