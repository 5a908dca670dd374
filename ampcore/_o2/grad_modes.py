"""How the fp32 masters get their gradients: one strategy per optimizer, chosen once by
``ampcore.decorate``'s options (see ``master.py`` and docs/o2.md).

* :class:`SharedFp32Grads` (``master_grad=True``): backward accumulates float32 gradients on
  the model's parameters (``grad_dtype=float32``); each master's ``.grad`` *is* that tensor.
* :class:`CopiedGrads` (the default where the dtype needs loss scaling): the first read of
  the param groups after the low-precision gradients changed gives each master an fp32
  copy; the copies are released after the step.
* :class:`LowGradsWhenExact` (the default where the dtype needs no loss scaling): as
  :class:`CopiedGrads`, except that the step of momentum-free torch SGD reads the
  low-precision gradients themselves (the masters get ``grad_dtype=None``), which is exact
  and saves the copy.  Whether the optimizer qualifies depends on its param groups, so it
  is checked at each read; reads before the step (``GradScaler.unscale_``, clipping the
  optimizer's parameters) get float32 copies, as they would modify the gradients in place.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Final

import torch

from .._errors import AmpcoreError

if TYPE_CHECKING:
    from .master import MasterPair, MasterWeights

__all__ = ["CopiedGrads", "GradientMode", "LowGradsWhenExact", "SharedFp32Grads", "choose_gradient_mode"]


class GradientMode(ABC):
    """The gradient strategy of one :class:`~ampcore._o2.master.MasterWeights`."""

    def install(self, pairs: list[MasterPair]) -> None:  # noqa: B027 - a do-nothing default, not abstract
        """Prepare the parameters when decorate installs the masters (default: nothing)."""

    @abstractmethod
    def sync(self, weights: MasterWeights, copy_missing: bool) -> None:
        """Give each master the current gradient of its model parameter."""

    def shares_low_grads(self, weights: MasterWeights) -> bool:
        """Whether the optimizer reads the low-precision gradients directly (default: no)."""
        return False

    def release(self, pairs: list[MasterPair]) -> None:
        """After the step: drop the masters' fp32 gradient copies."""
        for pair in pairs:
            pair.master.grad = None


class SharedFp32Grads(GradientMode):
    """``master_grad=True``: model and master share one float32 gradient."""

    def install(self, pairs: list[MasterPair]) -> None:
        for pair in pairs:
            pair.model.grad_dtype = pair.master.dtype  # type: ignore[attr-defined,unused-ignore]  # older torch lacks it

    def sync(self, weights: MasterWeights, copy_missing: bool) -> None:
        _share(weights.pairs)

    def release(self, pairs: list[MasterPair]) -> None:
        """The shared gradient is the model's: nothing to drop."""


class CopiedGrads(GradientMode):
    """fp32 copies of the low-precision gradients, made on read, released after the step."""

    def sync(self, weights: MasterWeights, copy_missing: bool) -> None:
        _copy(weights, copy_missing)


class LowGradsWhenExact(CopiedGrads):
    """As :class:`CopiedGrads`, but momentum-free torch SGD reads the low-precision
    gradients directly (the masters accept them: ``grad_dtype=None``)."""

    def install(self, pairs: list[MasterPair]) -> None:
        for pair in pairs:
            pair.master.grad_dtype = None  # type: ignore[attr-defined,unused-ignore]  # older torch lacks it

    def sync(self, weights: MasterWeights, copy_missing: bool) -> None:
        # Only the optimizer's own step may read the low-precision gradients: what reads them
        # before it (GradScaler.unscale_, clipping) changes them in place, in low precision.
        if weights.stepping and not weights.copies_held and self.shares_low_grads(weights):
            _share(weights.pairs)
        else:
            _copy(weights, copy_missing)

    def shares_low_grads(self, weights: MasterWeights) -> bool:
        """Whether the optimizer can read the low-precision gradients directly: torch's
        single-tensor SGD without momentum computes ``master.add_(grad, alpha=-lr)`` in
        float32 from a bfloat16 ``grad`` exactly as from its float32 copy, in one pass and
        without the copy.  (Momentum would start its buffer as a low-precision clone.)"""
        optimizer = weights.optimizer
        if type(optimizer) is not torch.optim.SGD:
            return False
        groups = optimizer.param_groups  # .get() does not trigger a sync
        if any(g.get("momentum", 0) != 0 or g.get("fused") or g.get("differentiable") for g in groups):
            return False
        if any(g.get("foreach") for g in groups) or hasattr(optimizer, "grad_scale"):
            return False
        if any(pair.model.grad is not None and pair.model.grad.is_sparse for pair in weights.pairs):
            return False
        try:
            from torch.optim.optimizer import _default_to_fused_or_foreach

            _, foreach = _default_to_fused_or_foreach(weights.masters, False, False)
        except (ImportError, TypeError):  # another torch: do not guess
            return False
        return not foreach or all(g.get("foreach") is False for g in groups)


