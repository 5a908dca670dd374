"""Public helpers for tools built on ampcore: the conformance suite, vendor test suites, benchmarks.

Everything here is a stable, documented entry to something the core already uses:

* dtypes: :func:`parse_dtype`, :func:`parse_declared_dtype` (the spellings every ampcore
  call accepts, and its errors), :func:`device_dtypes` (the declared dtypes a device runs);
* torch's own autocast: :func:`native_table`, :func:`dispatch_key_of`,
  :func:`has_native_autocast`, :func:`has_own_autocast_kernel`;
* values read from files, the environment or the command line: :func:`check_real`,
  :func:`check_integer` (ampcore's own validators: type, finiteness, range, and a message
  naming the source);
* a backend's device: :func:`memory_in_use`, :func:`peak_memory`, :func:`reset_peak_memory`,
  :func:`device_memory`, :func:`synchronize` (the adapter's ``ampcore_memory`` /
  ``ampcore_synchronize`` hooks, else ``torch.accelerator``).

Example::

    >>> import torch
    >>> from ampcore import toolkit
    >>> toolkit.parse_dtype("bf16"), toolkit.dispatch_key_of("cpu"), toolkit.native_table("cpu")["mm"]
    (torch.bfloat16, 'AutocastCPU', 'lower_precision_fp')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ._backends.backend import Backend
from ._backends.memory import device_memory, memory_in_use, peak_memory, reset_peak_memory, synchronize
from ._backends.support import device_dtypes as _device_dtypes
from ._dtypes import parse_declared_dtype as _parse_declared_dtype
from ._dtypes import parse_dtype as _parse_dtype
from ._policy import registration as _registration
from ._policy import torch_tables as _torch_tables
from ._validate import check_integer, check_real

__all__ = [
    "check_integer",
    "check_real",
    "device_dtypes",
    "device_memory",
    "dispatch_key_of",
    "has_native_autocast",
    "has_own_autocast_kernel",
    "memory_in_use",
    "native_table",
    "parse_declared_dtype",
    "parse_dtype",
    "peak_memory",
    "reset_peak_memory",
    "synchronize",
]


def device_dtypes(backend: Backend, device_index: int = 0) -> tuple[torch.dtype, ...]:
    """The dtypes device ``device_index`` of ``backend`` runs, the default first: those it
    declares whose ``ampcore_check_capability`` finds no error there (empty when the
    backend is unavailable).  What autocast's default dtype, ``ampcore info`` and the
    conformance suite use.

    Example::

        >>> import ampcore
        >>> device_dtypes(ampcore.get_backend("cpu"))
        (torch.bfloat16, torch.float16)
    """
    return _device_dtypes(backend, device_index)


def parse_dtype(value: object, call: str = "ampcore", param: str = "dtype") -> torch.dtype:
    """``value`` (a floating ``torch.dtype`` or a name: ``"bfloat16"``, ``"bf16"``, ``"half"``,
    ``"torch.float16"``...) as a ``torch.dtype``.

    Raises:
        AmpcoreError: anything else; the message names ``call`` and ``param`` (an option such
            as ``"--dtype"`` reads ``call --dtype value``) and lists the valid names.

    Example::

        >>> parse_dtype("fp16")
        torch.float16
        >>> parse_dtype("fp8", "mytool", "--dtype")
        Traceback (most recent call last):
        ...
        ampcore._errors.AmpcoreError: mytool --dtype fp8: unknown dtype name; valid: bfloat16 (bf16), float16 (fp16, half), float32 (fp32, float), float64 (fp64, double), or a floating torch.dtype
    """  # noqa: E501 - a doctest shows the whole one-line message
    return _parse_dtype(value, call, param)


def parse_declared_dtype(
    value: object, declared: Sequence[torch.dtype], owner: str, call: str = "ampcore", param: str = "dtype"
) -> torch.dtype:
    """:func:`parse_dtype` for a choice among ``declared`` (e.g. a backend's dtypes); the
    error names ``owner`` and lists only the declared dtypes.

    Example::

        >>> parse_declared_dtype("bf16", [torch.bfloat16], "backend 'cpu'")
        torch.bfloat16
    """
    return _parse_declared_dtype(value, declared, owner, call, param)


def native_table(device_type: str) -> Mapping[str, str]:
    """``{overload: cast policy}`` of torch's own autocast lists for ``device_type`` (the
    generic table when torch has none of its own), before any adapter adjustment.

    Policies are torch's names: ``"lower_precision_fp"``, ``"fp32"``, ``"promote"``,
    ``"fp32_set_opt_dtype"``, ``"fp32_append_dtype"``.

    Example::

        >>> native_table("cpu")["mm"], native_table("cuda")["softmax.int"]
        ('lower_precision_fp', 'fp32_set_opt_dtype')
    """
    return _torch_tables.native_table(device_type)


def dispatch_key_of(device_type: str) -> str:
    """The autocast dispatch key torch uses for ``device_type``.

    Example::

        >>> dispatch_key_of("cpu"), dispatch_key_of("npu")
        ('AutocastCPU', 'AutocastPrivateUse1')
    """
    return _torch_tables.dispatch_key_of(device_type)


def has_native_autocast(device_type: str) -> bool:
    """Whether ``device_type``'s autocast key has kernels of its own (not ampcore's);
    ``False`` means ampcore provides its autocast.

    Example::

        >>> has_native_autocast("cpu")
        True
    """
    return _registration.has_native_autocast(device_type)


def has_own_autocast_kernel(op: str, device_type: str) -> bool:
    """Whether ATen overload ``op`` has an autocast kernel of the device's own (torch's, an
    extension's, the vendor's) on ``device_type``'s autocast key, ampcore's kernels not
    counted (the conformance suite checks a composite with such a kernel like any kernel).

    Example::

        >>> has_own_autocast_kernel("mm", "cpu"), has_own_autocast_kernel("relu", "cpu")
        (True, False)
    """
    return _registration.has_own_autocast_kernel(op, device_type)
