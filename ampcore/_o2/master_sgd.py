"""A one-pass master-weight update for momentum-free ``torch.optim.SGD``.

The generic master-weight step gives every master a float32 copy of its low-precision
gradient, lets the optimizer update the fp32 masters and then refreshes the low-precision
model parameters from them.  For plain SGD (no momentum) ampcore does the update itself and
reads the low-precision gradient directly: no float32 gradient copy exists.

How it walks the parameters is the backend's choice (``BackendSpec.master_update_chunk_elements``):

* whole tensors (``None``, GPU-like devices): every parameter of a param group in a few
  ``_foreach_`` calls (the gradient read once, the master read and written, the parameter
  written), none per chunk.  A list mixing float32 masters and low-precision gradients
  takes no multi-tensor fast path, so on a GPU torch runs those calls tensor by tensor:
  O(tensors) launches, as many as torch's own single-tensor SGD;
* chunks (the CPU): a parameter larger than the chunk goes chunk by chunk, so that the
  master chunk just written is still in cache when the model parameter is refreshed from
  it: the gradient read once (2 bytes), the master read and written once (8) and the
  parameter written once (2): 12 bytes per parameter, the minimum.  Smaller parameters
  go together in ``_foreach_`` calls as above.

The arithmetic is torch's SGD (single-tensor and foreach run the same ops), in the same order
and in float32, so the results are bit-identical: ``d = -g if maximize else g``;
``d = d + weight_decay * master``; ``master -= lr * d`` (a bf16 ``g`` converts to float32
exactly).  Where a master already holds a float32 gradient (a copy made for GradScaler or
clipping, or the shared one of ``master_grad=True``) that gradient is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.optim import optimizer as _optim_module

from .master_sgd_torch import sgd_function, torch_group_update
from .onepass_loop import loop_ready, unscaled

__all__ = ["MASTER_BLIND_HOOKS", "fused_sgd_applies", "fused_sgd_update", "step_hooks_free"]


#: Global step pre-hooks of ampcore's own that return at once for an optimizer with master
#: weights (the no-optimizer watcher of :mod:`.no_optimizer`): they observe nothing that
#: ampcore's own update of such an optimizer skips, so they leave it on its fast path.
MASTER_BLIND_HOOKS: set[Any] = set()


def step_hooks_free(optimizer: torch.optim.Optimizer) -> bool:
    """Whether nothing observes ``optimizer``'s step from inside (no step pre/post hooks,
    global or its own, but :data:`MASTER_BLIND_HOOKS`); False on a torch that keeps its
    hooks elsewhere."""
    hooks = [
        getattr(optimizer, "_optimizer_step_pre_hooks", None),
        getattr(optimizer, "_optimizer_step_post_hooks", None),
        getattr(_optim_module, "_global_optimizer_post_hooks", None),
    ]
    global_pre = getattr(_optim_module, "_global_optimizer_pre_hooks", None)
    if global_pre is None or any(h is None or len(h) for h in hooks):
        return False
    return all(hook in MASTER_BLIND_HOOKS for hook in global_pre.values())


def fused_sgd_applies(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ampcore may run ``optimizer``'s step itself: exactly ``torch.optim.SGD`` (a
    subclass may change ``step``), nothing observes the step from inside (no step hooks),
    and every group is one that ampcore updates with torch's SGD (``fused=True``, or with
    momentum: ``master_sgd_torch.py``) or with its own ops (momentum-free, single-tensor or
    foreach), not differentiable, with float hyperparameters.  In the middle of a
    GradScaler step that hands the optimizer ``grad_scale``/``found_inf`` only if every
    group is fused (the kernel takes them; the other flavours refuse them)."""
    if type(optimizer) is not torch.optim.SGD or not step_hooks_free(optimizer):
        return False
    groups = optimizer.param_groups  # .get() does not trigger a gradient sync
    scaled = getattr(optimizer, "grad_scale", None) is not None or getattr(optimizer, "found_inf", None) is not None
    if scaled and not all(group.get("fused") for group in groups):
        return False
    if not all(_torch_group(group) or _own_group(group) for group in groups):
        return False
    # torch's for-loop and foreach SGD with momentum take sparse gradients, which the
    # chunked and widened walks do not: those steps keep the generic path
    return not any(group["momentum"] != 0 and not group["fused"] for group in groups) or not _sparse_grads(optimizer)


