"""How :class:`ampcore.GradScaler` checks and unscales an optimizer's gradients, by kind of
optimizer (a mixin over the scaler's store, kernels and per-optimizer records):

* a plain optimizer: its gradients are unscaled in place and checked for inf/nan
  (:meth:`GradientUnscaling._unscale_grads_`, what ``unscale_`` does);
* an O2 optimizer whose master update unscales the low-precision gradients as it widens
  them (``ampcore/_o2/scaled_update.py``): those are only checked, read-only, so no float32
  copy of them is made (:meth:`GradientUnscaling._check_deferred`);
* a fused optimizer (``_step_supports_amp_scaling``: fused Adam/AdamW/SGD), whose kernel
  unscales and skips on the device: the scaler only checks and hands it ``grad_scale`` and
  ``found_inf`` (:meth:`GradientUnscaling._fused_step`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist

from .._errors import AmpcoreError
from .._o2.scaled_update import PendingUnscale, deferred_unscale
from .iteration import OptimizerRecord, Stage
from .kernels import ScalerKernels
from .store import CALL, ScaleStore

__all__ = ["GradientUnscaling"]


class GradientUnscaling:
    """The unscaling and inf/nan checks of a scaler's optimizers (mixed into GradScaler)."""

    _store: ScaleStore
    _kernels: ScalerKernels
    _records: dict[int, OptimizerRecord]
    _process_group: dist.ProcessGroup | None
    _sync_found_inf: bool

    def _unscale_grads_(
        self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, allow_fp16: bool
    ) -> torch.Tensor:
        """Unscale ``optimizer``'s gradients in place; return the found-inf flag (on the device)."""
        return self._kernels.unscale_optimizer_(
            optimizer, inv_scale, allow_fp16, self._process_group, self._sync_found_inf
        )

    def _or_late_overflow_(self, found_inf: torch.Tensor | None) -> None:
        """OR the device overflow flag into ``found_inf`` once more, at ``step`` after an
        explicit ``unscale_``: what ran in between (clipping) may have overflowed too."""
        if found_inf is not None and found_inf.device.type == self._store.backend.device_type:
            self._kernels.or_device_overflow_(found_inf)

    def _check_deferred(
        self, optimizer: torch.optim.Optimizer, record: OptimizerRecord, scale: torch.Tensor, pending: PendingUnscale
    ) -> None:
        """``unscale_`` for an O2 optimizer whose update unscales the low-precision
        gradients of ``pending`` as it widens them (``ampcore/_o2/scaled_update.py``): those
        are only checked for inf/nan here, read-only, so no float32 copy of them is made;
        the other gradients are unscaled in place as ``unscale_`` does."""
        scaling = self._store.scaling
        inv_scale = self._kernels.inv_scale(scale) if scaling else torch.ones_like(scale)
        record.found_inf = self._kernels.unscale_params_(
            pending.params(),
            inv_scale,
            not scaling,
            self._process_group,
            self._sync_found_inf,
            checked=pending.low_grads(),
        )
        pending.inv_scale = inv_scale if scaling else None
        record.stage = Stage.UNSCALED
        self._records[id(optimizer)] = record

    def _check_fused(
        self, optimizer: torch.optim.Optimizer, scale: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> torch.Tensor:
        """The found-inf flag of a fused optimizer's step (its kernel unscales).  The
        low-precision gradients of O2 masters whose update reads them itself (fused
        Adam/AdamW: ``ampcore/_o2/master_adam.py``) are checked read-only, so no float32
        copy of them is made; the other gradients as ``unscale_`` checks them."""
        ones = torch.ones_like(scale)
        pending = deferred_unscale(optimizer, args, kwargs)
        if pending is None:
            return self._unscale_grads_(optimizer, ones, allow_fp16=True)
        return self._kernels.unscale_params_(
            pending.params(), ones, True, self._process_group, self._sync_found_inf, checked=pending.low_grads()
        )

    def _fused_step(
        self,
        optimizer: torch.optim.Optimizer,
        record: OptimizerRecord,
        scale: torch.Tensor,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``step`` of a fused optimizer: check its gradients (unless ``unscale_`` ran), then
        call its step with the ``grad_scale`` and ``found_inf`` attributes set; no host sync."""
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            raise AmpcoreError(
                f"{CALL}.step(): {type(optimizer).__name__}.step takes a 'grad_scaler' argument, torch's "
                "deprecated protocol, which ampcore does not support; read the 'grad_scale' and "
                "'found_inf' attributes the scaler sets on the optimizer instead"
            )
        if record.stage is Stage.READY:
            record.found_inf = self._check_fused(optimizer, scale, args, kwargs)
            grad_scale = scale * getattr(optimizer, "grad_scale", 1) if self._store.scaling else None
        else:
            grad_scale = getattr(optimizer, "grad_scale", None)
            self._or_late_overflow_(record.found_inf)
        optimizer.grad_scale = grad_scale  # type: ignore[attr-defined]
        optimizer.found_inf = record.found_inf  # type: ignore[attr-defined]
        try:
            result = optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
            del optimizer.found_inf  # type: ignore[attr-defined]
        record.stage = Stage.STEPPED
        self._records[id(optimizer)] = record
        return result
