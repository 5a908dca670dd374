"""Policy kernels: one Python kernel per operator overload on an autocast dispatch key.

A kernel reads the calling thread's policy for its device type (:mod:`ampcore._state`):

* none (plain ``torch.autocast``, or an uncustomised ampcore O1 region in this thread): it
  does what torch's own kernel does: the op's native policy from
  :mod:`ampcore._oplist_data`, or nothing for ops torch has no kernel for (the kernel then
  passes the call on, as torch's fallthrough does).  The weight-cast cache is not used.
* a policy: the op's action.  Casts happen here, above autograd, so autograd records them
  and gradients come back in the inputs' dtypes.  Leaf float32 tensors that require grad
  are cast to low precision once per region (torch's ``cached_cast`` rule), in a
  thread-local cache cleared when the thread's outermost ampcore region exits.

After casting, the op is redispatched below the autocast keys with autocast excluded (as
torch does), except for CompositeImplicitAutograd ops under a policy with custom lists:
those are decomposed with autocast on and the policy's *inner* policy in force, so that
custom-listed ops inside them are reached (see :mod:`ampcore._dispatch`).
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable
from typing import Any, Final

import torch

from ._errors import AmpcoreError
from ._oplist_names import is_composite
from ._oplist_data import (
    APPEND_DTYPE_OVERLOADS,
    AUTOCAST_DISPATCH_KEYS,
    BANNED_MESSAGES,
    DEFAULT_DISPATCH_KEY,
    TENSOR_DEVICE_CHECKS,
    dispatch_key_of,
    native_table,
)
from ._oplists import BANNED, FOLLOW, FP32, FP32_APPEND_DTYPE, FP32_SET_OPT_DTYPE, LOW, PROMOTE, native_action
from ._state import thread_state

__all__ = ["kernel"]

_FLOAT64: Final = torch.float64
_FLOAT32: Final = torch.float32
_Tensor: Final = torch.Tensor
_NUMBERS: Final = frozenset({bool, int, float, complex})
#: Internal action: run the op as called, with autocast off (an explicit dtype= at OD/O2).
KEEP: Final = "keep"
_SEQUENCES: Final = frozenset({list, tuple})


def _key(name: str) -> torch._C.DispatchKey | None:
    return torch._C._parse_dispatch_key(name)


@functools.cache
def _all_autocast_keys() -> torch._C.DispatchKeySet:
    keys = [_key(name) for name in (DEFAULT_DISPATCH_KEY, *AUTOCAST_DISPATCH_KEYS.values())]
    result = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    for key in keys:
        if key is not None:
            result = result | torch._C.DispatchKeySet(key)
    return result


@functools.cache
def _after(key_name: str) -> torch._C.DispatchKeySet:
    """Every key below ``key_name``, without any autocast key (the redispatch set)."""
    key = _key(key_name)
    if key is None:
        raise AmpcoreError(f"this torch has no dispatch key {key_name}; ampcore cannot customise its autocast lists")
    return torch._C._dispatch_keyset_full_after(key) - _all_autocast_keys()


def _eligibility(device_type: str) -> Callable[[torch.Tensor], bool]:
    """torch's ``is_eligible``: a floating tensor of the device type, not float64."""
    attr = TENSOR_DEVICE_CHECKS.get(device_type)
    if attr is not None and hasattr(torch.Tensor, attr):
        on_device = operator.attrgetter(attr)

        def eligible(t: torch.Tensor) -> bool:
            return t.is_floating_point() and t.dtype is not _FLOAT64 and on_device(t)

    else:

        def eligible(t: torch.Tensor) -> bool:
            return t.is_floating_point() and t.dtype is not _FLOAT64 and t.device.type == device_type

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
        casted = t.to(to)
        cache[key] = (weakref.ref(t), casted)
        return casted
    return t.to(to)


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
    casted = [_cast_value(a, to, eligible, cache) for a in args]
    if kwargs:
        kwargs = {k: _cast_value(v, to, eligible, cache) for k, v in kwargs.items()}
    return tuple(casted), kwargs


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


# -- kernels ----------------------------------------------------------------------------


def _op(overload: str) -> torch._ops.OpOverload:
    base, _, name = overload.partition(".")
    return getattr(getattr(torch.ops.aten, base), name or "default")  # type: ignore[no-any-return]


