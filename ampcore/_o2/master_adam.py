"""ampcore's own master-weight update for ``torch.optim.Adam`` and ``AdamW``.

The generic master-weight step gives every master an fp32 copy of its low-precision gradient
(a full-size tensor per parameter, made one tensor at a time when the param groups are
read), lets the optimizer make its passes over the masters and states, then refreshes the
low-precision parameters in another pass.  For Adam and AdamW ampcore runs the update
itself, calling torch's own Adam function (the flavour the param group asks for:
single-tensor, foreach or fused) on the fp32 masters, in one of two ways chosen by the
backend (``BackendSpec.master_update_chunk_elements``):

* **whole tensors** (``None``: GPU-like devices, and the default for third-party
  adapters): per param group, the low-precision gradients are widened into float32 in one
  multi-tensor ``_foreach_copy_``, torch's Adam runs once on all the group's masters, and
  the low-precision parameters are refreshed in one ``_foreach_copy_``: with the foreach
  or fused flavour that is a handful of multi-tensor kernels per group (per 64M
  parameters), whatever the parameters' sizes.  torch's Adam kernels take gradients in the
  parameters' dtype only, so widened gradients exist during the step: at most
  :data:`WIDEN_ELEMENTS` at a time (or one larger tensor), not a full-size copy.
* **chunks** (a number of elements: the CPU): a parameter larger than a chunk goes chunk
  by chunk, widening each chunk of the low-precision gradient into a small float32 scratch
  buffer and writing the low-precision parameter chunk from the master chunk while it is
  still in cache.  No full-size float32 gradient exists; each chunk of the gradient is
  read once (2 bytes per parameter), the master and the states read and written once (24,
  or 32 with amsgrad) and the parameter written once (2).  Parameters of at most one chunk
  go whole, with their own step counts, in one call of torch's Adam per chunk's worth of
  elements.

Adam is elementwise, so running torch's own Adam on chunks gives, element for element, the
results of running it on the whole tensors with the upcast gradients: the same kernels with
the same scalars.  The step count is the only non-elementwise state: every chunk gets a copy
of the count from before the step, and the count itself is advanced once per parameter, as
torch does.  State is created exactly as ``Adam._init_group`` creates it, so state dicts are
interchangeable with the generic path (and with plain torch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from .._errors import AmpcoreError
from .adam_call import (
    ADAM_KEYS,
    adam_function,
    adam_state,
    call_adam,
    flavour,
    run_adam,
    scaler_tensors,
    state_tensors,
)
from .adam_plans import AdamPlans
from .master_kernel import Work, triton_update
from .master_sgd import step_hooks_free
from .onepass_loop import adam_update as loop_adam_update
from .onepass_loop import loop_ready
from .onepass_loop import takes as takes_loop
from .onepass_loop import unscaled as loop_unscaled

__all__ = ["WIDEN_ELEMENTS", "fused_adam_applies", "fused_adam_update"]

#: Whole-tensor updates widen at most this many gradient elements at a time (256 MiB of
#: float32), so the transient float32 gradients stay a small share of a large model's memory
#: while a step stays a few multi-tensor ops per 64M parameters.
WIDEN_ELEMENTS: Final = 1 << 26

_ADAM_TYPES: Final = (torch.optim.Adam, torch.optim.AdamW)


def fused_adam_applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ampcore may run ``optimizer``'s step itself.

    Yes for exactly ``torch.optim.Adam`` / ``AdamW`` (a subclass may change ``step``) with no
    step hooks, not ``differentiable``, on a torch whose Adam has the param-group keys this
    module knows; in the middle of a GradScaler step that hands the optimizer
    ``grad_scale``/``found_inf`` (fused optimizers) only if every param group is
    ``fused=True`` (torch's other flavours refuse them).  Otherwise the generic path runs
    (fp32 gradient copies).
    """
    if type(optimizer) not in _ADAM_TYPES or adam_function() is None or not step_hooks_free(optimizer):
        return False
    groups = optimizer.param_groups
    for group in groups:  # (dict's own lookups: reading a group's options syncs nothing)
        if not ADAM_KEYS <= group.keys() or dict.__getitem__(group, "differentiable"):
            return False
    return scaler_tensors(optimizer) == (None, None) or all(dict.__getitem__(group, "fused") for group in groups)


