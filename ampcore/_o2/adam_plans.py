"""What ampcore's whole-tensor Adam/AdamW master update keeps between steps (issue 26).

On a model of many small parameters the update's own Python is a visible share of the step
(docs/performance.md, issue 26, fourth stop): per parameter, a gradient lookup, a state
lookup, a float32 buffer for its widened gradient; per group, the flavour torch's ``adam()``
would choose.  Between two steps almost none of that changes, so a :class:`GroupPlan` keeps,
per param group, what follows from its parameters alone: which of them are masters (and
their low-precision parameters), whether one is complex, the foreach default of torch's
``adam()`` for them, and float32 scratch tensors for the widened gradients.  Each step then
runs a few list operations per group, one ``_foreach_copy_`` to widen into the scratch, one
call of torch's Adam and one ``_foreach_copy_`` to refresh the low-precision parameters:
the calls the walk of ``master_adam.py`` makes, on the same tensors.

What is never kept, because it may change between steps without ampcore seeing it: the
gradients (and which parameters have one, and their dtypes), the optimizer's state (read
from ``optimizer.state`` at every step: ``load_state_dict``, a cleared or replaced state),
the hyperparameters (an LR scheduler changes ``lr``), GradScaler's tensors.

A plan holds while its group is the same object (``load_state_dict`` makes new ones;
``add_param_group`` adds one), its ``"params"`` list holds the same tensors (by identity) and
each of them has the shape, dtype and device it had (a master's ``.data`` replaced); else it
is made again.  The scratch is float32 copies of the masters' gradients, kept between steps:
at most :data:`SCRATCH_ELEMENTS` elements per optimizer (4 MiB), and only for groups whose
widened gradients are within the walk's slice bound; other groups take the walk of
``master_adam.py``, as do steps that need what a plan does not do (a parameter without state
yet, a sparse gradient, a low-precision gradient on a parameter without master).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any, Final, cast

import torch

from .adam_call import call_adam, check_tensor_lr, default_foreach, flavour, scaler_tensors

__all__ = ["SCRATCH_ELEMENTS", "AdamPlans", "GroupPlan"]

#: The float32 scratch one optimizer keeps for widened gradients between steps (elements).
SCRATCH_ELEMENTS: Final = 1 << 20

_META: Final = operator.attrgetter("shape", "dtype", "device")
_GRAD: Final = operator.attrgetter("grad")
_DTYPE: Final = operator.attrgetter("dtype")
_SPARSE: Final = operator.attrgetter("is_sparse")


@dataclass(eq=False)
class GroupPlan:
    """What one param group's update keeps between steps (see the module docstring)."""

    #: the param group and the tensors its ``"params"`` held when the plan was made
    group: dict[str, Any]
    params: list[torch.Tensor]
    #: each parameter's low-precision model parameter (None: a float32 parameter updated whole)
    lows: list[torch.Tensor | None]
    #: each parameter's (shape, dtype, device) when the plan was made
    meta: list[tuple[Any, ...]]
    dtypes: list[torch.dtype]
    has_complex: bool
    #: torch's foreach default for any of these parameters, or None where it depends on which
    #: (parameters of several devices or tensor types)
    foreach_default: bool | None
    #: elements of the parameters with a low-precision parameter (the scratch it needs)
    elements: int
    #: whether every parameter has a low-precision parameter
    all_low: bool
    #: per parameter, the float32 tensor its low-precision gradient is widened into (None:
    #: no master); made at the first step that widens, if the optimizer's budget allows
    scratch: list[torch.Tensor | None] | None = None

    @classmethod
    def make(cls, group: dict[str, Any], params: list[torch.Tensor], low_of: Any) -> GroupPlan:
        lows = [low_of.get(param) for param in params]
        kinds = {(type(param), param.device.type) for param in params}
        return cls(
            group=group,
            params=list(params),
            lows=lows,
            meta=list(map(_META, params)),
            dtypes=list(map(_DTYPE, params)),
            has_complex=any(torch.is_complex(param) for param in params),
            foreach_default=default_foreach(params) if len(kinds) == 1 else None,
            elements=sum(param.numel() for param, low in zip(params, lows, strict=True) if low is not None),
            all_low=all(low is not None for low in lows),
        )

    def holds(self, group: dict[str, Any], params: list[torch.Tensor]) -> bool:
        """Whether the plan is still the group's (same group, same tensors, same metadata)."""
        mine = self.params
        return (
            self.group is group
            and len(params) == len(mine)
            and all(map(operator.is_, params, mine))
            and list(map(_META, params)) == self.meta
        )


