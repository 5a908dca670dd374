"""``ampcore.is_float16_supported`` / ``is_bfloat16_supported`` (Paddle's and torch's questions).

The answer comes from the backend's adapter: the dtypes it declares and its capability
check for the device (:func:`ampcore.hookspec.ampcore_check_capability`).  The core knows
no device names.
"""

from __future__ import annotations

import torch

from .registry import DeviceLike, get_backend, resolve_device

__all__ = ["is_bfloat16_supported", "is_dtype_supported", "is_float16_supported"]


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
    if not backend.is_available or dtype not in backend.supported_dtypes:
        return False
    index = resolve_device(device).index or 0
    return not any(issue.severity == "error" for issue in backend.capability_issues(dtype, index))


def is_float16_supported(device: DeviceLike = None) -> bool:
    """Whether float16 mixed precision can run on ``device`` (``None``: the best backend).

    Example::

        >>> import ampcore
        >>> ampcore.is_float16_supported("cpu")   # declared by the CPU adapter (emulated on some CPUs)
        True
        >>> ampcore.is_bfloat16_supported("cpu")
        True
    """
    return is_dtype_supported(torch.float16, device)


def is_bfloat16_supported(device: DeviceLike = None) -> bool:
    """Whether bfloat16 mixed precision can run on ``device`` (``None``: the best backend).

    See :func:`is_dtype_supported` for what counts as supported.
    """
    return is_dtype_supported(torch.bfloat16, device)
