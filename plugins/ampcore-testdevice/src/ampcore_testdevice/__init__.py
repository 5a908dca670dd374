"""A pure-Python PrivateUse1 torch device for testing ampcore backends (no C++, no hardware).

``install(name, autocast=...)`` renames PrivateUse1 to ``name`` and makes it a working torch
device whose kernels are the CPU's: tensors, autograd, optimizers, ``.to()``/``.cpu()``,
``torch.autocast(name)`` with the chosen registrations (see :mod:`._autocast`), and
float16 arithmetic that is IEEE (``fp16="ieee"``) or saturating with an overflow flag
(``fp16="saturate"``, an fp16-only chip: see :mod:`._saturate`).

Example::

    >>> import torch, ampcore_testdevice
    >>> ampcore_testdevice.install("acme", autocast="fallthrough")
    >>> (torch.ones(2, device="acme") * 3).cpu().tolist()
    [3.0, 3.0]

Limits (those of a device written in Python): one device; no pinned memory, streams or
memory statistics; ``torch.save`` of device tensors; tensors cannot be resized in place.
A process hosts one PrivateUse1 device: ``install`` again with the same arguments is a
no-op, with others an error.  It needs a torch that registers a PrivateUse1 device from
Python (``torch.utils.backend_registration._setup_privateuseone_for_python_backend`` and
``torch._C._acc``; torch 2.8 has neither): :func:`unsupported_reason` says whether this one
does, and ``install`` raises with that reason where it does not.
"""

from __future__ import annotations

import torch
from torch.utils import backend_registration

from ._autocast import MODES, PARTIAL, Mode, register
from ._module import DeviceModule
from ._saturate import FP16_MODES, Fp16Mode, clear_overflow_flag, enable, overflow_raised
from ._tensors import from_cpu, install_fallback, to_cpu

__all__ = [
    "FP16_MODES",
    "MODES",
    "PARTIAL",
    "Fp16Mode",
    "Mode",
    "clear_overflow_flag",
    "from_cpu",
    "install",
    "installed",
    "overflow_flag",
    "to_cpu",
    "unsupported_reason",
]

_installed: tuple[str, str, str] | None = None


def installed() -> tuple[str, Mode, Fp16Mode] | None:
    """``(name, autocast mode, fp16 mode)`` of the device installed in this process, or None."""
    return _installed  # type: ignore[return-value]


def unsupported_reason() -> str | None:
    """Why this torch cannot host the test device, or None when it can (a capability check:
    registering a PrivateUse1 device from Python needs two torch APIs that torch 2.8 lacks).

    Example::

        >>> import ampcore_testdevice
        >>> reason = ampcore_testdevice.unsupported_reason()   # None on torch 2.13
        >>> reason is None or "cannot register a PrivateUse1 device from Python" in reason
        True
    """
    missing = [
        api
        for api, present in (
            (
                "torch.utils.backend_registration._setup_privateuseone_for_python_backend",
                hasattr(backend_registration, "_setup_privateuseone_for_python_backend"),
            ),
            ("torch._C._acc", hasattr(torch._C, "_acc")),
        )
        if not present
    ]
    if not missing:
        return None
    return (
        f"torch {torch.__version__} cannot register a PrivateUse1 device from Python "
        f"(it lacks {' and '.join(missing)}), so the pure-Python test device cannot be installed"
    )


def install(name: str = "acme", autocast: Mode = "none", fp16: Fp16Mode = "ieee") -> None:
    """Make ``name`` a torch device type backed by CPU kernels, with ``autocast``'s
    registrations on its autocast key (``"none"``, ``"fallthrough"``, ``"partial"``,
    ``"generic"``) and IEEE (``"ieee"``) or saturating (``"saturate"``) float16 arithmetic.

    A saturating device is an fp16-only chip: ``torch.<name>.get_amp_supported_dtype()``
    lists float16 only, and overflows raise the flag read by :func:`overflow_flag`.

    Raises:
        ValueError: an unknown mode, or a different device already installed (torch has one
            PrivateUse1 key per process).
        RuntimeError: this torch cannot host the device (:func:`unsupported_reason`).
    """
    global _installed
    call = f"ampcore_testdevice.install({name!r}, autocast={autocast!r}, fp16={fp16!r})"
    if autocast not in MODES:
        raise ValueError(f"{call}: autocast must be one of {', '.join(MODES)}")
    if fp16 not in FP16_MODES:
        raise ValueError(f"{call}: fp16 must be one of {', '.join(FP16_MODES)}")
    if _installed == (name, autocast, fp16):
        return
    reason = unsupported_reason()
    if reason is not None:
        raise RuntimeError(f"{call}: {reason}")
    if _installed is not None:
        raise ValueError(
            f"{call}: this process already has {_installed[0]!r} with autocast={_installed[1]!r}, "
            f"fp16={_installed[2]!r} (one PrivateUse1 device per process)"
        )
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", name):
        raise ValueError(f"{call}: PrivateUse1 is already {current!r} in this process")
    dtypes = [torch.float16] if fp16 == "saturate" else [torch.float16, torch.bfloat16]
    backend_registration._setup_privateuseone_for_python_backend(name, backend_module=DeviceModule(name, dtypes))
    install_fallback()
    register(autocast, name)
    if fp16 == "saturate":
        enable()
    _installed = (name, autocast, fp16)


def overflow_flag() -> torch.Tensor:
    """The device's overflow status as a one-element float32 device tensor (> 0: an
    overflow happened since :func:`clear_overflow_flag`; always 0 on an IEEE device).

    Example::

        >>> import torch, ampcore_testdevice
        >>> ampcore_testdevice.install("acme", autocast="fallthrough")
        >>> float(overflow_flag().cpu())
        0.0
    """
    return from_cpu(overflow_raised())
