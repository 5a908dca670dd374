"""Planned kinds found by what a module does, not by its class.

``nn.Linear``, the convolutions and ``nn.MultiheadAttention`` are planned by their type
(:data:`~._shapes.PLANNED_OPS`).  A leaf module of another class holding a floating-point
matrix among its own parameters (``transformers``' ``Conv1D``: weight ``[in, out]``,
forward ``torch.addmm(bias, x.view(-1, in), weight)``) is *watched* at its first call in
an enabled ``level="auto"`` region: a dispatch mode (:class:`Watch`, for that one call)
notes the ATen ops its forward runs.  A forward that runs exactly one matrix product
(``addmm``, ``mm``, ``bmm``, ``baddbmm``) with its own matrix, besides views and casts
(autocast's) and the addition of its own parameters (a bias), makes the class planned as
``Linear`` is (:data:`~._shapes.MATMUL`: its shape class names its parameters' shapes);
anything else leaves it to the O1 lists, as before.  The decision holds for the class (the
planner asks one dictionary lookup per call, by type), or, where the watched instance has
flags (:func:`~._shapes.flags`: public attributes holding a bool, which may
change what its forward runs), for its class and those flags: an instance with other
flags is watched at its own first call (:data:`~._shapes.VARIES`).

The watched call itself runs with the O1 lists; the plan's programs record again (a
planned kind is new to them) and the class's calls are measured from the next one on, as
any new shape class.
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ._shapes import MATMUL, set_kind

__all__ = ["Watch", "candidate", "watched"]

#: the products a planned matmul kind runs with its own weight
_PRODUCTS: Final = frozenset({"addmm", "mm", "bmm", "baddbmm"})
#: ops that neither compute nor count: a cast (autocast's ``_to_copy``), a copy, a view
#: torch does not mark as one
_PASS: Final = frozenset({"_to_copy", "clone", "_unsafe_view", "detach", "alias", "lift_fresh"})
_ADDS: Final = frozenset({"add", "add_"})


def candidate(module: nn.Module) -> bool:
    """Whether ``module``'s class may be a matmul kind: a leaf (no child modules) with a
    floating-point matrix among its own parameters."""
    if module._modules:
        return False
    return any(p is not None and p.is_floating_point() and p.dim() == 2 for p in module._parameters.values())


class Watch(TorchDispatchMode):
    """The ATen ops of one call of ``module``: how many products took its own matrix (or
    one derived from it by a view or a cast), and whether any other op computed."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.module = module
        params = [p for p in module._parameters.values() if p is not None and p.is_floating_point()]
        self.own: dict[int, torch.Tensor] = {id(p): p for p in params}  # and tensors derived from them
        self.weights: dict[int, torch.Tensor] = {id(p): p for p in params if p.dim() == 2}
        #: the matrices' shapes, also transposed: autocast's weight cache may hand a cast copy made before
        self.shapes = {tuple(p.shape) for p in self.weights.values()}
        self.shapes |= {s[::-1] for s in self.shapes}
        self.products = 0
        self.other = False
        self.plan: Any = None  # the plan of the region it was met in (its programs record again)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
        tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        if getattr(func, "is_view", False) or name in _PASS:
            if isinstance(out, torch.Tensor) and any(id(t) in self.own for t in tensors):
                self.own[id(out)] = out  # kept alive: its id stays its own while watched
                if any(id(t) in self.weights for t in tensors):
                    self.weights[id(out)] = out
        elif name in _PRODUCTS and any(self._weight(t) for t in tensors):
            self.products += 1
        elif not (name in _ADDS and any(id(t) in self.own for t in tensors)):
            self.other = True  # another computation: not a plain product
        return out

    def _weight(self, t: torch.Tensor) -> bool:
        return id(t) in self.weights or (t.dim() == 2 and tuple(t.shape) in self.shapes)

    def matmul(self) -> bool:
        """Whether the call was one product with the module's own matrix and nothing else."""
        return self.products == 1 and not self.other


def watched(watch: Watch, ok: bool) -> bool:
    """Close ``watch`` after its call (``ok``: the forward returned) and set its class's kind;
    True: the class is now planned (:data:`~._shapes.MATMUL`).  A call that raised decides
    nothing (its class is watched again at its next call)."""
    try:
        watch.__exit__(None, None, None)  # type: ignore[no-untyped-call]
    except Exception:  # an inner mode left on the stack (an exception): drop ours with it
        pass
    if not ok:
        return False
    planned = watch.matmul()
    set_kind(type(watch.module), MATMUL if planned else None, watch.module)
    return planned
