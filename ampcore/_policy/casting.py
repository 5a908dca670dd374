"""Casting the arguments of one op call, as torch's autocast kernels do (``cached_cast``,
``is_eligible``, ``promote_type``), and the Python-number repair every policy kernel needs.

Python numbers: torch hands a Python kernel the wrapped-number tensors of a call
(``x % 2`` reaches ``remainder.Tensor``) as Python numbers, which most overloads then refuse.
:func:`wrap_numbers` turns them back into 0-dim tensors of the dtype torch's type promotion
gives the call, so every overload computes what torch's own kernel computes.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch

__all__ = [
    "CastCache",
    "OnDevice",
    "cast_all",
    "device_check",
    "eligible",
    "explicit_dtype",
    "set_opt_dtype",
    "widest",
    "wrap_numbers",
]

_FLOAT64: Final = torch.float64
_FLOAT32: Final = torch.float32
_Tensor: Final = torch.Tensor
_NUMBERS: Final = frozenset({bool, int, float, complex})
_SEQUENCES: Final = frozenset({list, tuple})
_cache_enabled: Final = torch.is_autocast_cache_enabled
#: the fastest cast torch offers per common dtype (its argument parser is skipped)
_CONVERT: Final[dict[torch.dtype, Callable[[torch.Tensor], torch.Tensor]]] = {
    torch.bfloat16: torch.Tensor.bfloat16,
    torch.float16: torch.Tensor.half,
    torch.float32: torch.Tensor.float,
}

#: Whether a tensor is on the device type (with a castable dtype: :func:`eligible`).
OnDevice = Callable[[torch.Tensor], bool]
#: A region's weight-cast cache: (id of the weight, dtype) -> (weak ref to it, its cast).
CastCache = dict[tuple[int, torch.dtype], tuple["weakref.ref[torch.Tensor]", torch.Tensor]]

#: torch's castable dtypes: every floating dtype but float64 (a set: one lookup per tensor)
_CASTABLE: Final = frozenset(
    d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point and d is not _FLOAT64
)


def device_check(device_type: str, attr: str | None) -> OnDevice:
    """Whether a tensor is on ``device_type``: its boolean attribute ``attr`` when torch has it
    (``is_cpu``: a C getter, read per tensor on the hot path), else its device's type."""
    if attr is not None and hasattr(torch.Tensor, attr):
        return operator.attrgetter(attr)
    return lambda t: t.device.type == device_type


def eligible(t: torch.Tensor, on_device: OnDevice) -> bool:
    """torch's ``is_eligible``: a floating tensor of the device type, not float64."""
    return t.dtype in _CASTABLE and on_device(t)


def _cast_tensor(t: torch.Tensor, to: torch.dtype, cache: CastCache | None) -> torch.Tensor:
    # torch's cached_cast: leaf float32 weights are cast once per region (low precision only)
    if (
        cache is not None
        and t.dtype is _FLOAT32
        and t.requires_grad
        and t.is_leaf
        and type(t) in (torch.Tensor, torch.nn.Parameter)
        and not t._is_view()
        and _cache_enabled()  # torch.autocast(cache_enabled=False) may be nested inside
    ):
        key = (id(t), to)
        hit = cache.get(key)
        if hit is not None and hit[0]() is t:
            return hit[1]
        casted = t.to(dtype=to)  # by keyword: torch parses it faster
        cache[key] = (weakref.ref(t), casted)
        return casted
    return t.to(dtype=to)


def _cast_value(value: Any, to: torch.dtype, on_device: OnDevice, cache: CastCache | None) -> Any:
    if isinstance(value, _Tensor):
        dtype = value.dtype
        if dtype is not to and dtype in _CASTABLE and on_device(value):
            return _cast_tensor(value, to, cache)
        return value
    if type(value) in _SEQUENCES and any(isinstance(v, _Tensor) for v in value):
        return [_cast_value(v, to, on_device, cache) for v in value]
    return value