def _defaults(op: torch._ops.OpOverload, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` completed with the schema's defaults for omitted positional arguments."""
    positional = [a for a in op._schema.arguments if not a.kwarg_only]
    return args + tuple(a.default_value for a in positional[len(args) :])


@functools.cache
def kernel(device_type: str, overload: str) -> Callable[..., Any]:
    """The policy kernel of one overload on the autocast key of ``device_type`` (cached)."""
    key_name = dispatch_key_of(device_type)
    op = _op(overload)
    after = _after(key_name)
    exclude = _all_autocast_keys()
    guard = torch._C._ExcludeDispatchKeyGuard
    eligible = _eligibility(device_type)
    native = native_action(native_table(device_type).get(overload))
    composite = is_composite(overload)
    dtype_arg = next(((i, a.kwarg_only) for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)
    append_to = _op(APPEND_DTYPE_OVERLOADS[overload]) if overload in APPEND_DTYPE_OVERLOADS else None
    banned = BANNED_MESSAGES.get(overload.partition(".")[0], f"{overload} is banned under autocast")
    state = thread_state()
    get_dtype = torch.get_autocast_dtype
    cache_enabled = torch.is_autocast_cache_enabled
    numbers_ok = torch._C._should_allow_numbers_as_tensors(overload.partition(".")[0])
    no_torch_function = torch._C.DisableTorchFunction
    tf_mode_enabled = torch._C._is_torch_function_mode_enabled
    call_op = op._op  # the C++ callable behind OpOverload.__call__
    redispatch = op._handle.redispatch_boxed

    def call(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
        if tf_mode_enabled():
            # torch's kernels are C++: TorchFunctionModes (ampcore's compile guard among
            # them) must not see this kernel's own tensor calls
            with no_torch_function():
                return body(keyset, args, kwargs)
        return body(keyset, args, kwargs)

    def body(keyset: torch._C.DispatchKeySet, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        policy = state.policies.get(device_type)
        if policy is None:
            action = native
        else:
            action = policy.actions.get(overload)
            if action is None:  # an op on no list
                if _explicit_dtype(args, kwargs, dtype_arg):
                    action = KEEP  # the caller chose the dtype: run the whole op as asked
                elif composite:
                    action = FOLLOW  # its inner ops get the policy
                else:
                    action = policy.default
        # Python numbers in Tensor slots (``x + 1.0``) only bind through a full call
        numbers = False
        if numbers_ok:
            for a in args:
                if type(a) in _NUMBERS:
                    numbers = True
                    break
        if action == FOLLOW:
            if numbers:
                with guard(exclude):
                    return call_op(*args, **kwargs)
            return redispatch(keyset & after, *args, **kwargs)  # as torch's fallthrough
        if action == KEEP:
            with guard(exclude):
                return call_op(*args, **kwargs)
        if action == BANNED:
            raise RuntimeError(banned)
        with guard(exclude):
            if action == LOW:
                # torch's current autocast dtype: the region's, or a nested torch.autocast's
                cache = state.cast_cache if policy is not None and cache_enabled() else None
                args, kwargs = _cast_all(args, kwargs, get_dtype(device_type), eligible, cache)
            elif action == FP32:
                args, kwargs = _cast_all(args, kwargs, _FLOAT32, eligible, None)
            elif action == PROMOTE:
                widest = _widest(args, kwargs, eligible)
                if widest is not None:
                    args, kwargs = _cast_all(args, kwargs, widest, eligible, None)
            elif action == FP32_SET_OPT_DTYPE:
                args, kwargs = _set_opt_dtype(args, kwargs, dtype_arg, eligible)
            elif action == FP32_APPEND_DTYPE and append_to is not None:
                first = args[0]
                return append_to(*_defaults(op, args), dtype=_FLOAT32 if eligible(first) else first.dtype, **kwargs)
            if policy is None or not (composite and policy.reach) or numbers:
                return call_op(*args, **kwargs)  # autocast excluded, as torch's kernels call the op
        # decompose with autocast on, so that custom-listed ops inside are reached
        state.policies[device_type] = policy.inner
        try:
            return redispatch(keyset & after, *args, **kwargs)
        finally:
            state.policies[device_type] = policy

    call.__name__ = call.__qualname__ = f"ampcore_{key_name}_{overload.replace('.', '_')}"
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


