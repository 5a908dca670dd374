"""ampcore's own master-weight update for ``torch.optim.SGD`` groups that run torch's kernels:
``fused=True`` groups (torch's fused kernel) and groups with momentum (torch's for-loop or
foreach SGD).

torch's SGD takes gradients in the parameters' dtype only, so the generic master-weight
step gave every master a float32 copy of its low-precision gradient first: a full-size,
freshly allocated float32 tensor per parameter and step (on the CPU the page faults of
those fresh allocations cost more than the update itself).  Here ampcore calls torch's
own SGD itself, on the float32 masters, with the gradients widened as it goes, and
refreshes the low-precision parameters after:

* **whole tensors** (``chunk=None``, GPU-like devices): per param group, in slices of at
  most :data:`~ampcore._o2.master_adam.WIDEN_ELEMENTS` widened elements, one
  ``_foreach_copy_`` widening the gradients, one call of torch's SGD (fused: one
  ``torch._fused_sgd_``; foreach: its few multi-tensor ops), one ``_foreach_copy_``
  refreshing the low-precision parameters;
* **chunks** (a number of elements, the CPU): a parameter larger than a chunk goes chunk by
  chunk, its gradient widened into a float32 scratch buffer of one chunk reused for the
  whole step, torch's SGD run on the chunk (and its momentum buffer's chunk) and the
  low-precision chunk written while the master chunk is in cache; smaller parameters
  share a call per chunk's worth of elements.  No full-size float32 gradient exists.

torch's SGD is elementwise (each element's update reads only that element of the master,
the gradient and the momentum buffer), so running it on chunks, or on slices of the group,
computes exactly what it computes on float32 copies of the whole gradients: bit-identical
by construction, with momentum, Nesterov, dampening, weight decay, ``maximize`` and, for
fused groups, GradScaler's ``grad_scale``/``found_inf`` (the kernel divides by the scale
and skips the step on a found inf).  Momentum buffers are created as torch creates them
(the fused kernel: ``torch.empty_like`` of the float32 gradient, filled by its first step;
the other flavours: a clone of the float32 gradient, in the gradient's layout), so state
dicts are interchangeable with the generic path and plain torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["sgd_function", "torch_group_update"]


@dataclass
class _Item:
    """One (chunk of a) parameter for torch's SGD: the master (or float32 parameter), its
    gradient, the low-precision parameter to refresh or None, its momentum buffer (None:
    torch's first step creates it, into ``target``, the state's new buffer, where given)."""

    param: torch.Tensor
    grad: torch.Tensor
    low: torch.Tensor | None
    buf: torch.Tensor | None
    target: torch.Tensor | None = None


@dataclass
class _Call:
    """One call of torch's SGD being gathered (the chunked walk)."""

    chunk: int
    scratch: torch.Tensor | None = None
    used: int = 0
    items: list[_Item] = field(default_factory=list)


def sgd_function() -> Any:
    """torch's functional SGD (``torch.optim.sgd.sgd``), or None on a torch without it."""
    try:
        from torch.optim.sgd import sgd
    except ImportError:  # another torch: do not guess
        return None
    return sgd