class AdamPlans:
    """The :class:`GroupPlan` of each param group of one optimizer with master weights,
    and the whole-tensor update that runs from them (``low_of``: master -> its
    low-precision parameter)."""

    def __init__(self, low_of: Any) -> None:
        self.low_of = low_of
        self._plans: list[GroupPlan | None] = []

    def keep(self, groups: int) -> None:
        """Forget the plans of param groups past the first ``groups`` (removed ones)."""
        del self._plans[groups:]

    def plan(self, index: int, group: dict[str, Any]) -> GroupPlan:
        """The plan of ``group``, the ``index``-th param group: kept, or made again."""
        params: list[torch.Tensor] = dict.__getitem__(group, "params")  # no gradient sync
        plans = self._plans
        found = plans[index] if index < len(plans) else None
        if found is not None and found.holds(group, params):
            return found
        plans.extend([None] * (index + 1 - len(plans)))
        plans[index] = found = GroupPlan.make(group, params, self.low_of)
        return found

    def update(
        self, adam: Any, optimizer: torch.optim.Optimizer, index: int, group: dict[str, Any], widen_limit: int
    ) -> list[torch.Tensor] | None:
        """torch's Adam on the ``index``-th param group from its plan, the low-precision
        gradients widened into the plan's scratch (at most ``widen_limit`` elements) and
        the low-precision parameters refreshed: the calls of ``master_adam``'s whole-tensor
        walk.  Returns the float32 parameters without master it updated, or None where the
        plan does not do this step (nothing done: the caller walks the group)."""
        plan = self.plan(index, group)
        if plan.elements > widen_limit or (plan.scratch is None and not self._room_for(plan)):
            return None  # (before any work: a large group walks as before)
        grads = [
            g if g is not None or low is None else low.grad
            for g, low in zip(map(_GRAD, plan.params), plan.lows, strict=True)
        ]
        chosen = _Chosen.of(plan, grads)
        if not chosen.params:
            return []
        found = list(map(optimizer.state.get, chosen.params))  # (no entry made for a missing one)
        if not all(found) or any(map(_SPARSE, chosen.grads)):
            return None
        states = cast(list[dict[str, Any]], found)
        wide = self._widened(plan, chosen)
        if wide is None:
            return None
        options_now = dict(group)  # (a plain dict: its lookups sync no gradients; read at every step)
        check_tensor_lr(options_now)
        options = flavour(options_now, chosen.params, scaler_tensors(optimizer), plan.foreach_default)
        call_adam(adam, options, options_now, chosen.params, wide, states, None if plan.has_complex else False)
        lows, masters = chosen.refreshed()
        if lows:
            torch._foreach_copy_(lows, masters)
        return [param for param, low in zip(chosen.params, chosen.lows, strict=True) if low is None]

    def _widened(self, plan: GroupPlan, chosen: _Chosen) -> list[torch.Tensor] | None:
        """The step's gradients, the low-precision ones widened into the scratch (one
        multi-tensor copy); None where that cannot be done from the plan."""
        flags = list(map(operator.ne, map(_DTYPE, chosen.grads), chosen.dtypes))
        if not any(flags):
            return chosen.grads
        scratch = chosen.scratch(_scratch(plan))
        some = list(compress(scratch, flags))
        if not all(map(operator.is_not, some, repeat(None))):  # a low-precision gradient without master
            return None
        targets = cast(list[torch.Tensor], some)
        if all(flags):
            torch._foreach_copy_(targets, chosen.grads)
            return targets
        torch._foreach_copy_(targets, list(compress(chosen.grads, flags)))
        return [wide if flag else grad for grad, wide, flag in zip(chosen.grads, scratch, flags, strict=True)]  # type: ignore[misc]

    def _room_for(self, plan: GroupPlan) -> bool:
        """Whether the optimizer's scratch budget has room for ``plan``'s scratch."""
        held = sum(p.elements for p in self._plans if p is not None and p.scratch is not None)
        return held + plan.elements <= SCRATCH_ELEMENTS


def _scratch(plan: GroupPlan) -> list[torch.Tensor | None]:
    """The plan's scratch (made at the first step that widens)."""
    if plan.scratch is None:
        pairs = zip(plan.params, plan.lows, strict=True)
        plan.scratch = [None if low is None else torch.empty_like(param) for param, low in pairs]
    return plan.scratch


@dataclass
class _Chosen:
    """The parameters of one step's update: the plan's, less those without a gradient."""

    plan: GroupPlan
    #: which of the plan's parameters (None: all)
    keep: list[bool] | None
    params: list[torch.Tensor]
    grads: list[torch.Tensor]
    lows: list[torch.Tensor | None]
    dtypes: list[torch.dtype]

    @classmethod
    def of(cls, plan: GroupPlan, grads: list[torch.Tensor | None]) -> _Chosen:
        keep = [grad is not None for grad in grads]
        if all(keep):
            return cls(plan, None, plan.params, grads, plan.lows, plan.dtypes)  # type: ignore[arg-type]
        return cls(
            plan,
            keep,
            list(compress(plan.params, keep)),
            list(compress(grads, keep)),  # type: ignore[arg-type]
            list(compress(plan.lows, keep)),
            list(compress(plan.dtypes, keep)),
        )

    def scratch(self, scratch: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        return scratch if self.keep is None else list(compress(scratch, self.keep))

    def refreshed(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The low-precision parameters to refresh and their masters."""
        if self.plan.all_low:
            return self.lows, self.params  # type: ignore[return-value]
        pairs = [(low, param) for low, param in zip(self.lows, self.params, strict=True) if low is not None]
        return [low for low, _ in pairs], [param for _, param in pairs]