def _sparse_grads(optimizer: torch.optim.Optimizer) -> bool:
    from .master import master_weights_of  # (master imports this module)

    weights = master_weights_of(optimizer)
    pairs = [] if weights is None else weights.pairs
    return any(t is not None and t.is_sparse for pair in pairs for t in (pair.model.grad, pair.master.grad))


def _torch_group(group: Mapping[str, Any]) -> bool:
    """A group ampcore hands to torch's SGD (``master_sgd_torch.py``): fused, or with momentum."""
    keys = ("momentum", "dampening", "nesterov", "weight_decay", "maximize", "foreach", "fused", "differentiable")
    if not all(key in group for key in keys) or group["differentiable"] or sgd_function() is None:
        return False
    if isinstance(group["lr"], torch.Tensor) or isinstance(group["weight_decay"], torch.Tensor):
        return False
    return bool(group["fused"]) or group["momentum"] != 0


def _own_group(group: Mapping[str, Any]) -> bool:
    """A momentum-free group ampcore updates with its own ops (this module)."""
    return (
        group.get("momentum", 0) == 0
        and not group.get("fused")
        and not group.get("differentiable")
        and not isinstance(group.get("weight_decay"), torch.Tensor)
        and not (isinstance(group.get("lr"), torch.Tensor) and group["lr"].requires_grad)
    )


