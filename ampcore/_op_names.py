"""Op names: canonical ATen names, their overloads, Paddle aliases, validation.

A canonical op name is an ATen operator's base name (``aten::add`` -> ``"add"``).  One name
covers every *functional* overload of the operator (``add`` -> ``add.Tensor`` and
``add.Scalar``): in-place (``add_``), ``out=`` and view overloads are never cast, because a
cast would break their aliasing.  Paddle's op names are accepted as documented aliases
(:data:`PADDLE_ALIASES`), so a list written for ``paddle.amp.auto_cast`` works as written.
Where a Paddle name is also an ATen name, the ATen meaning wins (Paddle's legacy ``mul``
is a matrix product; ATen's ``mul`` is elementwise; Paddle's ``sum`` adds a list of
tensors; ATen's ``sum`` is the reduction).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Final

import torch

from ._errors import AmpcoreError, closest, shown
from ._forklock import LOCK

__all__ = [
    "NO_CAST_OPS",
    "NO_CAST_PREFIXES",
    "PADDLE_ALIASES",
    "SEALED_COMPOSITES",
    "all_aten_names",
    "canonical_op",
    "canonical_ops",
    "castable_overloads",
    "functional_overloads",
    "generated_overloads",
    "is_composite",
    "is_functional",
    "lookup_op",
    "overload_name",
]

#: Paddle op name -> ATen op name (see docs/op-lists.md).
PADDLE_ALIASES: Final[Mapping[str, str]] = {
    "elementwise_add": "add",
    "elementwise_sub": "sub",
    "elementwise_mul": "mul",
    "elementwise_div": "div",
    "elementwise_max": "maximum",
    "elementwise_min": "minimum",
    "elementwise_pow": "pow",
    "elementwise_mod": "remainder",
    "elementwise_floordiv": "floor_divide",
    "matmul_v2": "matmul",
    "fused_gemm_epilogue": "addmm",
    "reduce_sum": "sum",
    "reduce_mean": "mean",
    "reduce_prod": "prod",
    "reduce_max": "amax",
    "reduce_min": "amin",
    "reduce_all": "all",
    "reduce_any": "any",
    "lookup_table": "embedding",
    "lookup_table_v2": "embedding",
    "softmax_with_cross_entropy": "cross_entropy_loss",
    "c_softmax_with_cross_entropy": "cross_entropy_loss",
    "cross_entropy": "cross_entropy_loss",
    "cross_entropy2": "cross_entropy_loss",
    "sigmoid_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
    "bce_loss": "binary_cross_entropy",
    "kldiv_loss": "kl_div",
    "conv2d_transpose": "conv_transpose2d",
    "conv3d_transpose": "conv_transpose3d",
    "depthwise_conv2d": "conv2d",
    "sync_batch_norm": "batch_norm",
    "p_norm": "linalg_vector_norm",
    "cos_sim": "cosine_similarity",
    "linear_interp_v2": "upsample_linear1d",
    "bilinear_interp_v2": "upsample_bilinear2d",
    "nearest_interp_v2": "upsample_nearest2d",
    "bicubic_interp_v2": "upsample_bicubic2d",
    "trilinear_interp_v2": "upsample_trilinear3d",
    "max_pool2d_with_index": "max_pool2d_with_indices",
    "flash_attn": "scaled_dot_product_attention",
    "top_k_v2": "topk",
    "arg_max": "argmax",
    "arg_min": "argmin",
    "hard_swish": "hardswish",
    "hard_sigmoid": "hardsigmoid",
    "swish": "silu",
}

#: Ops that levels OD and O2 never cast (their purpose is a dtype, a copy, an identity or a
#: check of the values as they are).  A user list may still name them.
NO_CAST_OPS: Final[frozenset[str]] = frozenset(
    """
    _to_copy to type_as clone copy _copy_from _copy_from_and_resize detach_copy alias_copy
    lift lift_fresh lift_fresh_copy _unsafe_view _local_scalar_dense is_nonzero equal
    isnan isinf isfinite isposinf isneginf isreal nan_to_num _assert_async
    empty_like zeros_like ones_like full_like rand_like randn_like randint_like
    new_empty new_empty_strided new_zeros new_ones new_full
    _make_dual _unpack_dual dequantize quantize_per_tensor quantize_per_channel
    native_batch_norm cudnn_batch_norm miopen_batch_norm _native_batch_norm_legit_no_training
    """.split()
)
# The batch-norm kernels above update their running statistics in place although their
# schemas do not say so: a cast would hand them a copy and the statistics would never move.
# Run as given, they take a low-precision input with float32 weights and statistics.

#: The ops torch's batch-norm wrappers call: the batch-norm kernels (the eager ones are in
#: NO_CAST_OPS; a cast of any of them would hand it copies of the running statistics), and,
#: for an empty input, a clone and arithmetic on nothing.
_BATCH_NORM_INNER: Final = frozenset(
    """
    _batch_norm_impl_index native_batch_norm cudnn_batch_norm miopen_batch_norm
    _native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional
    _batch_norm_with_update _batch_norm_with_update_functional _batch_norm_no_update
    """.split()
)

#: Composites made only of ops that levels never cast -> the ops they call.  Under a policy
#: whose lists name none of those (no custom lists; a backend's lists may name them) they
#: run as one call, the policy kernel's key off inside: their inner ops would only be passed
#: on, each after a Python round trip.
SEALED_COMPOSITES: Final[Mapping[str, frozenset[str]]] = {
    "batch_norm": _BATCH_NORM_INNER,
    "_batch_norm_impl_index": _BATCH_NORM_INNER,
}

#: Name prefixes of ops that OD and O2 never cast (optimizer, scaler and conversion ops).
NO_CAST_PREFIXES: Final[tuple[str, ...]] = ("_foreach_", "_fused_", "_amp_", "to_", "_to_", "_autocast_")


def overload_name(base: str, overload: str) -> str:
    """``("add", "Tensor")`` -> ``"add.Tensor"``; the default overload is the base name."""
    return f"{base}.{overload}" if overload else base


def is_functional(schema: torch.FunctionSchema) -> bool:
    """Whether an overload may be cast: no mutation, no aliasing result, a Tensor in and out."""
    if schema.is_mutable or not schema.returns:
        return False
    if any(r.alias_info is not None for r in schema.returns):
        return False
    if not any("Tensor" in str(r.type) for r in schema.returns):
        return False
    return any("Tensor" in str(a.type) for a in schema.arguments)


@functools.cache
def _dispatcher_schemas() -> Mapping[str, tuple[torch.FunctionSchema, ...]]:
    """ATen base name -> schemas of its overloads registered with the dispatcher."""
    with LOCK:  # holds the dispatcher's and the JIT registry's mutexes: not during a fork
        registered = {n.removeprefix("aten::") for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
        schemas = torch._C._jit_get_all_schemas()
    by_name: dict[str, list[torch.FunctionSchema]] = {}
    for schema in schemas:
        if not schema.name.startswith("aten::"):
            continue
        base = schema.name.removeprefix("aten::")
        if overload_name(base, schema.overload_name) in registered:
            by_name.setdefault(base, []).append(schema)
    return {name: tuple(schemas) for name, schemas in by_name.items()}


def all_aten_names() -> frozenset[str]:
    """Every ATen operator base name this torch registers."""
    return frozenset(_dispatcher_schemas())


@functools.cache
def functional_overloads(name: str) -> tuple[str, ...]:
    """The castable overloads of ATen op ``name`` registered with the dispatcher.

    Example::

        >>> functional_overloads("add")
        ('add.Scalar', 'add.Tensor')
    """
    schemas = _dispatcher_schemas().get(name, ())
    return tuple(sorted(overload_name(name, s.overload_name) for s in schemas if is_functional(s)))


def _no_cast(name: str) -> bool:
    if name in NO_CAST_OPS or name.startswith(NO_CAST_PREFIXES):
        return True
    # view_copy family (transpose_copy, ...): copies standing in for views under functionalization
    if name.endswith("_copy"):
        view = _dispatcher_schemas().get(name.removesuffix("_copy"), ())
        return any(not s.is_mutable and any(r.alias_info is not None for r in s.returns) for s in view)
    return False


@functools.cache
def _device_keys() -> tuple[str, ...]:
    """The dispatch keys of the backends a region can run on and their autograd keys
    (``CPU``, ``AutogradCPU``, ...), from torch's key enum: each backend ``X`` with an
    ``AutogradX`` key, less the meta and nested-tensor keys (no device of their own)."""
    names = torch._C.DispatchKey.__members__
    backends = [n.removeprefix("Autograd") for n in names if n.startswith("Autograd")]
    backends = [b for b in backends if b in names]
    keys = [key for b in backends if b not in ("Meta", "NestedTensor") for key in (b, f"Autograd{b}")]
    return tuple(key for key in keys if _parses(key))


def _parses(key: str) -> bool:
    try:  # the dispatcher's key-name parser knows fewer keys than the enum (no AutogradHIP)
        torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", key)
    except RuntimeError:
        return False
    return True


def is_composite(overload: str) -> bool:
    """Whether an overload is CompositeImplicitAutograd (made of other ops, no kernel of its own).

    A composite that also has a kernel of its own on a backend (an extension's: IPEX 2.8
    registers CPU kernels for ``layer_norm`` and ``group_norm``; torch's own for
    ``native_channel_shuffle``) does not decompose there, so its inner ops never see a
    policy: it counts as a kernel, cast as such, on every device type."""
    name = f"aten::{overload}"
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    return has_kernel(name, "CompositeImplicitAutograd") and not any(has_kernel(name, k) for k in _device_keys())


def _has_dtype_argument(overload: str) -> bool:
    base, _, name = overload.partition(".")
    schemas = _dispatcher_schemas().get(base, ())
    return any(s.overload_name == name and any(a.name == "dtype" for a in s.arguments) for s in schemas)


@functools.cache
def generated_overloads() -> tuple[str, ...]:
    """The castable ATen overloads that levels OD and O2 register a policy kernel for (sorted).

    Composite (CompositeImplicitAutograd) ops are left out: they fall through to the ops they
    are made of, which get the policy, as in torch.autocast.  Those that take a ``dtype=``
    are kept, so that an explicit ``dtype=`` is honoured for the whole composite.
    """
    with LOCK:  # is_composite asks the dispatcher
        return tuple(
            sorted(
                overload
                for name in _dispatcher_schemas()
                if not _no_cast(name)
                for overload in functional_overloads(name)
                if not is_composite(overload) or _has_dtype_argument(overload)
            )
        )


def _unknown_op(name: str, base: str, where: str) -> AmpcoreError:
    hints = closest(base, [*_dispatcher_schemas(), *PADDLE_ALIASES])
    return AmpcoreError(
        f"{where}: unknown op {name!r}"
        + (f"; did you mean {', '.join(repr(h) for h in hints)}?" if hints else "")
        + " Op names are ATen operator names (e.g. 'mm', 'linear', 'add', 'softmax') or "
        "Paddle aliases (e.g. 'elementwise_add', 'matmul_v2'); see docs/op-lists.md"
    )


def _overload_of(name: str, base: str, where: str) -> str | None:
    """The overload ``name`` names (``"add.Tensor"``; ``"mm.default"`` -> ``"mm"``), checked
    to exist, or None when it names the whole operator."""
    suffix = name.removeprefix("aten::").partition(".")[2]
    if not suffix:
        return None
    overload = overload_name(base, "" if suffix == "default" else suffix)
    known = [overload_name(base, s.overload_name) for s in _dispatcher_schemas()[base]]
    if overload not in known:
        castable = functional_overloads(base)
        shown = [o if "." in o else f"{o}.default" for o in castable]
        hint = closest(f"{base}.{suffix}", shown, n=1)
        raise AmpcoreError(
            f"{where}: unknown overload {name!r} of op {base!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; its castable overloads: {', '.join(repr(o) for o in shown) or 'none'}, or {base!r} for all of them"
        )
    return overload


def lookup_op(name: object, where: str) -> tuple[str, str | None]:
    """Validate an op name to look up (an ATen name, ``"aten::"`` prefix, Paddle alias, or
    one overload such as ``"add.Tensor"``): its canonical base name and the overload, if one
    is named.  Unlike :func:`canonical_op` it accepts ops that are never cast (``add_``).

    Example::

        >>> lookup_op("elementwise_add", "demo"), lookup_op("add.Tensor", "demo")
        (('add', None), ('add', 'add.Tensor'))
    """
    if not isinstance(name, str) or not name.strip():
        raise AmpcoreError(f"{where}: expected an op name such as 'mm' or 'add.Tensor', got {name!r}")
    name = name.strip()
    base = name.removeprefix("aten::").partition(".")[0]
    schemas = _dispatcher_schemas()
    if base not in schemas:
        base = PADDLE_ALIASES.get(base, base)
    if base not in schemas:
        raise _unknown_op(name, base, where)
    return base, _overload_of(name, base, where)


def canonical_op(name: object, call: str = "ampcore.autocast", param: str = "custom_white_list") -> str:
    """Validate one op name (ATen or Paddle alias) and return its canonical ATen name.

    Raises :class:`ampcore.AmpcoreError` naming the closest valid names for an unknown name,
    and for ops that have no castable overload (in-place, ``out=`` and view ops).

    Example::

        >>> canonical_op("elementwise_add"), canonical_op("linear")
        ('add', 'linear')
    """
    if not isinstance(name, str) or not name:
        raise AmpcoreError(f"{call}({param}=...): op names must be non-empty strings, got {shown(name)}")
    base = name.removeprefix("aten::").partition(".")[0]
    schemas = _dispatcher_schemas()
    if base not in schemas:
        base = PADDLE_ALIASES.get(base, base)
    if base not in schemas:
        raise _unknown_op(name, base, f"{call}({param}=...)")
    overload = _overload_of(name, base, f"{call}({param}=...)")
    if overload is not None and overload not in functional_overloads(base):
        raise AmpcoreError(
            f"{call}({param}=...): overload {name!r} cannot be given a precision: it is an in-place, "
            f"out= or view overload; list {base!r} (its castable overloads: "
            f"{', '.join(repr(o) for o in functional_overloads(base)) or 'none'})"
        )
    if not functional_overloads(base):
        hint = ""
        if base.endswith("_") and functional_overloads(base[:-1]):
            hint = f"; list {base[:-1]!r} instead"
        raise AmpcoreError(
            f"{call}({param}=...): op {name!r} cannot be given a precision: it has no functional "
            f"overload (in-place, out= and view ops are never cast){hint}"
        )
    return base


def canonical_ops(
    names: Iterable[str] | str | None, call: str = "ampcore.autocast", param: str = "custom_white_list"
) -> frozenset[str]:
    """Validate a list of op names (a single string counts as one name)."""
    if names is None:
        return frozenset()
    if isinstance(names, str):
        names = (names,)
    lists = getattr(names, "white", None) is not None and getattr(names, "black", None) is not None
    if lists:  # an OpLists (or similar) object instead of a set of names
        kind = "white" if "white" in param else "black"
        raise AmpcoreError(
            f"{call}({param}={type(names).__name__}(...)): expected a set or list of op names, got a whole "
            f"{type(names).__name__} object; pass one of its lists, e.g. {param}=ampcore.oplists('cpu').{kind}, "
            "or names such as {'add', 'mm'}"
        )
    try:
        items = list(names)
    except TypeError:
        raise AmpcoreError(
            f"{call}({param}={shown(names)}): expected a set or list of op names such as {{'add', 'mm'}}"
        ) from None
    return frozenset(canonical_op(n, call, param) for n in items)


@functools.cache
def castable_overloads() -> tuple[str, ...]:
    """Every castable ATen overload of this torch (sorted): the overloads ampcore registers a
    policy kernel for, so that any list or level can reach any op."""
    return tuple(sorted({overload for name in _dispatcher_schemas() for overload in functional_overloads(name)}))
