"""A pure-Python PrivateUse1 torch device for testing ampcore backends (no C++, no hardware).

``install(name, autocast=...)`` renames PrivateUse1 to ``name`` and makes it a working torch
device whose kernels are the CPU's: tensors, autograd, optimizers, ``.to()``/``.cpu()``,
``torch.autocast(name)`` with the chosen registrations (see :mod:`._autocast`).

Example::

    >>> import torch, ampcore_testdevice
    >>> ampcore_testdevice.install("acme", autocast="fallthrough")
    >>> (torch.ones(2, device="acme") * 3).cpu().tolist()
    [3.0, 3.0]

Limits (those of a device written in Python): one device; no pinned memory, streams or
memory statistics; ``torch.save`` of device tensors; tensors cannot be resized in place.
A process hosts one PrivateUse1 device: ``install`` again with the same arguments is a
no-op, with others an error.
"""

from __future__ import annotations

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from ._autocast import MODES, PARTIAL, Mode, register
from ._module import DeviceModule
from ._tensors import from_cpu, install_fallback, to_cpu

__all__ = ["MODES", "PARTIAL", "Mode", "from_cpu", "install", "installed", "to_cpu"]

_installed: tuple[str, str] | None = None


def installed() -> tuple[str, Mode] | None:
    """``(name, autocast mode)`` of the device installed in this process, or None."""
    return _installed  # type: ignore[return-value]


def install(name: str = "acme", autocast: Mode = "none") -> None:
    """Make ``name`` a torch device type backed by CPU kernels, with ``autocast``'s
    registrations on its autocast key (``"none"``, ``"fallthrough"``, ``"partial"``,
    ``"generic"``).

    Raises:
        ValueError: an unknown mode, or a different device already installed (torch has one
            PrivateUse1 key per process).
    """
    global _installed
    if autocast not in MODES:
        raise ValueError(f"ampcore_testdevice.install(autocast={autocast!r}): expected one of {', '.join(MODES)}")
    if _installed == (name, autocast):
        return
    if _installed is not None:
        raise ValueError(
            f"ampcore_testdevice.install({name!r}, autocast={autocast!r}): this process already has "
            f"{_installed[0]!r} with autocast={_installed[1]!r} (one PrivateUse1 device per process)"
        )
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", name):
        raise ValueError(f"ampcore_testdevice.install({name!r}): PrivateUse1 is already {current!r} in this process")
    _setup_privateuseone_for_python_backend(name, backend_module=DeviceModule(name))
    install_fallback()
    register(autocast, name)
    _installed = (name, autocast)
