"""What a policy kernel does with its op under one policy: the action table's entries,
decided once per (kernel, policy) and read by both executors (the Python one,
:mod:`ampcore._policy.kernels`, and the compiled one, :mod:`ampcore._policy.compiled`).

:class:`OverloadSpec` is what a kernel knows about its overload, read once from the schema;
:func:`plan` gives the :class:`Plan` of the op under a policy, :func:`decide` the
:class:`Decision` an executor keeps:

* ``FOLLOW`` (an op on no list at O1): the call goes on below autocast, untouched; a
  non-composite op with this kernel's key excluded, so that the ops its kernel calls
  internally (a bfloat16 ``mean``'s upcasts) get the device's own lists without a Python
  round trip each, while a composite's inner ops still reach their kernels (``DESCEND``),
  except inside a composite of ops levels never cast under a policy without custom lists
  (``batch_norm``: :data:`~ampcore._op_names.SEALED_COMPOSITES`);
* ``PASS`` (the policy does what the device's own, torch's, C++ kernel does): the call goes
  on to that kernel, with this kernel's key excluded so the op it calls does not come back;
* ``THROUGH`` (on a shadow key, ``FOLLOW``/``DESCEND`` of an op without an autocast kernel
  of the device): on below this key as if the kernel were not there.  Both are what the
  dispatcher does without a kernel, so an overload gets one only when a policy decides
  anything else (:func:`needs_kernel`): ops a region does not change never enter it;
* a cast action (``LOW``, ``FP32``, ``PROMOTE``...): the executor casts the arguments
  (:data:`ampcore._policy.kernels.ACTION_TABLE`) and calls the op below autocast;
* ``CHOOSE`` (an op on no list that takes a ``dtype``): ``KEEP`` when the call passes one,
  else as the op's level says, decided per call.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import torch

from .._op_names import SEALED_COMPOSITES, generated_overloads, is_composite
from .fused import SWALLOWING
from .key_tables import Client
from .lists import PROMOTE, Action
from .promotion import promotes_natively
from .torch_tables import APPEND_DTYPE_OVERLOADS, BANNED_MESSAGES

__all__ = ["Decision", "OverloadSpec", "Plan", "decide", "needs_kernel", "plan", "unlisted"]


class Plan(str, enum.Enum):
    """What a kernel does with a call under one policy: an :class:`~ampcore._policy.lists.Action`,
    or one of the kernel's own steps below."""

    PASS = "pass"  #: the device's own autocast kernel does exactly the policy's action
    THROUGH = "through"  #: as if the kernel were not there (no cast below it, none by the policy)
    DESCEND = "descend"  #: a composite on no list: decomposed below with this key on, its inner ops reach it
    CHOOSE = "choose"  #: on no list: KEEP when the call passes a dtype, else as without one
    KEEP = "keep"  #: run the op as called, with autocast off (an explicit dtype= at OD/O2)

    def __str__(self) -> str:
        return str(self.value)


@functools.cache
def _level_overloads() -> frozenset[str]:
    return frozenset(generated_overloads())


def _op(overload: str) -> torch._ops.OpOverload:
    base, _, name = overload.partition(".")
    return getattr(getattr(torch.ops.aten, base), name or "default")  # type: ignore[no-any-return]


