"""The answers an adapter gives once, when it is loaded, checked field by field.

* :func:`read_identity`: who the backend is, from the :class:`~ampcore.hookspec.BackendSpec`
  that ``ampcore_backend()`` returned (its name, device type, dtypes, default dtype,
  priority, master-update chunk and one-pass flag);
* :func:`read_adjustments`: what ``ampcore_op_list_adjustments(dtype)`` returned, as
  canonical op names per list.

Pure functions: each raises the error ``error(message)`` makes (the caller's
:class:`~ampcore.PluginError` naming the plugin), with the field, what it held and what is
valid.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import torch

from .._dtypes import dtype_name
from .._errors import AmpcoreError
from .._op_names import canonical_ops
from ..hookspec import BackendSpec

__all__ = ["ADJUSTMENT_KEYS", "Identity", "read_adjustments", "read_identity"]

#: The keys ``ampcore_op_list_adjustments`` may use.
ADJUSTMENT_KEYS: Final = ("white", "black", "promote")

_NAME_RE: Final = re.compile(r"^[a-z][a-z0-9_\-]*$")
#: Makes the error to raise from a message (a PluginError naming the plugin).
ErrorFactory = Callable[[str], Exception]


@dataclass(frozen=True)
class Identity:
    """Who a backend is: the fields of its :class:`~ampcore.hookspec.BackendSpec`, checked
    (``dtypes`` as a tuple, ``default_dtype`` filled in)."""

    name: str
    device_type: str
    supported_dtypes: tuple[torch.dtype, ...]
    default_dtype: torch.dtype
    priority: int
    master_update_chunk_elements: int | None
    master_update_onepass: bool


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_identity(spec: object, error: ErrorFactory) -> Identity:
    """The :class:`Identity` in ``spec`` (what ``ampcore_backend()`` returned), or the error
    ``error`` makes naming the first wrong field.

    Example::

        >>> import torch
        >>> read_identity(BackendSpec("acme", "cpu", [torch.bfloat16]), ValueError).default_dtype
        torch.bfloat16
    """
    if not isinstance(spec, BackendSpec):
        raise error(
            f"ampcore_backend() returned {spec!r}; expected an ampcore.BackendSpec such as "
            "BackendSpec(name='acme', device_type='acme', dtypes=[torch.bfloat16])"
        )
    name, device_type, raw = spec.name, spec.device_type, spec.dtypes
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise error(
            f"ampcore_backend() gave name={name!r}; expected a lower-case name of "
            "letters, digits, '_' or '-' (no ':'), e.g. 'cuda'"
        )
    if not isinstance(device_type, str) or not device_type:
        raise error(f"ampcore_backend() gave device_type={device_type!r}; expected e.g. 'cuda'")
    dtypes = tuple(raw) if isinstance(raw, (list, tuple)) else ()
    bad = [d for d in dtypes if not isinstance(d, torch.dtype) or not d.is_floating_point]
    if not dtypes or bad or len(set(dtypes)) != len(dtypes):
        raise error(
            f"ampcore_backend() gave dtypes={raw!r}; expected a non-empty "
            "list of distinct floating torch dtypes such as [torch.bfloat16]"
        )
    default = dtypes[0] if spec.default_dtype is None else spec.default_dtype
    if not isinstance(default, torch.dtype) or default not in dtypes:
        raise error(
            f"ampcore_backend() gave default_dtype={default!r}, which is not among its "
            f"supported dtypes {[dtype_name(d) for d in dtypes]}"
        )
    if not _is_int(spec.priority):
        raise error(f"ampcore_backend() gave priority={spec.priority!r}; expected an int")
    chunk = getattr(spec, "master_update_chunk_elements", None)
    if chunk is not None and (not _is_int(chunk) or chunk < 1):
        raise error(
            f"ampcore_backend() gave master_update_chunk_elements={chunk!r}; expected None "
            "(whole-tensor master-weight updates) or a positive number of elements such as 262144"
        )
    onepass = getattr(spec, "master_update_onepass", False)
    if not isinstance(onepass, bool):
        raise error(f"ampcore_backend() gave master_update_onepass={onepass!r}; expected True or False")
    return Identity(name, device_type, dtypes, default, spec.priority, chunk, onepass)


def read_adjustments(raw: object, hook: str, error: ErrorFactory) -> dict[str, frozenset[str]]:
    """The op-list adjustments in ``raw`` (what ``hook``, ``ampcore_op_list_adjustments(dtype)``,
    returned) as canonical op names per key; an op under two keys is an error.

    Example::

        >>> read_adjustments({"black": ["layer_norm"], "white": None}, "hook", ValueError)
        {'black': frozenset({'layer_norm'})}
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise error(f"{hook} returned {raw!r}; expected None or a dict such as {{'black': ['layer_norm']}}")
    bad = [key for key in raw if key not in ADJUSTMENT_KEYS]
    if bad:
        raise error(f"{hook} returned keys {bad!r}; valid keys: 'white', 'black', 'promote'")
    adjusted: dict[str, frozenset[str]] = {}
    for key, ops in raw.items():
        if ops is None:
            continue
        if not isinstance(ops, (str, list, tuple, set, frozenset)):
            raise error(
                f"{hook} returned {dict(raw)!r}; each value must be a list or set of op names, "
                f"got {type(ops).__name__} under {key!r}"
            )
        try:
            names = canonical_ops(ops, hook, key)
        except AmpcoreError as exc:
            raise error(str(exc)) from None
        if names:
            adjusted[key] = names
    seen: dict[str, str] = {}
    for key, names in adjusted.items():
        for op in sorted(names):
            if op in seen:
                raise error(f"{hook} puts {op!r} under both {seen[op]!r} and {key!r}")
            seen[op] = key
    return adjusted
