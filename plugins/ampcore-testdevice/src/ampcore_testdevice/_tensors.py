"""Device tensors: storage-less PrivateUse1 tensors, each standing for a CPU tensor.

``torch._C._acc.create_empty_tensor`` makes a PrivateUse1 tensor with the right size and
dtype but no memory.  The CPU tensor holding its values is kept as an attribute of the
tensor's *storage* object: torch keeps a storage's Python object alive as long as the
storage lives, and every shallow copy torch makes in C++ (``detach``, ``nn.Parameter``,
aliases) shares the storage, so all of them find the data.

One boxed fallback on the ``PrivateUse1`` key serves every operator that has no
composite kernel: it swaps each device tensor (and a ``device=`` argument) for its CPU
counterpart, runs the operator's CPU kernel and wraps the results:

* a result the schema says is written in place (``add_``, ``out=``) is the device tensor
  that was passed (given the CPU tensor's new shape when the kernel resized it);
* any other tensor result becomes a new device tensor holding the CPU result.  A view's
  CPU result shares memory with its base, so writes through views reach the base;
* unless a ``device=`` argument names another device (``.cpu()``).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Final

import torch
from torch.utils._pytree import tree_map

from ._saturate import saturate_results

__all__ = ["from_cpu", "install_fallback", "to_cpu"]

_ATTR: Final = "_ampcore_testdevice_cpu"
_CPU: Final = torch.device("cpu")
_libraries: list[torch.library.Library] = []  # registrations live as long as the process


def from_cpu(cpu: torch.Tensor) -> torch.Tensor:
    """A new device tensor holding ``cpu`` (which it shares, not copies)."""
    wrapper = torch._C._acc.create_empty_tensor(cpu.shape, cpu.dtype)
    setattr(wrapper.untyped_storage(), _ATTR, cpu)
    return wrapper


def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """The CPU tensor behind device tensor ``tensor`` (shared memory, no copy)."""
    cpu: torch.Tensor | None = getattr(tensor.untyped_storage(), _ATTR, None)
    if cpu is None:
        raise RuntimeError(f"a {tensor.device} tensor without data (made outside the test device's kernels)")
    if tensor.storage_offset() == 0 and tensor.shape == cpu.shape and tensor.is_contiguous():
        return cpu
    # an alias torch made in C++ with other metadata on the same (virtual, contiguous) storage
    flat = cpu.reshape(-1)  # a view when ``cpu`` is contiguous (a copy, read-only use, otherwise)
    return flat.as_strided(tensor.shape, tensor.stride(), flat.storage_offset() + tensor.storage_offset())


def _make_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """Give device tensor ``tensor`` a contiguous CPU copy of its data and return it.

    A device tensor always looks contiguous, but may hold a non-contiguous CPU view (a
    transposed result): C++ code that trusts its metadata calls ``view`` on it, which the
    CPU view refuses.  The device tensor then holds a copy (it stops sharing memory with the
    view's base: writes through such views are the one aliasing this device loses).
    """
    copy = to_cpu(tensor).contiguous()
    setattr(tensor.untyped_storage(), _ATTR, copy)
    return copy


def _unwrap(device_type: str) -> Any:
    def unwrap(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == device_type:
            return to_cpu(value)
        if isinstance(value, torch.device) and value.type == device_type:
            return _CPU
        return value

    return unwrap


def _written_argument(op: torch._ops.OpOverload, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The argument that return ``index`` of ``op`` writes to (in-place / out=), or None."""
    returned = op._schema.returns[index] if index < len(op._schema.returns) else None
    if returned is None or returned.alias_info is None or not returned.alias_info.is_write:
        return None
    sets = returned.alias_info.before_set
    for position, argument in enumerate(op._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.before_set == sets:
            if position < len(args) and not argument.kwarg_only:
                return args[position]
            return kwargs.get(argument.name)
    return None


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    device_type = torch._C._get_privateuse1_backend_name()
    unwrap = _unwrap(device_type)
    written = unwrap(dst).copy_(unwrap(src))
    if dst.device.type == device_type:  # a conversion to float16 on (or onto) the device saturates
        saturate_results(torch.ops.aten.copy_.default, written)
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != src.shape:
        raise RuntimeError(f"the test device cannot resize tensors ({tuple(dst.shape)} -> {tuple(src.shape)})")
    return _copy_from(src, dst)


def _device_call(function: Any) -> Any:
    """A kernel that runs ``function`` on the CPU tensors and wraps its tensor results."""

    def kernel(*args: Any) -> Any:
        unwrap = _unwrap(torch._C._get_privateuse1_backend_name())
        out = function(*tree_map(unwrap, args))
        saturate_results(torch.ops.aten.convolution.default, out)
        return tree_map(lambda v: from_cpu(v) if isinstance(v, torch.Tensor) else v, out)

    return kernel


def _convolution(x: Any, weight: Any, bias: Any, *options: Any) -> Any:
    return torch.ops.aten.convolution.default(x, weight, bias, *options)


def _convolution_backward(grad: Any, x: Any, weight: Any, stride: Any, padding: Any, dilation: Any,
                          transposed: bool, output_padding: Any, groups: int, mask: Any) -> Any:  # fmt: skip
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    return torch.ops.aten.convolution_backward.default(
        grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask
    )


#: Ops whose composite kernel refuses other devices (a C++ backend overrides them).
_OVERRIDES: Final = {
    "convolution_overrideable": _device_call(_convolution),
    "convolution_backward_overrideable": _device_call(_convolution_backward),
}

#: Aliases with the same metadata, kept on their composite kernels: a shallow copy shares
#: the storage and so the CPU tensor, and ``nn.Parameter`` needs a tensor without a Python
#: object from ``detach``.
_SHALLOW: Final = frozenset({"detach", "alias", "lift_fresh"})

#: View ops that C++ code calls when the (always contiguous) device tensor allows it.
_VIEWS: Final = frozenset(
    {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten._reshape_alias.default}
)

_SPECIAL: Final = {
    torch.ops.aten._copy_from.default: _copy_from,
    torch.ops.aten._copy_from_and_resize.default: _copy_from_and_resize,
}


def _fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    special = _SPECIAL.get(op)
    if special is not None:
        return special(*args, **kwargs)
    device_type = torch._C._get_privateuse1_backend_name()
    unwrap = _unwrap(device_type)
    cpu_args, cpu_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
    try:
        out = op(*cpu_args, **cpu_kwargs)
    except RuntimeError as exc:
        if op not in _VIEWS or "view size is not compatible" not in str(exc):
            raise
        out = op(_make_contiguous(args[0]), *cpu_args[1:], **cpu_kwargs)
    saturate_results(op, out)
    target = kwargs.get("device")
    stays_here = target is None or torch.device(target).type == device_type

    def result(index: int, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            if isinstance(value, list) and stays_here:
                return [from_cpu(v) if isinstance(v, torch.Tensor) else v for v in value]
            return value
        written = _written_argument(op, index, args, kwargs)
        if written is not None:
            if (
                isinstance(written, torch.Tensor)
                and written.device.type == device_type
                and written.shape != value.shape
            ):
                # an out= argument the CPU kernel resized: give the device tensor the new
                # metadata in place (set_data), holding the resized CPU tensor
                written.data = from_cpu(value)
            return written
        return from_cpu(value) if stays_here else value

    if isinstance(out, tuple):
        return tuple(result(i, v) for i, v in enumerate(out))
    return result(0, out)


def install_fallback() -> None:
    """Register the CPU-kernel fallback on the PrivateUse1 key (once per process)."""
    if _libraries:
        return
    library = torch.library.Library("_", "IMPL")
    library.fallback(_fallback, "PrivateUse1")
    _libraries.append(library)
    kernels = torch.library.Library("aten", "IMPL")
    _libraries.append(kernels)
    with warnings.catch_warnings():  # "Overriding a previously registered kernel": on purpose
        warnings.simplefilter("ignore", UserWarning)
        for name, kernel in _OVERRIDES.items():
            kernels.impl(name, kernel, "PrivateUse1")
        for op in _composite_ops():
            overload = "" if op._overloadname == "default" else "." + op._overloadname
            kernels.impl(
                op._schema.name.removeprefix("aten::") + overload, functools.partial(_fallback, op), "PrivateUse1"
            )


def _composite_ops() -> list[torch._ops.OpOverload]:
    """The ATen ops whose composite-explicit kernel would otherwise win over the fallback.

    Such a kernel runs *on the device tensors*: it computes views with ``as_strided`` from
    their metadata, which is not the metadata of the CPU tensors holding the data (a
    transposed view is held by a contiguous device tensor), and it allocates ``out=``
    results that its ``out=`` kernel then resizes.  Run on the CPU tensors instead, where
    metadata and data agree (about 1,500 ops: views, ``mse_loss``, ``_to_copy``...).
    """
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        if not (has(name, "CompositeExplicitAutograd") or has(name, "CompositeExplicitAutogradNonFunctional")):
            continue
        base, _, overload = name.removeprefix("aten::").partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        if op not in _SPECIAL and base not in _OVERRIDES and base not in _SHALLOW:
            found.append(op)
    return found