@dataclass
class _Batch:
    """Chunks waiting for one call of torch's Adam (small parameters share a call)."""

    #: elements per chunk (and per call)
    chunk: int
    scratch: torch.Tensor | None = None
    used: int = 0
    params: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    exp_avgs: list[torch.Tensor] = field(default_factory=list)
    exp_avg_sqs: list[torch.Tensor] = field(default_factory=list)
    max_exp_avg_sqs: list[torch.Tensor] = field(default_factory=list)
    steps: list[torch.Tensor] = field(default_factory=list)
    refresh: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    def add(
        self,
        master: torch.Tensor,
        wide: torch.Tensor,
        low: torch.Tensor,
        states: list[torch.Tensor],
        step: torch.Tensor,
    ) -> None:
        """Queue one (chunk of a) master with its float32 gradient, its ``exp_avg``,
        ``exp_avg_sq`` (and ``max_exp_avg_sq``) in ``states``, its step count, and the
        low-precision (chunk of the) parameter to refresh from it."""
        self.used += master.numel()
        self.params.append(master)
        self.grads.append(wide)
        self.exp_avgs.append(states[0])
        self.exp_avg_sqs.append(states[1])
        if len(states) > 2:
            self.max_exp_avg_sqs.append(states[2])
        self.steps.append(step)
        self.refresh.append((low, master))

    def clear(self) -> None:
        self.used = 0
        for items in (self.params, self.grads, self.exp_avgs, self.exp_avg_sqs, self.max_exp_avg_sqs, self.steps):
            items.clear()
        self.refresh.clear()


