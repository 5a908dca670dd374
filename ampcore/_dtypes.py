"""The one dtype parser: ``torch.dtype`` objects and the names users write for them.

Paddle users write ``dtype="float16"`` or ``"bfloat16"``, torch users ``torch.float16``,
others ``"bf16"``/``"fp16"``/``"half"``.  Every ampcore call that takes a dtype parses it
here, so that all of them accept the same spellings and refuse the rest the same way.
Whether the backend supports the dtype is a separate question
(:meth:`ampcore.Backend.check_dtype`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import torch

from ._errors import AmpcoreError, closest, shown

__all__ = ["DTYPE_NAMES", "dtype_name", "parse_declared_dtype", "parse_dtype", "valid_dtype_names"]

#: Accepted names (lower case; a leading ``torch.`` is also accepted) -> the dtype.
DTYPE_NAMES: Final[Mapping[str, torch.dtype]] = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as messages name it, without torch's prefix.

    Example::

        >>> dtype_name(torch.bfloat16)
        'bfloat16'
    """
    return str(dtype).removeprefix("torch.")


def valid_dtype_names(dtypes: Sequence[torch.dtype] | None = None) -> str:
    """``"bfloat16 (bf16), float16 (fp16, half), ..."``: each dtype (all, or ``dtypes``) with
    its aliases.

    Example::

        >>> valid_dtype_names([torch.float16])
        'float16 (fp16, half)'
    """
    groups: dict[torch.dtype, list[str]] = {d: [] for d in dtypes} if dtypes is not None else {}
    for name, dtype in DTYPE_NAMES.items():
        if dtypes is None or dtype in groups:
            groups.setdefault(dtype, []).append(name)
    return ", ".join(
        f"{names[0]} ({', '.join(names[1:])})" if names else dtype_name(dtype) for dtype, names in groups.items()
    )


def _where(value: object, call: str, param: str) -> str:
    """How the error names the input: ``call --option value`` or ``call(param=value)``."""
    return f"{call} {param} {value}".strip() if param.startswith("-") else f"{call}({param}={shown(value)})"


def parse_dtype(value: object, call: str, param: str = "dtype") -> torch.dtype:
    """``value`` (a floating ``torch.dtype`` or one of its names) as a ``torch.dtype``.

    Args:
        value: ``torch.bfloat16``, ``"bfloat16"``, ``"bf16"``, ``"torch.float16"``, ``"half"``...
            (case and surrounding spaces do not matter).
        call: the call to name in the error, e.g. ``"ampcore.decorate"``.
        param: the parameter (or option) to name in the error, e.g. ``"dtype"`` or ``"--dtype"``.

    Raises:
        AmpcoreError: anything else; the message names ``call`` and ``param``, the value, and
            the valid names (with a did-you-mean hint for a near miss).

    Example::

        >>> parse_dtype("bf16", "ampcore.decorate")
        torch.bfloat16
        >>> parse_dtype(torch.float16, "ampcore.GradScaler")
        torch.float16
        >>> parse_dtype("fp8", "ampcore.decorate")
        Traceback (most recent call last):
        ...
        ampcore._errors.AmpcoreError: ampcore.decorate(dtype='fp8'): unknown dtype name; valid: bfloat16 (bf16), float16 (fp16, half), float32 (fp32, float), float64 (fp64, double), or a floating torch.dtype
    """  # noqa: E501 (a doctest's expected error message is one line)
    if isinstance(value, torch.dtype):
        if value.is_floating_point:
            return value
        problem = "not a floating dtype"
    elif isinstance(value, str):
        key = value.strip().lower().removeprefix("torch.")
        if key in DTYPE_NAMES:
            return DTYPE_NAMES[key]
        hint = closest(key, DTYPE_NAMES, n=1)
        problem = "unknown dtype name" + (f" (did you mean {hint[0]!r}?)" if hint else "")
    else:
        problem = f"expected a torch.dtype or a dtype name, got {type(value).__name__}"
    raise AmpcoreError(
        f"{_where(value, call, param)}: {problem}; valid: {valid_dtype_names()}, or a floating torch.dtype"
    )


def parse_declared_dtype(
    value: object, declared: Sequence[torch.dtype], owner: str, call: str, param: str
) -> torch.dtype:
    """:func:`parse_dtype` for a choice among ``declared`` (e.g. a backend's dtypes): the error
    lists only those, so a dtype the owner does not declare is never shown as valid.

    Example::

        >>> parse_declared_dtype("fp64", [torch.bfloat16], "backend 'cpu'", "ampcore conformance", "--dtype")
        Traceback (most recent call last):
        ...
        ampcore._errors.AmpcoreError: ampcore conformance --dtype fp64: backend 'cpu' does not declare float64; it declares: bfloat16 (bf16)
    """  # noqa: E501 (a doctest's expected error message is one line)
    where, valid = _where(value, call, param), valid_dtype_names(declared)
    try:
        dtype = parse_dtype(value, call, param)
    except AmpcoreError:
        hint = closest(str(value).strip().lower(), [n for n, d in DTYPE_NAMES.items() if d in declared], n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise AmpcoreError(f"{where}: unknown dtype name{suggestion}; {owner} declares: {valid}") from None
    if dtype not in declared:
        raise AmpcoreError(f"{where}: {owner} does not declare {dtype_name(dtype)}; it declares: {valid}")
    return dtype