@dataclass(frozen=True)
class OverloadSpec:
    """What a kernel needs to know about its overload, read once from the schema."""

    name: str
    op: torch._ops.OpOverload
    composite: bool  # CompositeImplicitAutograd: made of other ops
    sealed: frozenset[str]  # the ops a composite of ops levels never cast calls (_op_names.SEALED_COMPOSITES)
    level_casts: bool  # levels OD/O2 cast it when it is on no list
    swallows: bool  # a fused kernel of it may swallow custom-listed ops
    dtype_arg: tuple[int, bool] | None  # (position, keyword-only) of its ``dtype`` argument
    append_to: torch._ops.OpOverload | None  # the overload fp32_append_dtype redispatches to
    banned: str  # the error a banned call raises
    slots: tuple[int, ...]  # positions of single-Tensor arguments (numbers may arrive there)
    slot_names: frozenset[str]  # their names
    tensor_positions: tuple[int, ...]  # positional arguments that may hold tensors (Tensor, Tensor?, Tensor[]...)
    promotes: bool  # reconciles mixed floating inputs as the promote step would (promotion.py)

    @classmethod
    def of(cls, overload: str) -> OverloadSpec:
        op = _op(overload)
        arguments = op._schema.arguments
        single = [i for i, a in enumerate(arguments) if str(a.type) == "Tensor"]
        return cls(
            name=overload,
            op=op,
            composite=is_composite(overload),
            sealed=SEALED_COMPOSITES.get(overload.partition(".")[0], frozenset()),
            level_casts=overload in _level_overloads(),
            swallows=overload in SWALLOWING,
            dtype_arg=next(((i, a.kwarg_only) for i, a in enumerate(arguments) if a.name == "dtype"), None),
            append_to=_op(APPEND_DTYPE_OVERLOADS[overload]) if overload in APPEND_DTYPE_OVERLOADS else None,
            banned=BANNED_MESSAGES.get(overload.partition(".")[0], f"{overload} is banned under autocast"),
            slots=tuple(i for i in single if not arguments[i].kwarg_only),
            slot_names=frozenset(arguments[i].name for i in single),
            tensor_positions=tuple(i for i, a in enumerate(arguments) if "Tensor" in str(a.type) and not a.kwarg_only),
            promotes=promotes_natively(overload, op._schema),
        )


def plan(spec: OverloadSpec, policy: Any, client: Client) -> str:
    """What the kernel of ``spec`` does under ``policy`` (cached per kernel and policy)."""
    action = policy.actions.get(spec.name)
    if action is None:  # an op on no list
        if not spec.level_casts:
            return Action.FOLLOW  # levels never cast it (a copy, a check, an optimizer op...)
        if spec.dtype_arg is not None:
            return Plan.CHOOSE  # the caller may choose the dtype: decided per call
        return unlisted(spec, policy)
    if spec.composite and policy.reach:
        return Action(action)  # decomposed here, so that custom-listed ops inside are reached
    if client.native.get(spec.name) == action:
        return Plan.PASS  # torch's C++ kernel below does the same, without the Python round trip
    return Action(action)


def unlisted(spec: OverloadSpec, policy: Any) -> str:
    """The action of a castable op on no list, called without a dtype: FOLLOW for a composite
    (its inner ops get the policy) and, under promote, for an op that reconciles its inputs
    itself (promotion.py)."""
    if spec.composite or (policy.default == PROMOTE and spec.promotes):
        return Action.FOLLOW
    return Action(policy.default)


class Decision(NamedTuple):
    """The action table's entry of one op under one policy, read by both executors: ``step``
    (a :class:`Plan` or :class:`~ampcore._policy.lists.Action`; never ``CHOOSE``), and
    whether a call passing a dtype is kept as called instead (``choose``)."""

    step: str
    choose: bool


def decide(spec: OverloadSpec, policy: Any, client: Client) -> Decision:
    """What the kernel of ``spec`` does under ``policy`` for ``client`` (decided once per policy)."""
    decided = plan(spec, policy, client)
    if decided is Plan.CHOOSE:
        return Decision(_descend(spec, policy, unlisted(spec, policy)), True)
    step = _descend(spec, policy, decided)
    if step in _UNCAST and client.provider is None and spec.name not in client.own:
        # on a shadow key, for an op the device has no autocast kernel for, going on below
        # the key (to autocast's fallthrough) is the dispatcher's own path: no kernel needed
        return Decision(Plan.THROUGH, False)
    return Decision(step, False)


_UNCAST: Final = frozenset({Action.FOLLOW, Plan.DESCEND})  #: steps that cast nothing


def needs_kernel(spec: OverloadSpec, policy: Any, client: Client) -> bool:
    """Whether ``policy`` needs a kernel for ``spec`` on ``client``'s key: any decision but an
    unconditional ``PASS`` or ``THROUGH`` (what the dispatcher does without one, at no cost)."""
    decision = decide(spec, policy, client)
    return decision.choose or decision.step not in (Plan.PASS, Plan.THROUGH)


def _descend(spec: OverloadSpec, policy: Any, decided: str) -> str:
    """``FOLLOW`` of a composite: ``DESCEND``, so that its inner ops reach their kernels,
    unless nothing inside can act (a sealed composite under a policy without custom lists
    whose lists name none of the ops it calls)."""
    if decided is not Action.FOLLOW or not spec.composite:
        return decided
    if spec.sealed and not policy.reach and not any(o.partition(".")[0] in spec.sealed for o in policy.actions):
        return decided
    return Plan.DESCEND