def fused_adam_update(
    optimizer: torch.optim.Optimizer,
    low_of: Mapping[torch.Tensor, torch.Tensor],
    chunk: int | None,
    triton: bool = False,
    onepass: bool = False,
    *,
    groups: Sequence[dict[str, Any]] | None = None,
    plans: AdamPlans | None = None,
    inv_scale: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Run one Adam/AdamW step of ``optimizer`` (see :func:`fused_adam_applies`), on
    ``groups`` (copies of some of its param groups, as ``scaled_update.py`` passes) or on all.

    For a master (a key of ``low_of``) the gradient is the master's own ``.grad`` where it
    has one (an fp32 copy made earlier, e.g. for clipping, or the shared fp32 gradient of
    ``master_grad=True``), else its low-precision parameter's gradient, widened (whole, or
    chunk by chunk with ``chunk`` elements); the low-precision parameter is refreshed from
    its master.  Other parameters (float32 ones, e.g. norms) are updated whole with their
    own gradients.  Under a GradScaler step of a fused optimizer, its ``grad_scale`` and
    ``found_inf`` go to every fused update as torch's optimizer passes them (the gradients
    divided inside the kernel, a step with an inf or a nan skipped on the device, the step
    counts as torch leaves them).  With ``onepass``, ``fused=True`` groups run the one-pass
    CPU kernel where it applies (``onepass.py``), and groups of torch's for-loop or foreach
    flavour that of ``onepass_loop.py``.  Returns those other parameters that were
    updated.

    ``plans`` (with ``groups`` None): what the optimizer's whole-tensor updates keep
    between steps (``adam_plans.py``); a group it covers takes the same calls from there
    (not a group that the Triton or a one-pass kernel may take).

    ``inv_scale`` (with ``groups``): the low-precision gradients are scaled by a GradScaler
    whose unscaling the update does (``scaled_update.py``): the for-loop flavour's one-pass
    kernel multiplies by it as it reads them, every other path gets them widened and
    unscaled first.
    """
    adam = adam_function()
    if adam is None:  # fused_adam_applies() checks this before the step comes here
        raise AmpcoreError("the chunked Adam update needs torch.optim.adam.adam, which this torch does not have")
    chosen = optimizer.param_groups if groups is None else groups
    fused_onepass, loop_onepass = _onepass_kernels(chosen) if onepass else (False, False)
    own: list[torch.Tensor] = []
    with torch.no_grad():
        if plans is not None:
            plans.keep(len(optimizer.param_groups))
        for index, group in enumerate(chosen):
            fused = dict.__getitem__(group, "fused")
            kernel = (triton or fused_onepass) if fused else loop_onepass and takes_loop(group)
            if plans is not None and chunk is None and not kernel:
                planned = plans.update(adam, optimizer, index, group, WIDEN_ELEMENTS)
                if planned is not None:  # the group's update from what the last steps kept
                    own.extend(planned)
                    continue
            work = _work(optimizer, group, low_of)
            if not work:
                continue
            options = flavour(group, [param for param, *_ in work], scaler_tensors(optimizer))
            own.extend(param for param, _, low, _ in work if low is None)
            if inv_scale is not None and not (kernel and not fused):
                work = [(m, loop_unscaled(g, m, inv_scale), low, state) for m, g, low, state in work]
            if triton and group["fused"]:
                work = triton_update(group, work, options["grad_scale"], options["found_inf"])
                if not work:
                    continue
            if fused_onepass and fused:
                from .onepass import adam_update

                work = adam_update(group, work, options["grad_scale"], options["found_inf"])
                if not work:
                    continue
            elif kernel and not fused:  # torch's for-loop (or CPU foreach) flavour: onepass_loop.py
                work = loop_adam_update(group, work, inv_scale)
                if not work:
                    continue
            if chunk is None:
                _whole(adam, options, group, work)
                continue
            batch = _Batch(chunk)
            for param, grad, low, state in work:
                if low is None:
                    call_adam(adam, options, group, [param], [grad], [state])
                    continue
                _chunks(adam, options, group, param, grad, low, state, batch)
            _flush(adam, options, group, batch)
    return own


def _onepass_kernels(groups: Sequence[dict[str, Any]]) -> tuple[bool, bool]:
    """Whether the one-pass CPU kernels of the fused and of the for-loop flavour run (each
    built and self-checked at its first use, only where a group of its flavour is here)."""
    from .onepass import ready

    flags = [bool(dict.__getitem__(group, "fused")) for group in groups]
    return (any(flags) and ready()), (not all(flags) and loop_ready())


def _work(optimizer: torch.optim.Optimizer, group: dict[str, Any], low_of: Mapping[torch.Tensor, torch.Tensor]) -> Work:
    """The group's parameters with a gradient: (master or float32 parameter, its gradient,
    its low-precision parameter or None, its state, created if new)."""
    work: Work = []
    for param in dict.__getitem__(group, "params"):  # no gradient sync
        low = low_of.get(param)
        grad = param.grad if param.grad is not None or low is None else low.grad
        if grad is None:
            continue
        if grad.is_sparse:
            raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
        work.append((param, grad, low, adam_state(optimizer, group, param)))
    return work


def _whole(adam: Any, options: dict[str, Any], group: Mapping[str, Any], work: Work) -> None:
    """One param group on whole tensors, in slices of at most :data:`WIDEN_ELEMENTS`
    widened elements (a single larger tensor makes a slice of its own): per slice, the
    low-precision gradients widened in one multi-tensor copy, one call of torch's Adam,
    the low-precision parameters refreshed in one multi-tensor copy."""
    start, widened = 0, 0
    for index, (param, grad, *_) in enumerate(work):
        size = param.numel() if grad.dtype != param.dtype else 0
        if widened and widened + size > WIDEN_ELEMENTS:
            _whole_slice(adam, options, group, work[start:index])
            start, widened = index, 0
        widened += size
    _whole_slice(adam, options, group, work[start:])


def _whole_slice(adam: Any, options: dict[str, Any], group: Mapping[str, Any], work: Work) -> None:
    params = [param for param, *_ in work]
    grads = [grad for _, grad, *_ in work]
    narrow = [index for index, (param, grad, *_) in enumerate(work) if grad.dtype != param.dtype]
    if narrow:
        wide = [torch.empty_like(params[index]) for index in narrow]
        torch._foreach_copy_(wide, [grads[index] for index in narrow])
        for index, tensor in zip(narrow, wide, strict=True):
            grads[index] = tensor
    call_adam(adam, options, group, params, grads, [state for *_, state in work])
    refreshed = [(low, param) for param, _, low, _ in work if low is not None]
    if refreshed:
        torch._foreach_copy_([low for low, _ in refreshed], [param for _, param in refreshed])


def _chunks(
    adam: Any,
    options: dict[str, Any],
    group: Mapping[str, Any],
    master: torch.Tensor,
    grad: torch.Tensor,
    low: torch.Tensor,
    state: dict[str, Any],
    batch: _Batch,
) -> None:
    """Queue one master: whole if it fits in a chunk, else chunk by chunk, the step count
    advancing once, after its last chunk (every chunk updates with a copy of the count from
    before the step)."""
    widen = grad.dtype != master.dtype
    total, size_of = master.numel(), batch.chunk
    if total <= size_of:
        # one chunk: the whole tensors, with the real step count (torch's Adam advances it,
        # as for a parameter without master); the batch's float32 gradients stay within a chunk
        if batch.used + total > size_of:
            _flush(adam, options, group, batch)
        batch.add(master, grad.to(master.dtype) if widen else grad, low, state_tensors(group, state), state["step"])
        return
    tensors = [master, grad, low, *state_tensors(group, state)]
    if not all(t.is_contiguous() for t in tensors):
        # (a strided layout: no flat chunks) one whole-tensor update from a widened copy
        _flush(adam, options, group, batch)
        wide = grad.to(master.dtype) if widen else grad
        call_adam(adam, options, group, [master], [wide], [state])
        low.copy_(master)
        return
    flat = [t.view(-1) for t in tensors]
    before = state["step"]
    for start in range(0, total, size_of):
        stop = min(start + size_of, total)
        size = stop - start
        if batch.used + size > size_of:
            _flush(adam, options, group, batch)
        views = [t[start:stop] for t in flat]
        if widen:
            if batch.scratch is not None and batch.scratch.dtype != master.dtype:
                _flush(adam, options, group, batch)
                batch.scratch = None
            if batch.scratch is None:
                batch.scratch = torch.empty(size_of, dtype=master.dtype, device=master.device)
            wide = batch.scratch[batch.used : batch.used + size].copy_(views[1])
        else:
            wide = views[1]
        batch.add(views[0], wide, views[2], views[3:], before.clone())
    # the real count: the same in-place increment torch applies (before the last chunk's
    # update has run, which holds its own copy), and under a GradScaler the same decrement
    # by found_inf after it (a skipped step leaves the count as it was)
    before += 1
    if options["found_inf"] is not None:
        before.sub_(options["found_inf"].to(before.device, non_blocking=True))


def _flush(adam: Any, options: dict[str, Any], group: Mapping[str, Any], batch: _Batch) -> None:
    if not batch.params:
        return
    run_adam(
        adam,
        options,
        group,
        batch.params,
        batch.grads,
        batch.exp_avgs,
        batch.exp_avg_sqs,
        batch.max_exp_avg_sqs,
        batch.steps,
    )
    # the low-precision parameters from their masters in one call (a rounding copy, exact
    # whichever kernel runs it)
    torch._foreach_copy_([low for low, _ in batch.refresh], [master for _, master in batch.refresh])
    batch.clear()
