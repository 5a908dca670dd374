"""What the device's *own* autocast kernels do, measured in a fresh process.

``python -m ampcore_conformance._native BACKEND DTYPE`` prints one JSON object: whether the
device type has native autocast kernels, and for every op of the backend's O1 lists that the
suite has a sample for, whether the device's autocast key has a kernel for it and the dtype
the op returns under plain ``torch.autocast``.

A fresh process, because once ampcore provides autocast for a PrivateUse1 device its kernels
sit on the device's own autocast key (replacing the vendor's), and the conformance run's
own regions may already have put them there.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

import ampcore
from ampcore_conformance._context import parse_dtype
from ampcore_conformance._lists import category
from ampcore_conformance._op_samples import SAMPLES, OpSample

__all__ = ["disagreements", "measure"]

#: list -> the input dtypes of the probe: ``"low"`` or ``"fp32"`` per floating input (cycled)
_INPUTS = {"white": ("fp32",), "black": ("low",), "promote": ("low", "fp32")}


def _run(sample: OpSample, where: str, dtype: torch.dtype, device: torch.device) -> str:
    dtypes = [dtype if kind == "low" else torch.float32 for kind in _INPUTS[where]]
    try:
        with torch.autocast(device.type, dtype=dtype):
            out = sample.run(sample.inputs(dtypes, device), device)
    except Exception as exc:  # reported, not raised: the ampcore checks cover ops that fail
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return str(out.real.dtype if out.is_complex() else out.dtype).removeprefix("torch.")


def measure(backend_name: str, dtype: torch.dtype) -> dict[str, Any]:
    """``{"native": bool, "key": str, "adjusted": bool, "ops": {op: {"list", "kernel", "got"}}}``."""
    from ampcore.toolkit import dispatch_key_of, has_native_autocast

    backend = ampcore.get_backend(backend_name)
    backend.require_available()
    device = torch.device(backend.device_type, 0)
    key = dispatch_key_of(backend.device_type)
    lists = ampcore.oplists(backend.name, dtype=dtype, level="O1")
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    ops: dict[str, dict[str, Any]] = {}
    for op, sample in sorted(SAMPLES.items()):
        where = category(lists, op)
        if where not in _INPUTS:
            continue
        overloads = [o for o in lists.overloads if o.partition(".")[0] == op] or [op]
        kernel = any(has_kernel(f"aten::{o}", key) for o in overloads)
        ops[op] = {"list": where, "kernel": kernel, "got": _run(sample, where, dtype, device)}
    return {
        "native": has_native_autocast(backend.device_type),
        "key": key,
        "adjusted": bool(backend.op_list_adjustments(dtype)),
        "ops": ops,
    }


def disagreements(found: dict[str, Any], dtype: torch.dtype) -> list[str]:
    """What :func:`measure` found that disagrees with the lists (empty: none).

    A kernel the device has must give the list's dtype.  An op without a kernel is fine
    when the adapter declares adjustments (ampcore's kernels then apply the lists in every
    region), and wrong otherwise (ampcore leaves uncustomised O1 to the device's kernels).
    Ops that raise are left to the other checks.

    Example::

        >>> found = {"key": "AutocastPrivateUse1", "adjusted": False, "ops": {
        ...     "mm": {"list": "white", "kernel": True, "got": "float16"},
        ...     "softmax": {"list": "black", "kernel": False, "got": "float16"}}}
        >>> print(*disagreements(found, torch.float16))
        softmax: no AutocastPrivateUse1 kernel, so torch.autocast returns float16; the lists put it on the black list (float32)
    """  # noqa: E501 - a doctest shows the whole one-line message
    wanted = {"white": str(dtype).removeprefix("torch."), "black": "float32", "promote": "float32"}
    wrong = []
    for op, seen in found["ops"].items():
        want, got = wanted[seen["list"]], seen["got"]
        if got.startswith("error") or got == want:
            continue
        if seen["kernel"]:
            wrong.append(
                f"{op}: the {found['key']} kernel returns {got}; the lists put it on the {seen['list']} list ({want})"
            )
        elif not found["adjusted"]:
            wrong.append(
                f"{op}: no {found['key']} kernel, so torch.autocast returns {got}; "
                f"the lists put it on the {seen['list']} list ({want})"
            )
    return wrong


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], parse_dtype(sys.argv[2]))))
