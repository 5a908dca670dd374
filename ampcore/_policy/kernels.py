"""The Python executor of the policy decisions (:mod:`ampcore._policy.decisions`, taken
once per policy): one Python kernel per operator overload on one dispatch key, and the
action table of the steps that carry the decisions out.

The compiled executor (:mod:`ampcore._policy.compiled`, ``policy_kernel.cpp``) carries out the
same decisions in C++; :mod:`ampcore._policy.executor` chooses which one a process runs.

A kernel serves every device type routed to its key (a :class:`KeyTable` lists them as
:class:`Client`\\ s; :mod:`ampcore._policy.registration` decides the routes).  On each call it
finds the client whose tensors the call is on and whose autocast is on, then reads the calling
thread's policy for that device type (:mod:`ampcore._policy.thread_state`):

* no client, or no policy: the call continues below the kernel's key, exactly as if the
  kernel were not there (to the device's own autocast kernel, if it has one).  A client
  that *provides* autocast for a device without kernels of its own applies the backend's
  O1 lists instead;
* a policy: the step of the op's :class:`~ampcore._policy.decisions.Decision` under that
  policy, decided once per (kernel, policy), then carried out: ``FOLLOW``, ``PASS``,
  ``THROUGH`` and ``DESCEND`` inline (the decisions module says what each means); a cast
  action by :data:`ACTION_TABLE`, which casts the arguments here, above autograd, so
  autograd records the casts and gradients come back in the inputs' dtypes (leaf float32
  tensors that require grad are cast once per region, torch's ``cached_cast`` rule, in the
  thread's region cache), then calls the op below the autocast keys with autocast excluded,
  as torch does.  CompositeImplicitAutograd ops under a policy with custom lists are
  instead decomposed with autocast on and the policy's *inner* policy in force, so that
  custom-listed ops inside them are reached.

Python numbers in Tensor slots are repaired (:func:`ampcore._policy.casting.wrap_numbers`)
before the call goes on, and by a casting step after its casts: numbers are never cast.
``FOLLOW`` and ``PASS`` run inline in the kernel: they are most calls of a region, and each
function call there costs per op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

import torch

from .casting import _NUMBERS, cast_all, eligible, explicit_dtype, set_opt_dtype, widest, wrap_numbers
from .decisions import Decision, OverloadSpec, Plan, decide, needs_kernel, plan
from .fused import check_swallowed
from .key_tables import Client, KeyTable, all_autocast_keys
from .lists import Action
from .thread_state import thread_state

__all__ = [
    "ACTION_TABLE", "Choose", "Decision", "OverloadSpec", "Plan", "as_step", "decide", "decided_step", "kernel",
    "needs_kernel", "plan",
]  # fmt: skip

_FLOAT32: Final = torch.float32


# -- the action table: (kernel, key set below autocast, args, kwargs, policy, client) -> result


class _Kernel:
    """One kernel's fixed parts, as the action table's entries see them."""

    __slots__ = ("call_op", "exclude", "key", "redispatch", "spec")

    def __init__(self, spec: OverloadSpec, table: KeyTable) -> None:
        self.spec = spec
        self.call_op = spec.op._op  # the C++ callable behind OpOverload.__call__
        self.redispatch = spec.op._handle.redispatch_boxed
        self.key = table.key  # the table's key (excluded while the op runs, or it would come back)
        self.exclude = all_autocast_keys()  # excluded while the op runs (KEEP, fp32_append_dtype)


KeySet = torch._C.DispatchKeySet
Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Called = tuple[Args, Kwargs]  # a call's arguments after casting
#: one entry of the action table: (kernel, key set below autocast, args, kwargs, policy, client) -> result
Step = Callable[[_Kernel, KeySet, Args, Kwargs, Any, Client], Any]
_guard: Final = torch._C._ExcludeDispatchKeyGuard
_set_excluded: Final = torch._C._dispatch_tls_set_dispatch_key_excluded
_state: Final = thread_state()
_autocast_dtype: Final = torch.get_autocast_dtype


def _keep(k: _Kernel, below: KeySet, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Any:
    with _guard(k.exclude):
        return k.call_op(*args, **kwargs)


def _banned(k: _Kernel, below: KeySet, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Any:
    raise RuntimeError(k.spec.banned)


def _casting(
    cast: Callable[[_Kernel, Args, Kwargs, Any, Client], Called],
) -> Step:
    """A step that casts the arguments with ``cast``, then runs the op (or decomposes it)."""

    def step(k: _Kernel, below: KeySet, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Any:
        # torch's kernel excludes its device's autocast key while it casts and calls the op;
        # this kernel's own key goes too, or the casts would come back here.  Two flag calls
        # in nested try blocks (half the cost of a guard object); both keys were included,
        # or the dispatcher would not have come here with a policy
        own, device = k.key, client.key
        try:
            _set_excluded(own, True)
            try:
                _set_excluded(device, True)
                args, kwargs = cast(k, args, kwargs, policy, client)
                if k.spec.slots:  # numbers are never cast: wrapped after the casts, as torch's are
                    args, kwargs = wrap_numbers(args, kwargs, k.spec.slots, k.spec.slot_names)
                if not (policy.reach and k.spec.composite):
                    return k.redispatch(below, *args, **kwargs)  # below autocast, as torch calls it
            finally:
                _set_excluded(device, False)
        finally:
            _set_excluded(own, False)
        return _decompose(k, below, args, kwargs, policy, client)

    return step


def _decompose(k: _Kernel, below: KeySet, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Any:
    """Run a composite with autocast on and the inner policy, so custom-listed ops inside are reached."""
    if k.spec.swallows:
        check_swallowed(k.spec.name, policy, args, kwargs)
    device_type = client.device_type
    _state.set_policy(device_type, policy.inner or policy)  # an inner policy is its own inner
    try:
        return k.redispatch(below, *args, **kwargs)
    finally:
        _state.set_policy(device_type, policy)


def _to_low(k: _Kernel, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Called:
    # torch's current autocast dtype: the region's, or a nested torch.autocast's
    cache = _state.cast_cache if policy.cache else None
    return cast_all(args, kwargs, _autocast_dtype(client.device_type), client.on_device, cache, k.spec.tensor_positions)


def _to_fp32(k: _Kernel, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Called:
    return cast_all(args, kwargs, _FLOAT32, client.on_device, None, k.spec.tensor_positions)


def _to_widest(k: _Kernel, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Called:
    dtype = widest(args, kwargs, client.on_device)
    if dtype is None:
        return args, kwargs
    return cast_all(args, kwargs, dtype, client.on_device, None, k.spec.tensor_positions)


def _set_fp32_dtype(k: _Kernel, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Called:
    return set_opt_dtype(args, kwargs, k.spec.dtype_arg, client.on_device)


def _append_fp32_dtype(k: _Kernel, below: KeySet, args: Args, kwargs: Kwargs, policy: Any, client: Client) -> Any:
    if k.spec.append_to is None:  # not one of torch's fp32_append_dtype overloads: run as called
        return _as_called(k, below, args, kwargs, policy, client)
    first = args[0]
    positional = [a for a in k.spec.op._schema.arguments if not a.kwarg_only]
    completed = args + tuple(a.default_value for a in positional[len(args) :])  # the schema's defaults
    dtype = _FLOAT32 if eligible(first, client.on_device) else first.dtype
    with _guard(k.exclude):
        return k.spec.append_to(*completed, dtype=dtype, **kwargs)


_as_called: Final = _casting(lambda k, args, kwargs, policy, client: (args, kwargs))

#: Plan -> the step that carries it out (FOLLOW and PASS run inline in the kernel).
ACTION_TABLE: Final[Mapping[str, Step]] = {
    Plan.KEEP: _keep,
    Action.BANNED: _banned,
    Action.LOW: _casting(_to_low),
    Action.FP32: _casting(_to_fp32),
    Action.PROMOTE: _casting(_to_widest),
    Action.FP32_SET_OPT_DTYPE: _casting(_set_fp32_dtype),
    Action.FP32_APPEND_DTYPE: _append_fp32_dtype,
}
#: The steps that cast (they wrap Python numbers after casting: numbers are never cast).
_CASTING_STEPS: Final = frozenset(
    ACTION_TABLE[a] for a in (Action.LOW, Action.FP32, Action.PROMOTE, Action.FP32_SET_OPT_DTYPE)
)


def as_step(decided: str) -> Any:
    """A plan as the kernel keeps it: its function in :data:`ACTION_TABLE`, or the ``FOLLOW`` /
    ``PASS`` marker the kernel handles inline (no table lookup per call)."""
    return ACTION_TABLE.get(decided, decided)


class Choose(NamedTuple):
    """``CHOOSE`` as a kernel keeps it: KEEP when the call passes a dtype, else ``otherwise``
    (the step of the op's level when called without one, decided once)."""

    otherwise: Any


def decided_step(spec: OverloadSpec, policy: Any, client: Client) -> Any:
    """The step a Python kernel keeps for ``policy`` (see :func:`as_step` and :class:`Choose`)."""
    decision = decide(spec, policy, client)
    step = as_step(decision.step)
    return Choose(step) if decision.choose else step


def kernel(table: KeyTable, overload: str) -> Callable[..., Any]:
    """The policy kernel of one overload on ``table``'s key."""
    spec = OverloadSpec.of(overload)
    k = _Kernel(spec, table)
    slots, slot_names = spec.slots, spec.slot_names
    redispatch, own_key = k.redispatch, k.key
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
    get_dtype = torch.get_autocast_dtype
    tf_mode_enabled = torch._C._is_torch_function_mode_enabled
    steps: dict[Any, Any] = {}  # policy -> its step (policies live as long as their lists)
    follow, passing, descend, keep = Action.FOLLOW, Plan.PASS, Plan.DESCEND, ACTION_TABLE[Plan.KEEP]
    through = Plan.THROUGH

    def call(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
        clients, after, below = table.state[1].get(keyset.raw_repr()) or table.routed(keyset)
        policy = client = None
        for client in clients:  # the call's device type, if its autocast is on (see KeyTable)
            if not excluded(client.key):
                policy = _state.policies.get(client.device_type)
                if policy is None and client.provider is not None:
                    policy = client.provider(get_dtype(client.device_type))
                break
        step: Any = None
        if policy is not None:
            step = steps.get(policy)
            if step is None:
                step = steps[policy] = decided_step(spec, policy, client)  # type: ignore[arg-type]
            if type(step) is Choose:  # an explicit dtype= is kept; otherwise as the op's level says
                step = keep if explicit_dtype(args, kwargs, spec.dtype_arg) else step.otherwise
        if slots and step not in _CASTING_STEPS:  # a casting step wraps numbers after its casts
            for i in slots:  # Python numbers arrive where torch had wrapped-number tensors
                if i < len(args) and type(args[i]) in _NUMBERS:
                    args, kwargs = wrap_numbers(args, kwargs, slots, slot_names)
                    break
            else:
                if kwargs and slot_names.intersection(kwargs):
                    args, kwargs = wrap_numbers(args, kwargs, slots, slot_names)
        if policy is None or step is through:  # as the dispatcher does without a kernel here
            return redispatch(after, *args, **kwargs)
        if step is passing or step is follow:
            # this key off (a flag, not a guard object: half the cost): torch's kernel (PASS)
            # excludes only its own key, and a kernel's internals (FOLLOW) get the device's lists
            try:
                _set_excluded(own_key, True)
                return redispatch(after if step is passing else below, *args, **kwargs)
            finally:
                _set_excluded(own_key, False)
        if step is descend:  # a composite decomposed below: its inner ops must reach their kernels
            return redispatch(below, *args, **kwargs)
        if tf_mode_enabled():  # TorchFunctionModes must not see this kernel's own tensor calls
            with torch._C.DisableTorchFunction():
                return step(k, below, args, kwargs, policy, client)
        return step(k, below, args, kwargs, policy, client)

    call.__name__ = call.__qualname__ = f"ampcore_{table.key_name}_{overload.replace('.', '_')}"
    return call