def fused_sgd_update(
    groups: Iterable[Mapping[str, Any]],
    low_of: Mapping[torch.Tensor, torch.Tensor],
    chunk: int | None,
    optimizer: torch.optim.Optimizer,
    onepass: bool = False,
    inv_scale: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Update every parameter with a gradient; for a master (a key of ``low_of``) read its
    own gradient if it has one, else the gradient of its low-precision parameter, and
    refresh that parameter.  Returns the parameters updated in place whose own ``.grad``
    was used (float32 parameters).

    ``fused=True`` groups and groups with momentum run torch's SGD
    (:func:`.master_sgd_torch.torch_group_update`, with ``optimizer``'s momentum buffers
    and GradScaler tensors; with ``onepass``, ``fused=True`` groups run the one-pass CPU
    kernel where it applies: ``onepass.py``).  With ``onepass``, the masters of the other
    groups run the one-pass kernel of torch's for-loop SGD where it applies
    (``onepass_loop.py``).  In the momentum-free others,
    parameters of up to ``chunk`` elements (all of them for ``chunk=None``) are updated
    together, a few ``_foreach_`` calls per group (:func:`_update_small`); larger ones
    chunk by chunk (:func:`_chunked`).  ``inv_scale``: the low-precision gradients are
    scaled by a GradScaler whose unscaling the update does (``scaled_update.py``): the
    one-pass kernel of the for-loop flavour multiplies by it, the other paths get them
    widened and unscaled first.
    """
    own: list[torch.Tensor] = []
    scratch: torch.Tensor | None = None
    with torch.no_grad():
        for group in groups:
            if group.get("fused") or group.get("momentum", 0) != 0:
                own.extend(torch_group_update(optimizer, group, low_of, chunk, onepass, inv_scale))
                continue
            lr = float(group["lr"])
            decay = float(group.get("weight_decay", 0.0))
            maximize = bool(group.get("maximize", False))
            params: list[torch.Tensor] = dict.__getitem__(group, "params")  # type: ignore[index]
            small = _Small()
            kernel = _OnePass(onepass and loop_ready(), lr, decay, maximize, inv_scale)
            for param in params:
                low = low_of.get(param)
                grad = param.grad if param.grad is not None or low is None else low.grad
                if grad is None:
                    continue
                if low is None:
                    own.append(param)
                if kernel.add(param, grad, low):
                    continue
                grad = unscaled(grad, param, inv_scale)
                if grad.is_sparse or (chunk is not None and param.numel() > chunk):
                    scratch = _update_large(param, grad, low, lr, decay, maximize, scratch, chunk)
                else:
                    small.add(param, grad, low)
            for param, grad, low in kernel.run():  # (those the kernel did not take)
                small.add(param, grad, low)
            _update_small(small, lr, decay, maximize)
    return own


class _OnePass:
    """The masters of a momentum-free group for the one-pass kernel of torch's for-loop SGD
    (``onepass_loop.py``: the same arithmetic as :func:`_update`, in one pass)."""

    def __init__(self, ready: bool, lr: float, decay: float, maximize: bool, inv_scale: torch.Tensor | None) -> None:
        self.ready = ready
        self.inv_scale = inv_scale
        self.options = {"lr": lr, "weight_decay": decay, "momentum": 0.0, "dampening": 0.0}
        self.options.update(nesterov=False, maximize=maximize)
        self.items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, param: torch.Tensor, grad: torch.Tensor, low: torch.Tensor | None) -> bool:
        """Queue a master with a low-precision gradient (False: not for the kernel)."""
        if not self.ready or low is None or grad.dtype == param.dtype or grad.is_sparse:
            return False
        self.items.append((param, grad, low))
        return True

    def run(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Update the queued masters; returns those the kernel did not take."""
        if not self.items:
            return []
        from .onepass_loop import sgd_update

        rest, _ = sgd_update(self.options, [(*item, None) for item in self.items], self.inv_scale)
        left = [self.items[index] for index in rest]
        return [(param, unscaled(grad, param, self.inv_scale), low) for param, grad, low in left]


def _update_large(
    param: torch.Tensor,
    grad: torch.Tensor,
    low: torch.Tensor | None,
    lr: float,
    decay: float,
    maximize: bool,
    scratch: torch.Tensor | None,
    chunk: int | None,
) -> torch.Tensor | None:
    """One large (or sparse-gradient) parameter; the master chunk by chunk through
    ``scratch`` (allocated on first use and returned for the next one)."""
    if low is None or grad.is_sparse or chunk is None:
        _update(param, grad, lr, decay, maximize, None)
        if low is not None:
            low.copy_(param)
        return scratch
    if scratch is None:
        scratch = torch.empty(chunk, dtype=param.dtype, device=param.device)
    _chunked(param, grad, low, lr, decay, maximize, scratch)
    return scratch


class _Small:
    """The parameters of one group updated together: masters (or float32 parameters), their
    gradients, and the low-precision parameters to refresh with their masters."""

    __slots__ = ("grads", "lows", "params", "refreshed")

    def __init__(self) -> None:
        self.params: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.lows: list[torch.Tensor] = []
        self.refreshed: list[torch.Tensor] = []

    def add(self, param: torch.Tensor, grad: torch.Tensor, low: torch.Tensor | None) -> None:
        self.params.append(param)
        self.grads.append(grad)
        if low is not None:
            self.lows.append(low)
            self.refreshed.append(param)


def _update_small(small: _Small, lr: float, decay: float, maximize: bool) -> None:
    """torch's single-tensor SGD on every parameter of ``small`` in ``_foreach_`` calls.

    A low-precision gradient enters the float32 arithmetic as it is: torch promotes it to
    float32 exactly, element by element, as ``grad.float()`` would.  The lists mix dtypes,
    so each ``_foreach_`` call runs torch's per-tensor op on every device (no fused
    multi-tensor kernel): the same results as the loop, with one Python call per step.
    """
    if not small.params:
        return
    steps = torch._foreach_neg(small.grads) if maximize else small.grads
    if decay != 0:
        steps = torch._foreach_add(steps, small.params, alpha=decay)
    torch._foreach_add_(small.params, steps, alpha=-lr)
    if small.lows:
        torch._foreach_copy_(small.lows, small.refreshed)


def _update(
    master: torch.Tensor, grad: torch.Tensor, lr: float, decay: float, maximize: bool, into: torch.Tensor | None
) -> None:
    """``master -= lr * (±grad + decay * master)``, torch's single-tensor SGD order."""
    step = grad.to(master.dtype) if into is None else into.copy_(grad)
    if maximize:
        step = step.neg_() if into is not None or step is not grad else -step
    if decay != 0:
        step = step.add(master, alpha=decay) if step is grad else step.add_(master, alpha=decay)
    master.add_(step, alpha=-lr)


def _chunked(
    master: torch.Tensor,
    grad: torch.Tensor,
    low: torch.Tensor,
    lr: float,
    decay: float,
    maximize: bool,
    scratch: torch.Tensor,
) -> None:
    if not (master.is_contiguous() and grad.is_contiguous() and low.is_contiguous()) or scratch.dtype != master.dtype:
        _update(master, grad, lr, decay, maximize, None)
        low.copy_(master)
        return
    flat_master, flat_grad, flat_low = master.view(-1), grad.view(-1), low.view(-1)
    total = flat_master.numel()
    size = scratch.numel()
    for start in range(0, total, size):
        stop = min(start + size, total)
        chunk = flat_master[start:stop]
        _update(chunk, flat_grad[start:stop], lr, decay, maximize, scratch[: stop - start])
        flat_low[start:stop].copy_(chunk)
