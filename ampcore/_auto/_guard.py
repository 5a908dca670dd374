"""The guard of a root's program (:mod:`._program`): what a later call must share with the
recorded one to run its program, and what makes a program stale.

* :func:`signature`: grad mode, the root's eval mode, every tensor's shape, dtype and device
  among the call's arguments (also inside lists, tuples, dicts and dataclasses) and the
  values of its other arguments; ``None`` for an argument it cannot see (the plan then
  applies call by call);
* :func:`unseen_modules`: the root's planned modules the recording did not see called
  (another path of its control flow): the program guards them;
* :func:`snapshot` / :func:`unchanged`: the root's module tree and its planned layers'
  weight dtypes when recorded, compared on every root call with C calls only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import torch
from torch import nn

from ._shapes import float32_weights, planned_ops

__all__ = ["signature", "snapshot", "unchanged", "unseen_modules"]

_F32: Final = torch.float32


def signature(
    args: tuple[Any, ...], kwargs: dict[str, Any] | None, root: nn.Module | None = None
) -> tuple[Any, ...] | None:
    """The guard of a root's program: grad mode, then (shape, dtype, device) of every tensor
    among the call's positional and keyword arguments, also inside lists, tuples, dicts and
    dataclasses, and the other arguments' values (``None``, numbers, strings, dtypes,
    devices: a flag that picks a path or a size is part of the guard), and ``"eval"`` when
    ``root`` is not training.  ``None``: an argument of another kind (an object whose state
    the guard cannot see): the call cannot have a program and the plan applies call by call.

    Example::

        >>> import torch
        >>> sig = signature((torch.zeros(2, 3), None), {"flag": True})
        >>> sig[1], sig[2][2], sig[3:]
        ((torch.Size([2, 3]), torch.float32, device(type='cpu')), None, (('kw', 'flag'), ('=', <class 'bool'>, True)))
        >>> signature((object(),), None) is None
        True
    """
    sig: list[Any] = [torch.is_grad_enabled()]
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((a.shape, a.dtype, a.device))
        elif not _describe(a, sig):
            return None
    if kwargs:
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                sig.append((k, v.shape, v.dtype, v.device))
            else:
                sig.append(("kw", k))
                if not _describe(v, sig):
                    return None
    if root is not None and not root.training:
        sig.append("eval")
    return tuple(sig)


#: arguments the guard holds by value (hashable, immutable)
_SCALARS: Final = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _describe(value: Any, sig: list[Any]) -> bool:
    """Append what the guard needs of a non-tensor argument to ``sig`` (False: it cannot be
    guarded).  Entries other than tensors' never hold a dtype second from the end."""
    if isinstance(value, torch.Tensor):
        sig.append((value.shape, value.dtype, value.device))
    elif isinstance(value, _SCALARS):
        sig.append(("=", type(value), value))
    elif isinstance(value, (list, tuple)):
        sig.append(("(", type(value), len(value)))
        return all(_describe(v, sig) for v in value)
    elif isinstance(value, dict):
        sig.append(("{", type(value), len(value)))
        for k, v in value.items():
            if not isinstance(k, _SCALARS):
                return False
            sig.append(("key", type(k), k))
            if not _describe(v, sig):
                return False
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        sig.append(("dataclass", type(value), len(fields)))
        return all(_describe(getattr(value, f.name), sig) for f in fields)
    else:
        return False
    return True


def unseen_modules(root: nn.Module, calls: dict[int, Any]) -> list[nn.Module]:
    """The planned modules of ``root`` not in ``calls`` (none inside another planned module:
    ``MultiheadAttention`` runs its ``out_proj`` functionally)."""
    planned = [m for m in root.modules() if planned_ops(m) is not None]
    inside = {id(c) for m in planned for c in m.modules() if c is not m}
    return [m for m in planned if id(m) not in calls and id(m) not in inside]


def snapshot(
    root: nn.Module, planned: list[nn.Module]
) -> tuple[tuple[dict[str, Any], ...], list[tuple[Any, ...]], tuple[torch.Tensor, ...]]:
    """The ``_modules`` dicts of ``root``'s modules that have children, their values now, and
    the first floating-point parameter of each ``planned`` module whose weights are float32."""
    tree = tuple(d for m in root.modules() if (d := m._modules))
    firsts = (next((p for p in m.parameters() if p.is_floating_point()), None) for m in planned if float32_weights(m))
    weights = tuple(p for p in firsts if p is not None)  # one a module: a conversion converts them all
    return tree, list(map(tuple, map(dict.values, tree))), weights


def unchanged(
    tree: tuple[dict[str, Any], ...], values: list[tuple[Any, ...]], weights: tuple[torch.Tensor, ...]
) -> bool:
    """Whether :func:`snapshot`'s modules are still in place and its weights still float32
    (it runs on every root call: plain loops, which cost less than ``map`` chains for the
    few dicts and weights of a model, and stop at the first change)."""
    for weight in weights:
        if weight.dtype is not _F32:  # dtypes are singletons
            return False
    for modules, was in zip(tree, values, strict=True):
        if tuple(modules.values()) != was:
            return False
    return True
