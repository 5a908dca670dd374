"""The test device's own autocast registrations on ``AutocastPrivateUse1``, one mode each.

What a real vendor ships in C++ (``TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m)``), in
Python:

* ``"none"``: nothing.  torch registers no fallback for the key either, so every op under
  ``torch.autocast(<name>)`` raises "Could not run ... 'Autocast<name>' backend";
* ``"fallthrough"``: a fallthrough fallback only: ``torch.autocast`` is enabled but casts
  nothing;
* ``"partial"``: the fallthrough plus kernels for ``mm`` (low precision) and ``dot``
  (float32), as torch's reference out-of-tree backend (torch_openreg) registers;
* ``"generic"``: the fallthrough plus a kernel for every op of torch's generic lists
  (:mod:`ampcore_testdevice._generic_lists`, what torch registers for XPU), as a vendor that
  copies them (torch_npu) does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import torch
from torch.utils._pytree import tree_map

from ._generic_lists import APPEND_DTYPE, GENERIC

__all__ = ["MODES", "PARTIAL", "Mode", "register"]

Mode = Literal["none", "fallthrough", "partial", "generic"]
MODES: Final[tuple[Mode, ...]] = ("none", "fallthrough", "partial", "generic")
#: The kernels of mode "partial": overload -> cast policy.
PARTIAL: Final[Mapping[str, str]] = {"mm": "lower_precision_fp", "dot": "fp32"}
_KEY: Final = "AutocastPrivateUse1"
_libraries: list[torch.library.Library] = []


def _op(overload: str) -> torch._ops.OpOverload | None:
    base, _, name = overload.partition(".")
    try:
        return getattr(getattr(torch.ops.aten, base), name or "default")  # type: ignore[no-any-return]
    except AttributeError:
        return None


def _kernel(op: torch._ops.OpOverload, policy: str, device_type: str) -> Callable[..., Any]:
    """torch's autocast kernel for ``policy`` (``autocast_mode.h``), in Python."""
    exclude = torch._C.DispatchKeySet(torch._C._parse_dispatch_key(_KEY))
    dtype_slot = next(((i, a.kwarg_only) for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)
    append_to = (
        _op(APPEND_DTYPE[op._schema.name.removeprefix("aten::") + "." + op._overloadname])
        if policy == "fp32_append_dtype"
        else None
    )

    def eligible(value: Any) -> bool:
        return (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and value.dtype != torch.float64
            and value.device.type == device_type
        )

    def cast(to: torch.dtype) -> Callable[[Any], Any]:
        return lambda value: value.to(to) if eligible(value) else value

    def call(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            if policy == "lower_precision_fp":
                to = torch.get_autocast_dtype(device_type)
                return op(*tree_map(cast(to), args), **tree_map(cast(to), kwargs))
            if policy == "fp32":
                return op(*tree_map(cast(torch.float32), args), **tree_map(cast(torch.float32), kwargs))
            if policy == "promote":
                dtypes = [v.dtype for v in torch.utils._pytree.tree_leaves((args, kwargs)) if eligible(v)]
                if not dtypes:
                    return op(*args, **kwargs)
                widest = dtypes[0]
                for dtype in dtypes[1:]:
                    widest = torch.promote_types(widest, dtype)
                return op(*tree_map(cast(widest), args), **tree_map(cast(widest), kwargs))
            if policy == "fp32_set_opt_dtype":
                if dtype_slot is None or not eligible(args[0]):
                    return op(*args, **kwargs)
                index, kwarg_only = dtype_slot
                if not kwarg_only and len(args) > index:
                    if args[index] is None:
                        args = (*args[:index], torch.float32, *args[index + 1 :])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            if policy == "fp32_append_dtype" and append_to is not None:
                positional = [a for a in op._schema.arguments if not a.kwarg_only]
                full = args + tuple(a.default_value for a in positional[len(args) :])
                return append_to(*full, dtype=torch.float32 if eligible(args[0]) else args[0].dtype)
            if policy == "banned":
                raise RuntimeError(f"{op._schema.name} is unsafe to autocast on {device_type}")
            return op(*args, **kwargs)

    return call


def register(mode: Mode, device_type: str) -> None:
    """Register ``mode``'s kernels on ``AutocastPrivateUse1`` (once per process)."""
    if mode not in MODES:
        raise ValueError(f"autocast={mode!r}: expected one of {', '.join(MODES)}")
    if mode == "none":
        return
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, _KEY)
    _libraries.append(fallback)
    table = PARTIAL if mode == "partial" else GENERIC if mode == "generic" else {}
    if not table:
        return
    library = torch.library.Library("aten", "IMPL")
    _libraries.append(library)
    for overload, policy in table.items():
        op = _op(overload)
        if op is not None:
            library.impl(overload, _kernel(op, policy, device_type), _KEY)
