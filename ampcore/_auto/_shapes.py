"""Shape classes: which module calls ``level="auto"`` plans, and the key a decision is stored under.

A shape class is the module's kind and hyper-parameters (``Linear(in_features=1024,
out_features=1024, bias=True)``), the input shapes with every dimension rounded up to a
power of two (the bucket) and their dtypes where not float32 (``16x64:bfloat16``: a
float32 decision then pays the input's cast), and whether the call records gradients.  Two layers of the same
kind and bucket share one measurement and one decision; a layer's path in the model plays
no part, so a plan carries over to every rank and to a model rebuilt on resume.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch
from torch import nn

__all__ = [
    "MATMUL",
    "PENDING",
    "PLANNED_OPS",
    "VARIES",
    "bucket",
    "cast_floating",
    "device_type_of",
    "flags",
    "float32_weights",
    "forget_kind",
    "known_kind",
    "planned_ops",
    "set_kind",
    "shape_class",
    "variant_kind",
]


def _linear(module: nn.Module) -> str:
    return module.extra_repr()


def _attention(module: nn.Module) -> str:
    m = module
    bias = m.in_proj_bias is not None
    return f"embed_dim={m.embed_dim}, num_heads={m.num_heads}, batch_first={m.batch_first}, bias={bias}"


#: The module kinds ``level="auto"`` plans, with the ATen ops they run in low precision
#: (a custom list naming one of these ops takes the module out of the plan: lists win).
PLANNED_OPS: Final[dict[type[nn.Module], tuple[Callable[[nn.Module], str], frozenset[str]]]] = {
    nn.Linear: (_linear, frozenset({"linear", "addmm", "mm", "matmul"})),
    nn.modules.conv._ConvNd: (
        _linear,
        frozenset(
            {
                "conv1d",
                "conv2d",
                "conv3d",
                "convolution",
                "_convolution",
                "conv_transpose1d",
                "conv_transpose2d",
                "conv_transpose3d",
            }
        ),
    ),
    nn.MultiheadAttention: (
        _attention,
        frozenset(
            {
                "linear",
                "addmm",
                "mm",
                "matmul",
                "bmm",
                "baddbmm",
                "scaled_dot_product_attention",
                "_native_multi_head_attention",
            }
        ),
    ),
}

Kind = tuple[Callable[[nn.Module], str], frozenset[str] | None]


def _own(module: nn.Module) -> str:
    return ", ".join(f"{n}={'x'.join(map(str, p.shape))}" for n, p in module._parameters.items() if p is not None)


#: the kind of a module class whose own forward is one product with its own weight
#: (``transformers``' ``Conv1D``: ``torch.addmm(bias, x, weight)``), found by
#: :mod:`._kinds` from the ops of its first call: planned as ``Linear``
MATMUL: Final[Kind] = (_own, frozenset({"linear", "addmm", "mm", "matmul", "bmm", "baddbmm"}))
#: the kind of a class not planned by its type whose first call is still to be watched (:mod:`._kinds`)
PENDING: Final[Kind] = (_own, None)
#: the kind of a class judged per instance flags (:func:`flags`): each variant by its own first call
VARIES: Final[Kind] = (_own, None)
_BY_TYPE: dict[type, Kind | None] = {}
#: class -> its kind (None: not planned; :data:`PENDING`: to be watched; :data:`VARIES`: see
#: :func:`variant_kind`), None if not met yet
known_kind: Final = _BY_TYPE.get
#: (class, its instance's flags) -> the kind its first call of those flags gave
_VARIANTS: dict[tuple[type, tuple[tuple[str, object], ...]], Kind | None] = {}


def flags(module: nn.Module) -> tuple[tuple[str, object], ...]:
    """The instance's own public flags (attributes holding a bool, but ``training``): what
    may change what its forward runs (a flag that adds a second product), so a class
    watched by :mod:`._kinds` is judged per set of them (bools only: a name or a size per
    instance would make every instance a kind of its own, measured alone).  Kept in the
    instance, checked at each look (modules of classes judged per flags only): a flag
    flipped since is read again, its description dropped, so the next call judges the new
    set (before the twelfth stop, read once per module object); an attribute added since
    (the instance's ``__dict__`` grew) reads them again too (before the thirteenth stop, a
    flag added after the first look was not seen)."""
    state = module.__dict__
    cached: tuple[tuple[tuple[str, object], ...], int] | None = state.get(_FLAGS)
    found = None
    if cached is not None:
        found = cached[0]
        if cached[1] != len(state):  # an attribute added (or removed) since
            found = None
        else:
            for name, value in cached[0]:  # bools are singletons
                if state.get(name) is not value:
                    found = None
                    break
    if found is None:
        found = tuple((k, v) for k, v in state.items() if type(v) is bool and k[0] != "_" and k != "training")
        if cached is not None and cached[0] != found and _DESCRIPTION in state:
            state[_DESCRIPTION] = None  # read again (kept: the dict's size is watched, _settings)
        state[_FLAGS] = (found, len(state) + (cached is None))
    return found


_FLAGS: Final = "_ampcore_auto_flags"


def variant_kind(module: nn.Module) -> Kind | None:
    """The kind of ``module``, of a class judged per instance flags (:data:`PENDING`: its
    flags were not met yet)."""
    return _VARIANTS.get((type(module), flags(module)), PENDING)


def forget_kind(cls: type) -> None:
    """Forget what was found for ``cls`` (tests: a class met anew)."""
    _BY_TYPE.pop(cls, None)
    for key in [k for k in _VARIANTS if k[0] is cls]:
        del _VARIANTS[key]


def _kind(cls: type) -> Kind | None:
    try:
        return _BY_TYPE[cls]
    except KeyError:
        found = next((value for base, value in PLANNED_OPS.items() if issubclass(cls, base)), PENDING)
        _BY_TYPE[cls] = found
        return found


def set_kind(cls: type, kind: Kind | None, module: nn.Module | None = None) -> None:
    """What :mod:`._kinds` found for ``cls`` (:data:`MATMUL`, or None: not planned) by a call
    of ``module``: an instance with flags (:func:`flags`) decides for its flags only."""
    found = () if module is None else flags(module)
    if not found and _BY_TYPE.get(cls) is not VARIES:
        _BY_TYPE[cls] = kind
        return
    _BY_TYPE[cls] = VARIES
    _VARIANTS[(cls, found)] = kind


def planned_ops(module: nn.Module) -> frozenset[str] | None:
    """The ATen ops a planned module runs in low precision; ``None``: not a planned kind (or
    not yet: a class whose first call :mod:`._kinds` has still to watch)."""
    try:  # every module call under the global hooks asks: one dict lookup, no call
        kind = _BY_TYPE[type(module)]
    except KeyError:
        kind = _kind(type(module))
    if kind is None:
        return None
    ops = kind[1]
    if ops is None and kind is VARIES:
        found = variant_kind(module)
        return None if found is None else found[1]
    return ops


def float32_weights(module: nn.Module) -> bool:
    """Whether every floating-point parameter of ``module`` is float32: a planned module with
    weights in another dtype (``model.bfloat16()``) cannot run in float32 by switching
    autocast off, so auto leaves it to the O1 lists (as torch.autocast runs it).

    Example::

        >>> import torch
        >>> float32_weights(torch.nn.Linear(2, 2)), float32_weights(torch.nn.Linear(2, 2).bfloat16())
        (True, False)
    """
    if not module._modules:  # a leaf (Linear, a convolution): its own dict, not torch's generators (20 calls)
        for p in module._parameters.values():
            if p is not None and p.dtype != _F32 and p.is_floating_point():
                return False
        return True
    return all(p.dtype == _F32 for p in module.parameters() if p.is_floating_point())


_F32: Final = torch.float32
_LOW: Final = (torch.bfloat16, torch.float16)


def device_type_of(device: torch.device) -> str:
    """``device.type``, kept per device object: torch formats it through a C++ string stream
    each time (0.3 us in a loop, about 3 us inside a training step on a CPU).

    Example::

        >>> import torch
        >>> device_type_of(torch.zeros(1).device)
        'cpu'
    """
    try:
        return _TYPES[device]
    except KeyError:
        found = _TYPES[device] = device.type
        return found


#: torch.device (type and index: a handful per process) -> its type
_TYPES: dict[torch.device, str] = {}


def cast_floating(value: Any, dtype: torch.dtype, device_type: str, low: bool) -> Any:
    """``value`` with its low-precision (``low``) or float32 tensors of ``device_type`` cast
    to ``dtype`` (through tuples and lists)."""
    if isinstance(value, torch.Tensor):
        match = value.dtype in _LOW if low else value.dtype == torch.float32
        return value.to(dtype) if match and device_type_of(value.device) == device_type else value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(cast_floating(v, dtype, device_type, low) for v in value)
    if isinstance(value, list):
        return [cast_floating(v, dtype, device_type, low) for v in value]
    return value


def bucket(n: int) -> int:
    """``n`` rounded up to a power of two (the size bucket of a dimension).

    Example::

        >>> bucket(500), bucket(512), bucket(513), bucket(1), bucket(0)
        (512, 512, 1024, 1, 0)

    0 is a bucket of its own: an empty batch does no work but the casts, and timing it must
    not decide for batch 1.
    """
    return n if n <= 1 else 1 << (n - 1).bit_length()


def shape_class(module: nn.Module, args: tuple[object, ...], device_type: str) -> str | None:
    """The shape class of a call of ``module`` on ``args``; ``None`` when it is not planned
    (not a planned kind, or no floating-point input on ``device_type``).

    Example::

        >>> import torch
        >>> shape_class(torch.nn.Linear(64, 32), (torch.zeros(500, 64),), "cpu")
        'Linear(in_features=64, out_features=32, bias=True) in=[512x64] grad'
    """
    try:
        kind = _BY_TYPE[type(module)]
    except KeyError:
        kind = _kind(type(module))
    varies = kind is VARIES  # judged per flags: they are in its description
    if varies:
        kind = variant_kind(module)
    if kind is None or kind[1] is None:
        return None
    describe = module.__dict__.get(_DESCRIPTION)
    if describe is None:  # read once per module object (the hot path); not a parameter or buffer
        more = "".join(f", {k}={v}" for k, v in flags(module)) if varies else ""
        describe = module.__dict__[_DESCRIPTION] = f"{type(module).__name__}({kind[0](module)}{more})"
    try:
        if len(args) == 1 and isinstance(one := args[0], torch.Tensor):  # the common call: no comprehension
            # the device, not its type: torch formats ``device.type`` through a C++ stream (3 us in a step)
            signature: tuple[object, ...] = (describe, _is_grad(), device_type, one.shape, one.dtype, one.device)
        else:  # nested (shape, dtype, device type) per tensor: never equal to a key of the form above
            signature = (
                describe,
                _is_grad(),
                device_type,
                *[(a.shape, a.dtype, a.device.type) for a in args if isinstance(a, torch.Tensor)],
            )
    except RuntimeError:  # a strided nested tensor has no shape: not planned (the O1 lists)
        return None
    try:
        return _CLASSES[signature]
    except KeyError:
        if len(_CLASSES) > _MAX_CLASSES:  # dynamic shapes: keep the memo bounded
            _CLASSES.clear()
        found = _CLASSES[signature] = _shape_class(describe, args, device_type)
        return found


#: the attribute a planned module's kind and hyper-parameters are kept in
_DESCRIPTION: Final = "_ampcore_auto_description"
#: (description, grad, device type, (shape, dtype, device type) per tensor) -> shape class
_CLASSES: dict[tuple[object, ...], str | None] = {}
_MAX_CLASSES: Final = 4096
_is_grad: Final = torch.is_grad_enabled


def _shape_class(describe: str, args: tuple[object, ...], device_type: str) -> str | None:
    shapes = []
    floating = False
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if arg.is_nested or not all(type(d) is int for d in arg.shape):  # jagged, symbolic: sizes no bucket has
                return None  # (not planned: the O1 lists, as torch.autocast)
            if arg.is_floating_point() and arg.device.type == device_type:
                floating = True
            dims = "x".join(str(bucket(d)) for d in arg.shape)
            shapes.append(dims if arg.dtype == torch.float32 else f"{dims}:{str(arg.dtype).removeprefix('torch.')}")
    if not floating:
        return None
    grad = "grad" if torch.is_grad_enabled() else "no-grad"
    return f"{describe} in=[{', '.join(shapes)}] {grad}"