def choose_gradient_mode(master_grad: bool, may_share: bool) -> GradientMode:
    """The strategy for decorate's ``master_grad`` and whether the dtype may share its
    low-precision gradients (it needs no loss scaling: GradScaler refuses float16 ones)."""
    if master_grad:
        return SharedFp32Grads()
    if may_share and hasattr(torch.Tensor, "grad_dtype"):
        return LowGradsWhenExact()
    return CopiedGrads()


def _share(pairs: list[MasterPair]) -> None:
    """Each master's gradient is its model parameter's."""
    for pair in pairs:
        grad = pair.model.grad
        if pair.master.grad is not grad:
            pair.master.grad = grad
        pair.seen_grad = None


def _copy(weights: MasterWeights, copy_missing: bool) -> None:
    """Copy each changed low-precision gradient into its master's fp32 gradient.

    With ``copy_missing=False`` only masters that already hold a copy are brought up to
    date (or dropped, if the model's gradient is gone); the others keep no gradient.
    """
    if not copy_missing and not weights.copies_held:  # no master holds a copy to bring up to date
        return
    stale: list[tuple[MasterPair, torch.Tensor]] = []
    conflicts: list[MasterPair] = []
    for pair in weights.pairs:
        seen = pair.seen_grad
        if seen is None and not copy_missing:  # (checked first: it is the common case)
            continue
        grad = pair.model.grad
        if grad is None:
            if seen is not None:  # the model's gradients were cleared since the copy
                pair.master.grad = None
                pair.seen_grad = None
            continue
        same_object = seen is not None and seen() is grad
        if same_object and pair.seen_grad_version == grad._version:
            continue
        if same_object and pair.master.grad is not None:
            # changed in place while the master still holds the copy (that GradScaler
            # may have unscaled: torch's unscale kernel does not bump versions)
            conflicts.append(pair)
        stale.append((pair, grad))
    if conflicts and all(_finite(pair.master.grad) for pair in conflicts):
        raise AmpcoreError(_CONFLICT.format(optimizer=type(weights.optimizer).__name__, count=len(conflicts)))
    # (non-finite master gradients belong to a step GradScaler skipped: replace them)
    if not stale:
        return
    with torch.no_grad():
        # one multi-tensor copy (a few kernels on a GPU), not one per parameter; each copy
        # in its gradient's layout, as ``grad.to(dtype)`` makes it
        copies = [torch.empty_like(grad, dtype=pair.master.dtype) for pair, grad in stale]
        weights.copies_held = True
        torch._foreach_copy_(copies, [grad for _, grad in stale])
        for (pair, grad), copy in zip(stale, copies, strict=True):
            pair.master.grad = copy
            if weights.pending is not None:  # a GradScaler step that defers unscaling
                weights.pending.unscale_copy(pair.master, copy)
            pair.seen_grad = weakref.ref(grad)
            pair.seen_grad_version = grad._version


def _finite(tensor: torch.Tensor | None) -> bool:
    return tensor is None or bool(torch.isfinite(tensor).all())


_CONFLICT: Final = (
    "{optimizer}: the gradients of {count} low-precision model parameter(s) were changed in "
    "place after ampcore copied them to the fp32 master gradients that the optimizer and "
    "GradScaler use (the copy is made when optimizer.param_groups is read, e.g. by "
    "scaler.unscale_(optimizer)); the copy may be unscaled already, so neither can be trusted. "
    "Typically this is clip_grad_norm_(model.parameters()) after scaler.unscale_(optimizer), "
    "which clips still-scaled low-precision gradients. Clip the optimizer's parameters instead: "
    "clip_grad_norm_([p for g in optimizer.param_groups for p in g['params']], max_norm), "
    "or decorate with master_grad=True so that model and optimizer share one fp32 gradient."
)
