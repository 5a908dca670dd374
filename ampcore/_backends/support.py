"""Which dtypes a device runs: ``device_dtypes`` (the one answer every part of ampcore uses:
autocast's default dtype, the conformance suite, ``ampcore info``) and
``ampcore.is_float16_supported`` / ``is_bfloat16_supported`` (Paddle's and torch's questions).

The answer comes from the backend's adapter: the dtypes it declares (at load, without a
device) and its capability check for the device it finds
(:func:`ampcore.hookspec.ampcore_check_capability`): a declared dtype with an ``"error"``
finding is not run on that device.  The core knows no device names.
"""

from __future__ import annotations

import torch

from .backend import Backend
from .registry import DeviceLike, get_backend, resolve_device

__all__ = [
    "default_dtype_on",
    "device_dtypes",
    "is_bfloat16_supported",
    "is_dtype_supported",
    "is_float16_supported",
    "resolve_dtype",
]


def device_dtypes(backend: Backend, device_index: int = 0) -> tuple[torch.dtype, ...]:
    """The declared dtypes that device ``device_index`` of ``backend`` runs, the backend's
    default first: those whose capability check finds no ``"error"`` (empty when the
    backend is unavailable).

    Example::

        >>> import ampcore
        >>> from ampcore._backends.support import device_dtypes
        >>> device_dtypes(ampcore.get_backend("cpu"))
        (torch.bfloat16, torch.float16)
    """
    if not backend.is_available:
        return ()
    default = backend.default_dtype
    ordered = (default, *(d for d in backend.supported_dtypes if d != default))
    return tuple(
        d for d in ordered if not any(i.severity == "error" for i in backend.capability_issues(d, device_index))
    )


def default_dtype_on(backend: Backend, device_index: int = 0) -> torch.dtype:
    """The dtype for ``dtype=None`` on device ``device_index``: the backend's default where
    the device runs it, else the first declared dtype it runs (the default when it runs
    none or the backend is unavailable: the capability check then says why)."""
    found = device_dtypes(backend, device_index)
    return found[0] if found else backend.default_dtype


def resolve_dtype(
    backend: Backend, dtype: torch.dtype | str | None, device_index: int | None, call: str
) -> torch.dtype:
    """``dtype`` checked against the declared dtypes, or the device's default for ``None``."""
    if dtype is None:
        return default_dtype_on(backend, device_index or 0)
    return backend.check_dtype(dtype, call)


def is_dtype_supported(dtype: torch.dtype, device: DeviceLike = None) -> bool:
    """Whether mixed precision in ``dtype`` can run on ``device`` here.

    True when the backend is available, declares ``dtype`` and its capability check finds
    no error for the device.  A *warning* finding (e.g. "runs emulated: slower than
    float32") still counts as supported: :meth:`ampcore.Backend.capability_issues` and
    ``ampcore info`` say how well it runs.

    Raises:
        AmpcoreError: ``device`` names no installed backend (a typo is not "unsupported").
    """
    backend = get_backend(device)
    if not backend.is_available:
        return False
    return dtype in device_dtypes(backend, resolve_device(device).index or 0)


def is_float16_supported(device: DeviceLike = None) -> bool:
    """Whether float16 mixed precision can run on ``device`` (``None``: the best backend).

    Example::

        >>> import ampcore
        >>> ampcore.is_float16_supported("cpu")   # declared by the CPU adapter (emulated on some CPUs)
        True
    """
    return is_dtype_supported(torch.float16, device)


def is_bfloat16_supported(device: DeviceLike = None) -> bool:
    """Whether bfloat16 mixed precision can run on ``device`` (``None``: the best backend).

    See :func:`is_dtype_supported` for what counts as supported.

    Example::

        >>> import ampcore
        >>> ampcore.is_bfloat16_supported("cpu")
        True
    """
    return is_dtype_supported(torch.bfloat16, device)