def torch_group_update(
    optimizer: torch.optim.Optimizer,
    group: Mapping[str, Any],
    low_of: Mapping[torch.Tensor, torch.Tensor],
    chunk: int | None,
    onepass: bool = False,
    inv_scale: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """torch's SGD (fused, or with momentum) on one param group of ``optimizer``: each
    master with its own gradient if it has one (a float32 copy, or the shared gradient of
    ``master_grad=True``), else its low-precision parameter's gradient widened; the
    low-precision parameters refreshed; the momentum buffers in ``optimizer.state``.
    Returns the parameters without master (float32 ones) that were updated.  ``inv_scale``:
    the low-precision gradients are scaled (``onepass_loop.adam_update``), for a group that
    is not fused."""
    params: list[torch.Tensor] = dict.__getitem__(group, "params")  # type: ignore[index]  # no sync
    fused, momentum = bool(group.get("fused")), float(group["momentum"])
    items: list[_Item] = []
    own: list[torch.Tensor] = []
    for param in params:
        low = low_of.get(param)
        grad = param.grad if param.grad is not None or low is None else low.grad
        if grad is None:
            continue
        if grad.is_sparse:
            if fused:
                raise RuntimeError("`_fused_sgd` does not support sparse gradients")
            raise RuntimeError("ampcore's SGD master update got a sparse gradient (its step takes the generic path)")
        if low is None:
            own.append(param)
        items.append(_Item(param, grad, low, optimizer.state[param].get("momentum_buffer") if momentum else None))
    if not fused:
        _run(optimizer, group, items, chunk, False, onepass, inv_scale)
        return own
    if momentum:
        # torch's fused SGD: buffers ``torch.empty_like`` of the float32 gradient it sees (the
        # generic path's copy keeps the low-precision gradient's layout), filled by a first step
        fresh = [item for item in items if item.buf is None]
        for item in fresh:
            item.buf = torch.empty_like(item.grad, dtype=item.param.dtype)
            optimizer.state[item.param]["momentum_buffer"] = item.buf
        made = {id(item) for item in fresh}
        _run(optimizer, group, [item for item in items if id(item) not in made], chunk, False, onepass)
        _run(optimizer, group, fresh, chunk, True, onepass)
        return own
    _run(optimizer, group, items, chunk, False, onepass)
    return own


def _run(
    optimizer: torch.optim.Optimizer,
    group: Mapping[str, Any],
    items: list[_Item],
    chunk: int | None,
    first: bool,
    onepass: bool = False,
    inv_scale: torch.Tensor | None = None,
) -> None:
    if not items:
        return
    options = _options(optimizer, group, items, first)
    if onepass and options["fused"]:  # the one-pass CPU kernel takes what it can (onepass.py)
        from .onepass import sgd_update

        items = [items[i] for i in sgd_update(options, [(i.param, i.grad, i.low, i.buf) for i in items])]
        if not items:
            return
    elif onepass and _loop_ready():  # torch's for-loop (or CPU foreach) SGD: onepass_loop.py
        items = _loop_sgd(optimizer, options, items, inv_scale)
        if not items:
            return
    if inv_scale is not None:  # (a deferred unscale the kernel did not do)
        from .onepass_loop import unscaled

        for item in items:
            item.grad = unscaled(item.grad, item.param, inv_scale)
    if chunk is None:
        _whole(items, options)
    else:
        _chunked(items, options, chunk)
    if not options["fused"] and options["momentum"]:
        for item in items:  # (torch's first step made the new buffers)
            optimizer.state[item.param]["momentum_buffer"] = item.buf


def _loop_ready() -> bool:
    from .onepass_loop import loop_ready

    return loop_ready()


def _loop_sgd(
    optimizer: torch.optim.Optimizer, options: dict[str, Any], items: list[_Item], inv_scale: torch.Tensor | None
) -> list[_Item]:
    """The items the one-pass kernel of torch's for-loop SGD takes, updated (their new
    momentum buffers in the state, as torch's step leaves them); returns the rest."""
    from .onepass_loop import sgd_update

    rest, bufs = sgd_update(options, [(item.param, item.grad, item.low, item.buf) for item in items], inv_scale)
    kept = set(rest)
    taken = [item for index, item in enumerate(items) if index not in kept]
    for item, buf in zip(taken, bufs, strict=False):
        optimizer.state[item.param]["momentum_buffer"] = buf
    return [items[index] for index in rest]


def _options(
    optimizer: torch.optim.Optimizer, group: Mapping[str, Any], items: list[_Item], first: bool
) -> dict[str, Any]:
    """What torch's SGD step passes, with the flavour decided once for the group (as
    torch's ``sgd()`` decides it for the group's parameters with gradients)."""
    fused, foreach = bool(group.get("fused")), group.get("foreach")
    if not fused and foreach is None:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        _, foreach = _default_to_fused_or_foreach([item.param for item in items], False, use_fused=False)
    return {
        "fused": fused,
        "foreach": bool(foreach),
        "weight_decay": group["weight_decay"],
        "momentum": group["momentum"],
        "lr": group["lr"],
        "dampening": group["dampening"],
        "nesterov": group["nesterov"],
        "maximize": group["maximize"],
        "is_first_step": first,
        "grad_scale": getattr(optimizer, "grad_scale", None),
        "found_inf": getattr(optimizer, "found_inf", None),
    }


def _call(items: list[_Item], options: dict[str, Any]) -> None:
    """torch's SGD on ``items`` (torch's first step fills ``item.buf``, or ``item.target``)."""
    params, grads = [item.param for item in items], [item.grad for item in items]
    if options["fused"]:
        _fused_kernel(params, grads, [item.buf for item in items if item.buf is not None], options)
        return
    bufs = [item.buf for item in items]
    keys = ("weight_decay", "momentum", "lr", "dampening", "nesterov", "maximize")
    sgd_function()(params, grads, bufs, foreach=options["foreach"], **{key: options[key] for key in keys})
    for item, buf in zip(items, bufs, strict=True):
        if item.target is not None and item.buf is None and buf is not None:
            item.target.copy_(buf)  # a chunk of a new buffer: into the state's tensor
        elif item.target is None:
            item.buf = buf


def _fused_kernel(
    params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor], options: dict[str, Any]
) -> None:
    device = params[0].device
    scale, found = options["grad_scale"], options["found_inf"]
    torch._fused_sgd_(
        params,
        grads,
        bufs if options["momentum"] != 0 else [],
        weight_decay=options["weight_decay"],
        momentum=options["momentum"],
        lr=options["lr"],
        dampening=options["dampening"],
        nesterov=options["nesterov"],
        maximize=options["maximize"],
        is_first_step=options["is_first_step"],
        grad_scale=None if scale is None else scale.to(device),
        found_inf=None if found is None else found.to(device),
    )


