"""GradScaler steps on O2 master weights without a full-size float32 gradient copy.

Without ``master_grad``, a master gets a float32 copy of its low-precision gradient when
the param groups are read (``grad_modes.py``).  ``GradScaler.unscale_`` reads them, so a
scaler step used to widen every gradient (a full float32 copy of them all: 2.4 GB for the
guide's 604M-parameter network) before the update, although ampcore's own updates of
momentum-free SGD, Adam and AdamW (``master_sgd.py``, ``master_adam.py``) read the
low-precision gradients themselves.

For those updates :func:`deferred_unscale` lets ``GradScaler.step`` (with no explicit
``unscale_``) *defer* the unscaling of the masters that hold no gradient yet:

1. the scaler checks their low-precision gradients for inf/nan read-only (a few
   multi-tensor ops, no copy), and unscales the other gradients in place as before (the
   float32 parameters' own, copies that exist already);
2. after its one host read of the found-inf flag, a clean step runs ``optimizer.step()``
   inside :meth:`PendingUnscale.during`: the update (:func:`unscaled_update`) widens the
   deferred gradients slice by slice (at most a :data:`SLICES`-th of them and
   :data:`SLICE_ELEMENTS`, or one chunk on the CPU's chunked walk, or one larger tensor),
   multiplies each slice by ``inv_scale`` in float32 and updates those masters before the
   next slice is widened.  A skipped step widens nothing.  A scaler that does not scale
   (bfloat16) defers nothing but the check: the update widens as it does without a scaler.

The arithmetic is the scaler's: the low-precision gradient widened exactly, then
multiplied by ``inv_scale`` in float32 (what torch's unscale kernel does to a float32
copy), then the optimizer's update; the results are bit-identical to unscaling a full
copy.  While a step is pending, anything that reads the param groups (a wrapper around
``step``, the generic step path) gets float32 copies already unscaled (``grad_modes.py``),
so every reader still sees unscaled gradients.

An explicit ``scaler.unscale_(optimizer)`` (to clip gradients) needs the real unscaled
gradients on the masters, so it keeps making the copies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import torch

from .master_adam import WIDEN_ELEMENTS, fused_adam_applies
from .master_sgd import fused_sgd_applies

if TYPE_CHECKING:
    from .master import MasterWeights

__all__ = ["SLICE_ELEMENTS", "SLICES", "PendingUnscale", "deferred_unscale", "unscaled_update"]

#: Gradients widened at a time by a deferred unscale on the whole-tensor walk, at most (as
#: the Adam update's own widening: 256 MiB of float32; one larger tensor makes a slice of
#: its own).  The chunked walk (the CPU) widens at most one chunk's worth of small tensors.
SLICE_ELEMENTS: int = WIDEN_ELEMENTS
#: ... and at most this share of the pending gradients (a model smaller than
#: :data:`SLICE_ELEMENTS` is widened in this many slices, not all at once)
SLICES: Final = 4

#: The marker on ampcore's own ``optimizer.step`` (``master.py``); ``functools.wraps``
#: copies it onto wrappers that call through, such as an LR scheduler's.
STEP_MARK: Final = "_ampcore_master_step"


@dataclass(eq=False)
class PendingUnscale:
    """The masters whose gradients a clean scaler step unscales in the update."""

    weights: MasterWeights
    #: masters still waiting: their low-precision gradients are scaled
    masters: set[torch.Tensor]
    #: the float32 inverse scale; None while the step is not (yet) known to be clean
    inv_scale: torch.Tensor | None = None
    _on_device: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    def params(self) -> list[torch.Tensor]:
        """Every parameter of the optimizer (read without making gradient copies): the
        gradients the scaler unscales in place are theirs (pending masters have none)."""
        groups = self.weights.optimizer.param_groups
        return [param for group in groups for param in dict.__getitem__(group, "params")]

    def low_grads(self) -> list[torch.Tensor]:
        """The deferred low-precision gradients (for the scaler's read-only check)."""
        low_of = self.weights.low_of
        return [low_of[master].grad for master in self.masters]  # type: ignore[misc]

    def inv_scale_on(self, device: torch.device) -> torch.Tensor:
        """``inv_scale`` on ``device`` (copied once per device)."""
        inv = self.inv_scale
        if inv is None:  # only reachable through a bug in the caller
            raise RuntimeError("ampcore: a deferred unscale ran before the scaler set the inverse scale")
        found = self._on_device.get(device)
        if found is None:
            found = self._on_device[device] = inv.to(device, non_blocking=True)
        return found

    def unscale_copy(self, master: torch.Tensor, copy: torch.Tensor) -> None:
        """``copy`` (a fresh float32 copy of ``master``'s low-precision gradient, made
        while the step is pending) is unscaled in place: the master is no longer pending."""
        if master in self.masters:
            copy.mul_(self.inv_scale_on(copy.device))
            self.masters.discard(master)

    @contextlib.contextmanager
    def during(self) -> Iterator[None]:
        """The clean step that consumes this: ``optimizer.step()`` runs inside.  Without
        ``inv_scale`` (a scaler that does not scale) there is nothing to unscale."""
        if self.inv_scale is None:
            self.masters.clear()
        self.weights.pending = self
        try:
            yield
        finally:
            self.weights.pending = None
            self.masters.clear()


def deferred_unscale(
    optimizer: torch.optim.Optimizer, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> PendingUnscale | None:
    """For ``GradScaler.step(optimizer, *args, **kwargs)``: the masters whose unscaling can
    wait for the update, or None when the step must unscale as before (not ampcore's O2
    master weights, or an update that does not read low-precision gradients itself, step
    arguments, a ``step`` replaced by something else, sparse gradients, nothing to defer).

    Brings the copies that exist up to date first (making no new ones), so that what the
    scaler unscales in place and what it defers are exactly the gradients the update reads.
    """
    from .master import master_weights_of

    weights = master_weights_of(optimizer)
    if weights is None or args or kwargs or not getattr(optimizer.step, STEP_MARK, False):
        return None
    if not (fused_adam_applies(optimizer) or fused_sgd_applies(optimizer)):
        return None
    weights.wrap_groups()
    weights.sync_grads(copy_missing=False)
    masters: set[torch.Tensor] = set()
    for group in optimizer.param_groups:
        for param in dict.__getitem__(group, "params"):
            low = weights.low_of.get(param)
            if param.grad is not None or low is None or low.grad is None:
                continue
            if low.grad.is_sparse:
                return None
            masters.add(param)
    return PendingUnscale(weights, masters) if masters else None


def unscaled_update(
    pending: PendingUnscale,
    groups: Sequence[dict[str, Any]],
    chunk: int | None,
    update: Callable[[list[dict[str, Any]]], list[torch.Tensor]],
    direct: Callable[[dict[str, Any], torch.Tensor], list[torch.Tensor] | None] | None = None,
) -> list[torch.Tensor]:
    """Run ``update`` (ampcore's update of the param groups it is given, on the walk
    ``chunk``, which reads each master's own ``.grad`` first) on ``groups``, slice by slice:
    each slice's pending masters get their gradients widened and unscaled as ``.grad`` for
    the call, then lose them.  A slice holds at most :data:`SLICE_ELEMENTS` elements (one
    ``chunk`` on the chunked walk) and a :data:`SLICES`-th of all pending ones, or one
    larger tensor.  The parameters that are not pending go with the first slice of their
    group.  Returns what the calls returned (the float32 parameters they updated).

    ``direct(group, inv_scale)``: an update that reads the scaled low-precision gradients
    and unscales them itself (the one-pass kernel of the for-loop flavour,
    ``onepass_loop.py``), run on a plain copy of the whole group, nothing widened; None
    where it does not take the group (then it goes slice by slice as above)."""
    own: list[torch.Tensor] = []
    bound = SLICE_ELEMENTS if chunk is None else min(chunk, SLICE_ELEMENTS)
    bound = min(bound, max(1, sum(master.numel() for master in pending.masters) // SLICES))
    for group in groups:
        params: list[torch.Tensor] = dict.__getitem__(group, "params")  # no gradient sync
        done = None if direct is None else _direct(pending, group, params, direct)
        if done is not None:
            own.extend(done)
            continue
        waiting = [p for p in params if p in pending.masters]
        rest = [p for p in params if p not in pending.masters]
        for part in _slices(waiting, bound) or [[]]:
            widened = _widen(pending, part, chunk)
            try:
                own.extend(update([_with_params(group, rest + part)]))
            finally:
                for master in part:
                    master.grad = None
            del widened
            rest = []
    return own


def _direct(
    pending: PendingUnscale,
    group: dict[str, Any],
    params: list[torch.Tensor],
    direct: Callable[[dict[str, Any], torch.Tensor], list[torch.Tensor] | None],
) -> list[torch.Tensor] | None:
    """``direct`` on the whole group with the inverse scale (None: not taken)."""
    waiting = [p for p in params if p in pending.masters]
    if not waiting:
        return None
    done = direct(_with_params(group, params), pending.inv_scale_on(waiting[0].device))
    if done is not None:
        pending.masters.difference_update(waiting)
    return done


def _slices(masters: list[torch.Tensor], bound: int) -> list[list[torch.Tensor]]:
    """``masters`` in runs of at most ``bound`` elements (a larger one alone)."""
    slices: list[list[torch.Tensor]] = []
    size = 0
    for master in masters:
        if slices and size + master.numel() <= bound:
            slices[-1].append(master)
            size += master.numel()
        else:
            slices.append([master])
            size = master.numel()
    return slices


def _widen(pending: PendingUnscale, part: list[torch.Tensor], chunk: int | None) -> list[torch.Tensor]:
    """Give each master of ``part`` its low-precision gradient widened to float32 and
    multiplied by the inverse scale: one multi-tensor copy and one multiply per device;
    on the chunked walk a tensor larger than a chunk goes chunk by chunk, so that the
    multiply finds the widened chunk in cache."""
    if not part:
        return []
    low_of = pending.weights.low_of
    widened = [torch.empty_like(master, memory_format=torch.contiguous_format) for master in part]
    by_device: dict[torch.device, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for master, wide in zip(part, widened, strict=True):
        low: torch.Tensor = low_of[master].grad  # type: ignore[assignment]
        if chunk is not None and wide.numel() > chunk and low.is_contiguous():
            _widen_by_chunks(wide.view(-1), low.view(-1), pending.inv_scale_on(wide.device), chunk)
            continue
        lows, wides = by_device.setdefault(wide.device, ([], []))
        lows.append(low)
        wides.append(wide)
    with torch.no_grad():
        for device, (lows, wides) in by_device.items():
            torch._foreach_copy_(wides, lows)
            torch._foreach_mul_(wides, pending.inv_scale_on(device))
    for master, wide in zip(part, widened, strict=True):
        master.grad = wide
        pending.masters.discard(master)
    return widened


def _widen_by_chunks(wide: torch.Tensor, low: torch.Tensor, inv_scale: torch.Tensor, chunk: int) -> None:
    with torch.no_grad():
        for start in range(0, wide.numel(), chunk):
            piece = wide[start : start + chunk]
            piece.copy_(low[start : start + chunk])
            piece.mul_(inv_scale)


def _with_params(group: Mapping[str, Any], params: list[torch.Tensor]) -> dict[str, Any]:
    """A plain copy of ``group`` holding ``params`` (reading it syncs nothing)."""
    copy = dict.copy(group)  # type: ignore[arg-type]
    copy["params"] = params
    return copy