def cast_all(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    to: torch.dtype,
    on_device: OnDevice,
    cache: CastCache | None,
    positions: tuple[int, ...],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` with every eligible tensor (also inside a list or tuple; eligible: of
    a castable dtype and ``on_device``) cast to ``to``; weights through ``cache`` when given
    and torch's autocast cache is on (its ``cached_cast``).  ``positions`` (ascending): the
    only positional arguments that may hold tensors (the schema's)."""
    casted: list[Any] | None = None  # copied on the first change: most calls change nothing
    convert = _CONVERT.get(to)
    for i in positions:
        if i >= len(args):
            break
        value = args[i]
        if isinstance(value, _Tensor):
            dtype = value.dtype
            if dtype is to or dtype not in _CASTABLE or not on_device(value):
                continue
            # only weights (leaves that require grad) are cached: skip the call for the rest
            if cache is not None and value.requires_grad:
                new = _cast_tensor(value, to, cache)
            elif convert is not None:
                new = convert(value)
            else:
                new = value.to(dtype=to)
        elif type(value) in _SEQUENCES:
            new = _cast_value(value, to, on_device, cache)
        else:
            continue
        if casted is None:
            casted = list(args)
        casted[i] = new
    if kwargs:
        kwargs = {k: _cast_value(v, to, on_device, cache) for k, v in kwargs.items()}
    return (args if casted is None else tuple(casted)), kwargs


def _tensors(values: Any) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, _Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, _Tensor))


def widest(args: tuple[Any, ...], kwargs: dict[str, Any], on_device: OnDevice) -> torch.dtype | None:
    """torch's ``promote_type``: the widest dtype among the eligible inputs (None: none).

    torch raises on a third floating dtype (float16 inputs under bfloat16 autocast); ampcore
    promotes them as ``torch.promote_types`` does (to float32).
    """
    widest = None
    for t in _tensors((*args, *kwargs.values())):
        if eligible(t, on_device):
            dtype = t.dtype
            widest = dtype if widest is None or widest is dtype else torch.promote_types(widest, dtype)
    return widest


#: A number's own precision as a 0-dim tensor (never castable: not a low-precision float).
_EXACT: Final = {bool: torch.bool, int: torch.int64, float: torch.float64}


def wrap_numbers(
    args: tuple[Any, ...], kwargs: dict[str, Any], slots: tuple[int, ...], names: frozenset[str]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Python numbers in Tensor slots -> 0-dim tensors promoting as torch's wrapped numbers do.

    Where a dimensioned floating tensor decides the result dtype, a number keeps its own
    precision (``x * 0.1`` computes with 0.1, not with its bfloat16 rounding), as torch's
    wrapped numbers do; otherwise it takes the dtype torch's type promotion gives the call.
    Casting steps wrap numbers after their casts, so that a number is never cast.
    """
    in_args = any(i < len(args) and type(args[i]) in _NUMBERS for i in slots)
    in_kwargs = bool(kwargs) and any(type(kwargs.get(n)) in _NUMBERS for n in names)
    if not (in_args or in_kwargs):
        return args, kwargs  # the common case: nothing to wrap, nothing else computed
    tensors = list(_tensors((*args, *kwargs.values())))
    # the operand that decides the result dtype: a dimensioned one beats 0-dim ones
    reference = next((t for t in tensors if t.dim()), tensors[0] if tensors else None)

    decides = reference is not None and reference.dim() > 0 and reference.is_floating_point()

    def tensor(value: Any) -> torch.Tensor:
        # a CPU scalar joins tensors of any device, as a wrapped number does
        if decides and type(value) in _EXACT:
            return torch.scalar_tensor(value, dtype=_EXACT[type(value)])
        dtype = torch.result_type(reference, value) if reference is not None else None
        return torch.scalar_tensor(value, dtype=dtype)

    if in_args:
        args = tuple(tensor(a) if i in slots and type(a) in _NUMBERS else a for i, a in enumerate(args))
    if in_kwargs:
        kwargs = {k: tensor(v) if k in names and type(v) in _NUMBERS else v for k, v in kwargs.items()}
    return args, kwargs


def explicit_dtype(args: tuple[Any, ...], kwargs: dict[str, Any], dtype_arg: tuple[int, bool] | None) -> bool:
    """Whether the call passes a ``dtype`` (output dtype) argument."""
    if dtype_arg is None:
        return False
    index, kwarg_only = dtype_arg
    if not kwarg_only and len(args) > index:
        return args[index] is not None
    return kwargs.get("dtype") is not None


def set_opt_dtype(
    args: tuple[Any, ...], kwargs: dict[str, Any], dtype_arg: tuple[int, bool] | None, on_device: OnDevice
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """torch's ``fp32_set_opt_dtype``: ``dtype=float32`` unless the caller gave a dtype."""
    if dtype_arg is None or not args or not isinstance(args[0], _Tensor) or not eligible(args[0], on_device):
        return args, kwargs
    index, kwarg_only = dtype_arg
    if not kwarg_only and len(args) > index:
        if args[index] is None:
            args = (*args[:index], _FLOAT32, *args[index + 1 :])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": _FLOAT32}
    return args, kwargs