def _whole(items: list[_Item], options: dict[str, Any]) -> None:
    """Whole tensors, per slice of at most :data:`WIDEN_ELEMENTS` widened elements (one
    larger tensor alone): one widening copy, one call, one refresh per device."""
    from .master_adam import WIDEN_ELEMENTS  # (master_adam imports master_sgd, which imports this module)

    start, widened = 0, 0
    for index, item in enumerate(items):
        size = item.param.numel() if item.grad.dtype != item.param.dtype else 0
        if widened and widened + size > WIDEN_ELEMENTS:
            _whole_slice(items[start:index], options)
            start, widened = index, 0
        widened += size
    _whole_slice(items[start:], options)


def _whole_slice(items: list[_Item], options: dict[str, Any]) -> None:
    by_device: dict[torch.device, list[_Item]] = {}
    for item in items:
        by_device.setdefault(item.param.device, []).append(item)
    for part in by_device.values():
        narrow = [item for item in part if item.grad.dtype != item.param.dtype]
        narrow_grads = [item.grad for item in narrow]
        if narrow:
            wide = [torch.empty_like(item.grad, dtype=item.param.dtype) for item in narrow]
            torch._foreach_copy_(wide, [item.grad for item in narrow])
            for item, tensor in zip(narrow, wide, strict=True):
                item.grad = tensor
        _call(part, options)
        refreshed = [item for item in part if item.low is not None]
        if refreshed:
            torch._foreach_copy_([item.low for item in refreshed], [item.param for item in refreshed])  # type: ignore[misc]
        for item, grad in zip(narrow, narrow_grads, strict=True):
            item.grad = grad  # the widened copy goes with the slice


def _chunked(items: list[_Item], options: dict[str, Any], chunk: int) -> None:
    """Chunk by chunk (see the module docstring); a tensor whose layout is not flat and
    contiguous goes whole, from a widened copy."""
    call = _Call(chunk)
    for item in items:
        tensors = [t for t in (item.param, item.grad, item.low, item.buf) if t is not None]
        if not all(t.is_contiguous() for t in tensors):
            _whole_slice([item], options)
            continue
        target = None
        if item.buf is None and options["momentum"] and not options["fused"]:
            # torch's first step clones the (chunk of the) float32 gradient: the state's
            # buffer, in the gradient's layout, receives those chunks
            target = torch.empty_like(item.grad, dtype=item.param.dtype)
            item.target = target
        flat = [None if t is None else t.view(-1) for t in (item.param, item.grad, item.low, item.buf, target)]
        for begin in range(0, max(item.param.numel(), 1), chunk):
            end = min(begin + chunk, item.param.numel())
            views = [None if t is None else t[begin:end] for t in flat]
            _queue(call, _Item(*views), options)  # type: ignore[arg-type]
    _flush(call, options)
    for item in items:
        if item.target is not None:
            item.buf = item.target


def _queue(call: _Call, item: _Item, options: dict[str, Any]) -> None:
    size = item.param.numel()
    if call.used + size > call.chunk:
        _flush(call, options)
    if item.grad.dtype != item.param.dtype:
        scratch = call.scratch
        if scratch is None or scratch.dtype != item.param.dtype or scratch.device != item.param.device:
            _flush(call, options)
            scratch = call.scratch = torch.empty(call.chunk, dtype=item.param.dtype, device=item.param.device)
        item.grad = scratch[call.used : call.used + size].copy_(item.grad)
    elif call.items and call.items[0].param.device != item.param.device:
        _flush(call, options)
    call.used += size
    call.items.append(item)


def _flush(call: _Call, options: dict[str, Any]) -> None:
    if call.items:
        _call(call.items, options)
        refreshed = [item for item in call.items if item.low is not None]
        if refreshed:
            torch._foreach_copy_([item.low for item in refreshed], [item.param for item in refreshed])  # type: ignore[misc]
    call.used = 0
    call.items.clear()
