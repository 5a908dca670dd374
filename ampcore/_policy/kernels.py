"""Policy kernels: one Python kernel per operator overload on one dispatch key.

A kernel serves every device type routed to its key (a :class:`KeyTable` lists them as
:class:`Client`\\ s; :mod:`ampcore._policy.registration` decides the routes).  On each call it finds
the client whose tensors the call is on and whose autocast is on, then reads the calling thread's policy
for that device type (:mod:`ampcore._policy.thread_state`):

* no client, or no policy: the call continues below the kernel's key, exactly as if the
  kernel were not there (to the device's own autocast kernel, if it has one).  A client
  that *provides* autocast for a device without kernels of its own applies the backend's
  O1 lists instead;
* a policy: the op's action.  Casts happen here, above autograd, so autograd records them
  and gradients come back in the inputs' dtypes.  Leaf float32 tensors that require grad
  are cast to low precision once per region (torch's ``cached_cast`` rule), in a
  thread-local cache cleared when the thread's outermost ampcore region exits.

After casting, the op is called below the autocast keys with autocast excluded (as torch
does), except for CompositeImplicitAutograd ops under a policy with custom lists: those are
decomposed with autocast on and the policy's *inner* policy in force, so that custom-listed
ops inside them are reached.

Python numbers: torch hands a Python kernel the wrapped-number tensors of a call
(``x % 2`` reaches ``remainder.Tensor``) as Python numbers, which most overloads then refuse.
The kernel turns them back into 0-dim tensors of the dtype torch's type promotion gives the
call, so every overload computes what torch's own kernel computes.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from .._errors import AmpcoreError
from .fused import SWALLOWING, check_swallowed
from .torch_tables import APPEND_DTYPE_OVERLOADS, AUTOCAST_DISPATCH_KEYS, BANNED_MESSAGES, DEFAULT_DISPATCH_KEY
from .op_names import generated_overloads, is_composite
from .lists import ACTIONS, BANNED, FOLLOW, FP32, FP32_APPEND_DTYPE, FP32_SET_OPT_DTYPE, LOW, PROMOTE
from .thread_state import thread_state

__all__ = ["KEEP", "Client", "KeyTable", "dispatch_key", "kernel"]

_FLOAT64: Final = torch.float64
_FLOAT32: Final = torch.float32
_Tensor: Final = torch.Tensor
_NUMBERS: Final = frozenset({bool, int, float, complex})
#: Internal action: run the op as called, with autocast off (an explicit dtype= at OD/O2).
KEEP: Final = "keep"
_SEQUENCES: Final = frozenset({list, tuple})
#: the fastest cast torch offers per common dtype (its argument parser is skipped)
_CONVERT: Final[dict[torch.dtype, Callable[[torch.Tensor], torch.Tensor]]] = {
    torch.bfloat16: torch.Tensor.bfloat16,
    torch.float16: torch.Tensor.half,
    torch.float32: torch.Tensor.float,
}


def dispatch_key(name: str) -> torch._C.DispatchKey:
    """The dispatch key called ``name``; AmpcoreError when this torch has none."""
    key = torch._C._parse_dispatch_key(name)
    if key is None:
        raise AmpcoreError(f"this torch has no dispatch key {name}; ampcore cannot give this device type op policies")
    return key


@functools.cache
def all_autocast_keys() -> torch._C.DispatchKeySet:
    """Every autocast key of this torch (excluded while a policy kernel calls the op)."""
    result = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    for name in (DEFAULT_DISPATCH_KEY, *AUTOCAST_DISPATCH_KEYS.values()):
        key = torch._C._parse_dispatch_key(name)
        if key is not None:
            result = result | torch._C.DispatchKeySet(key)
    return result


@dataclass(frozen=True)
class Client:
    """A device type whose policy kernels live on a :class:`KeyTable`'s key.

    ``provider`` (resident clients: the kernels sit on the device's own autocast key) gives
    the policy of the backend's O1 lists for an autocast dtype, applied when no region of
    ampcore is active.
    """

    device_type: str
    key: torch._C.DispatchKey  # its autocast key (excluded while its autocast is off)
    backend: torch._C.DispatchKey  # its backend key (in the key set of a call on its tensors)
    eligible: Callable[[torch.Tensor], bool]
    provider: Callable[[torch.dtype], Any] | None = None
    #: overload -> the action the device's own (torch's) autocast kernel takes: a policy
    #: that agrees passes the call on to it instead of casting in Python
    native: Mapping[str, str] = field(default_factory=dict)


class KeyTable:
    """The kernels registered on one dispatch key and the device types they serve."""

    def __init__(self, key_name: str) -> None:
        self.key_name = key_name
        key = dispatch_key(key_name)
        #: this key alone
        self.own = torch._C.DispatchKeySet(key)
        #: every key below this one: the call as if this kernel were not there
        self.passthrough = torch._C._dispatch_keyset_full_after(key)
        #: the same without any autocast key: below autocast
        self.below = self.passthrough - all_autocast_keys()
        #: replaced (never mutated) when a device type is routed here, so a kernel reads a
        #: consistent tuple without a lock
        self.clients: tuple[Client, ...] = ()


#: torch's castable dtypes: every floating dtype but float64 (a set: one lookup per tensor)
_CASTABLE: Final = frozenset(
    d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point and d is not _FLOAT64
)


def eligibility(device_type: str, attr: str | None) -> Callable[[torch.Tensor], bool]:
    """torch's ``is_eligible``: a floating tensor of the device type, not float64."""
    if attr is not None and hasattr(torch.Tensor, attr):
        on_device = operator.attrgetter(attr)

        def eligible(t: torch.Tensor) -> bool:
            return t.dtype in _CASTABLE and on_device(t)

    else:

        def eligible(t: torch.Tensor) -> bool:
            return t.dtype in _CASTABLE and t.device.type == device_type

    return eligible


def _cast_tensor(t: torch.Tensor, to: torch.dtype, cache: dict[tuple[int, torch.dtype], Any] | None) -> torch.Tensor:
    # torch's cached_cast: leaf float32 weights are cast once per region (low precision only)
    if (
        cache is not None
        and t.dtype is _FLOAT32
        and t.requires_grad
        and t.is_leaf
        and type(t) in (torch.Tensor, torch.nn.Parameter)
        and not t._is_view()
    ):
        key = (id(t), to)
        hit = cache.get(key)
        if hit is not None and hit[0]() is t:
            return hit[1]  # type: ignore[no-any-return]
        casted = t.to(dtype=to)  # by keyword: torch parses it faster
        cache[key] = (weakref.ref(t), casted)
        return casted
    return t.to(dtype=to)


def _cast_value(value: Any, to: torch.dtype, eligible: Callable[[torch.Tensor], bool], cache: Any) -> Any:
    if isinstance(value, _Tensor):
        if value.dtype is not to and eligible(value):
            return _cast_tensor(value, to, cache)
        return value
    if type(value) in _SEQUENCES and any(isinstance(v, _Tensor) for v in value):
        return [_cast_value(v, to, eligible, cache) for v in value]
    return value


def _cast_all(
    args: tuple[Any, ...], kwargs: dict[str, Any], to: torch.dtype, eligible: Callable[[torch.Tensor], bool], cache: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    casted: list[Any] | None = None  # copied on the first change: most calls change nothing
    for i, value in enumerate(args):
        if isinstance(value, _Tensor):
            if value.dtype is to or not eligible(value):
                continue
            # only weights (leaves that require grad) are cached: skip the call for the rest
            if cache is not None and value.requires_grad:
                new = _cast_tensor(value, to, cache)
            else:
                new = _CONVERT[to](value) if to in _CONVERT else value.to(dtype=to)
        elif type(value) in _SEQUENCES:
            new = _cast_value(value, to, eligible, cache)
        else:
            continue
        if casted is None:
            casted = list(args)
        casted[i] = new
    if kwargs:
        kwargs = {k: _cast_value(v, to, eligible, cache) for k, v in kwargs.items()}
    return (args if casted is None else tuple(casted)), kwargs


def _tensors(values: Any) -> Any:
    for value in values:
        if isinstance(value, _Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, _Tensor))


def _widest(args: tuple[Any, ...], kwargs: dict[str, Any], eligible: Callable[[torch.Tensor], bool]) -> torch.dtype | None:
    """torch's ``promote_type``: the widest dtype among the eligible inputs (None: none).

    torch raises on a third floating dtype (float16 inputs under bfloat16 autocast); ampcore
    promotes them as ``torch.promote_types`` does (to float32).
    """
    widest = None
    for t in _tensors((*args, *kwargs.values())):
        if eligible(t):
            dtype = t.dtype
            widest = dtype if widest is None or widest is dtype else torch.promote_types(widest, dtype)
    return widest


def _wrap_numbers(args: tuple[Any, ...], kwargs: dict[str, Any], slots: tuple[int, ...], names: frozenset[str]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Python numbers in Tensor slots -> 0-dim tensors promoting as torch's wrapped numbers do."""
    in_args = any(i < len(args) and type(args[i]) in _NUMBERS for i in slots)
    in_kwargs = bool(kwargs) and any(type(kwargs.get(n)) in _NUMBERS for n in names)
    if not (in_args or in_kwargs):
        return args, kwargs  # the common case: nothing to wrap, nothing else computed
    tensors = list(_tensors((*args, *kwargs.values())))
    # the operand that decides the result dtype: a dimensioned one beats 0-dim ones
    reference = next((t for t in tensors if t.dim()), tensors[0] if tensors else None)

    def tensor(value: Any) -> torch.Tensor:
        # a CPU scalar joins tensors of any device, as a wrapped number does
        dtype = torch.result_type(reference, value) if reference is not None else None
        return torch.scalar_tensor(value, dtype=dtype)

    if in_args:
        args = tuple(tensor(a) if i in slots and type(a) in _NUMBERS else a for i, a in enumerate(args))
    if in_kwargs:
        kwargs = {k: tensor(v) if k in names and type(v) in _NUMBERS else v for k, v in kwargs.items()}
    return args, kwargs


# -- kernels ----------------------------------------------------------------------------


@functools.cache
def _level_overloads() -> frozenset[str]:
    return frozenset(generated_overloads())


def _op(overload: str) -> torch._ops.OpOverload:
    base, _, name = overload.partition(".")
    return getattr(getattr(torch.ops.aten, base), name or "default")  # type: ignore[no-any-return]


def _defaults(op: torch._ops.OpOverload, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` completed with the schema's defaults for omitted positional arguments."""
    positional = [a for a in op._schema.arguments if not a.kwarg_only]
    return args + tuple(a.default_value for a in positional[len(args) :])


def _tensor_slots(op: torch._ops.OpOverload) -> tuple[tuple[int, ...], frozenset[str]]:
    """Positions and keyword names of the single-Tensor arguments (where numbers may arrive)."""
    arguments = op._schema.arguments
    single = [i for i, a in enumerate(arguments) if str(a.type) == "Tensor"]
    return tuple(i for i in single if not arguments[i].kwarg_only), frozenset(arguments[i].name for i in single)


#: Internal plans (beside the actions of :mod:`ampcore._policy.lists`): what a kernel does with a
#: call under one policy, decided once per (kernel, policy).
_PASS: Final = "pass"  # the device's own autocast kernel does exactly the policy's action
_CHOOSE: Final = "choose"  # on no list: KEEP when the call passes a dtype, else as without one
#: each action as the one string object the kernels compare with ``is``
_CANONICAL: Final[Mapping[str, str]] = {action: action for action in (*ACTIONS, KEEP, _PASS, _CHOOSE)}


def _plan(policy: Any, client: Client, overload: str, composite: bool, level_casts: bool, dtype_arg: Any) -> str:
    """What the kernel of ``overload`` does under ``policy`` (cached by the kernel)."""
    action = policy.actions.get(overload)
    if action is None:  # an op on no list
        if not level_casts:
            return FOLLOW  # levels never cast it (a copy, a check, an optimizer op...)
        if dtype_arg is not None:
            return _CHOOSE  # the caller may choose the dtype: decided per call
        return _unlisted(policy, composite)
    if composite and policy.reach:
        return _CANONICAL[action]  # decomposed here, so that custom-listed ops inside are reached
    if client.native.get(overload) == action:
        return _PASS  # torch's C++ kernel below does the same, without the Python round trip
    return _CANONICAL[action]


def _unlisted(policy: Any, composite: bool) -> str:
    """The action of a castable op on no list, called without a dtype."""
    return FOLLOW if composite else _CANONICAL[policy.default]  # a composite's inner ops get the policy


def kernel(table: KeyTable, overload: str) -> Callable[..., Any]:
    """The policy kernel of one overload on ``table``'s key."""
    op = _op(overload)
    composite = is_composite(overload)
    level_casts = overload in _level_overloads()
    swallows = overload in SWALLOWING
    dtype_arg = next(((i, a.kwarg_only) for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)
    append_to = _op(APPEND_DTYPE_OVERLOADS[overload]) if overload in APPEND_DTYPE_OVERLOADS else None
    banned = BANNED_MESSAGES.get(overload.partition(".")[0], f"{overload} is banned under autocast")
    slots, slot_names = _tensor_slots(op)
    state = thread_state()
    get_dtype = torch.get_autocast_dtype
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
    cache_enabled = torch.is_autocast_cache_enabled
    exclude = all_autocast_keys()
    guard = torch._C._ExcludeDispatchKeyGuard
    no_torch_function = torch._C.DisableTorchFunction
    tf_mode_enabled = torch._C._is_torch_function_mode_enabled
    call_op = op._op  # the C++ callable behind OpOverload.__call__
    redispatch = op._handle.redispatch_boxed
    plans: dict[Any, str] = {}  # policy -> plan (policies live as long as their lists)
    passthrough, below, own = table.passthrough, table.below, table.own

    def call(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
        policy = client = None
        for client in table.clients:
            # a call on the device's tensors with its autocast on (the autocast key itself is
            # left out of the key set of ops it has no kernel for, so it cannot tell)
            if keyset.has(client.backend) and not excluded(client.key):
                policy = state.policies.get(client.device_type)
                if policy is None and client.provider is not None:
                    policy = client.provider(get_dtype(client.device_type))
                break
        if slots:
            for i in slots:  # Python numbers arrive where torch had wrapped-number tensors
                if i < len(args) and type(args[i]) in _NUMBERS:
                    args, kwargs = _wrap_numbers(args, kwargs, slots, slot_names)
                    break
            else:
                if kwargs and slot_names.intersection(kwargs):
                    args, kwargs = _wrap_numbers(args, kwargs, slots, slot_names)
        if policy is None:
            return redispatch(keyset & passthrough, *args, **kwargs)
        plan = plans.get(policy)
        if plan is None:
            plan = plans[policy] = _plan(policy, client, overload, composite, level_casts, dtype_arg)
        if plan is _PASS:
            # the device's kernel excludes only its own key while it calls the op: this
            # key must be off too, or the op would come back here
            with guard(own):
                return redispatch(keyset & passthrough, *args, **kwargs)
        if plan is FOLLOW:
            return redispatch(keyset & below, *args, **kwargs)
        if plan is _CHOOSE:
            plan = KEEP if _explicit_dtype(args, kwargs, dtype_arg) else _unlisted(policy, composite)
            if plan is FOLLOW:
                return redispatch(keyset & below, *args, **kwargs)
        if tf_mode_enabled():
            # torch's kernels are C++: TorchFunctionModes (ampcore's compile guard among
            # them) must not see this kernel's own tensor calls
            with no_torch_function():
                return body(keyset, args, kwargs, plan, policy, client)
        return body(keyset, args, kwargs, plan, policy, client)

    def body(keyset: torch._C.DispatchKeySet, args: tuple[Any, ...], kwargs: dict[str, Any], action: str, policy: Any, client: Any) -> Any:
        if action is KEEP:
            with guard(exclude):
                return call_op(*args, **kwargs)
        if action is BANNED:
            raise RuntimeError(banned)
        eligible = client.eligible
        device_type = client.device_type
        with guard(exclude):
            if action is LOW:
                # torch's current autocast dtype: the region's, or a nested torch.autocast's
                cache = state.cast_cache if policy.cache and cache_enabled() else None
                args, kwargs = _cast_all(args, kwargs, get_dtype(device_type), eligible, cache)
            elif action is FP32:
                args, kwargs = _cast_all(args, kwargs, _FLOAT32, eligible, None)
            elif action is PROMOTE:
                widest = _widest(args, kwargs, eligible)
                if widest is not None:
                    args, kwargs = _cast_all(args, kwargs, widest, eligible, None)
            elif action is FP32_SET_OPT_DTYPE:
                args, kwargs = _set_opt_dtype(args, kwargs, dtype_arg, eligible)
            elif action is FP32_APPEND_DTYPE and append_to is not None:
                first = args[0]
                return append_to(*_defaults(op, args), dtype=_FLOAT32 if eligible(first) else first.dtype, **kwargs)
            if not (composite and policy.reach):
                # autocast excluded, as torch's kernels call the op
                return redispatch(keyset & below, *args, **kwargs)
        # decompose with autocast on, so that custom-listed ops inside are reached
        if swallows:
            check_swallowed(overload, policy, args, kwargs)
        state.policies[device_type] = policy.inner or policy  # an inner policy is its own inner
        try:
            return redispatch(keyset & below, *args, **kwargs)
        finally:
            state.policies[device_type] = policy

    call.__name__ = call.__qualname__ = f"ampcore_{table.key_name}_{overload.replace('.', '_')}"
    return call


def _explicit_dtype(args: tuple[Any, ...], kwargs: dict[str, Any], dtype_arg: tuple[int, bool] | None) -> bool:
    """Whether the call passes a ``dtype`` (output dtype) argument."""
    if dtype_arg is None:
        return False
    index, kwarg_only = dtype_arg
    if not kwarg_only and len(args) > index:
        return args[index] is not None
    return kwargs.get("dtype") is not None


def _set_opt_dtype(
    args: tuple[Any, ...], kwargs: dict[str, Any], dtype_arg: tuple[int, bool] | None, eligible: Callable[[torch.Tensor], bool]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """torch's ``fp32_set_opt_dtype``: ``dtype=float32`` unless the caller gave a dtype."""
    if dtype_arg is None or not args or not isinstance(args[0], _Tensor) or not eligible(args[0]):
        return args, kwargs
    index, kwarg_only = dtype_arg
    if not kwarg_only and len(args) > index:
        if args[index] is None:
            args = (*args[:index], _FLOAT32, *args[index + 1 :])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": _FLOAT32}
    return args, kwargs
