"""THIS IS A TEMPLATE: the ampcore adapter of a PrivateUse1 device called ``acme``.

``acme`` is ampcore's pure-Python test device (``ampcore_testdevice``); in your copy, its
place is taken by your torch extension (``torch_acme``), which renames PrivateUse1, registers
the device module and its kernels when imported.  See README.md for the walk-through.

What a PrivateUse1 adapter must get right, and where this template does it:

* **the device type** is the name your extension renamed PrivateUse1 to
  (``device_type`` of :func:`ampcore_backend`);
* **import the extension lazily** and turn every failure into a reason
  (:func:`ampcore_unavailable_reason`): a machine without it lists the backend as
  unavailable instead of breaking;
* **the op lists** (:func:`ampcore_op_list_adjustments`) must describe the autocast kernels
  your extension *really* registers on ``AutocastPrivateUse1``: ampcore starts from torch's
  generic lists (what torch registers for XPU) and applies your differences.  Registered no
  kernels at all?  Then ampcore provides autocast for your device with exactly these lists
  (about 3 us per op); ``ampcore conformance`` proves the declaration against your kernels
  (``test_device_autocast_kernels_match_the_lists``);
* **synchronisation and memory**: ``torch.accelerator`` knows neither for a Python-registered
  device; :func:`ampcore_synchronize` waits for the device, and :func:`ampcore_memory` is
  left out, so ``ampcore bench`` prints memory as unavailable.

``AMPCORE_ACME_AUTOCAST`` (``none``, ``fallthrough``, ``partial``, ``generic``; default
``none``) chooses which autocast kernels the test device registers, so that CI can prove
every situation a vendor can be in.  A real adapter has no such switch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Final

import torch

from ampcore import BackendSpec, hookimpl

#: The adapter contract this plugin targets (ampcore.hookspec).
AMPCORE_CONTRACT = 2

#: The device type (the name PrivateUse1 is renamed to) and the backend name users pass.
BACKEND: Final = "acme"
#: Which autocast kernels the test device registers (a real device has one answer).
AUTOCAST_ENV: Final = "AMPCORE_ACME_AUTOCAST"


def autocast_mode() -> str:
    """The test device's autocast registrations, from ``AMPCORE_ACME_AUTOCAST``."""
    return os.environ.get(AUTOCAST_ENV, "none").strip() or "none"


def adjustments_for(mode: str, dtype: torch.dtype) -> dict[str, list[str]] | None:
    """How the kernels of ``mode`` differ from torch's generic lists (a pure function).

    ``none``/``fallthrough`` register no kernels (ampcore provides the generic lists);
    ``generic`` registers exactly them; ``partial`` registers ``mm`` (low precision, as the
    generic lists) and ``dot`` in float32 where the generic lists promote it.

    Example::

        >>> adjustments_for("partial", torch.float16)
        {'black': ['dot']}
        >>> adjustments_for("generic", torch.float16) is None
        True
    """
    if mode == "partial":
        return {"black": ["dot"]}
    return None


# -- the required hook --------------------------------------------------------------------


@hookimpl
def ampcore_backend() -> BackendSpec:
    return BackendSpec(
        name=BACKEND,
        device_type=BACKEND,  # the name your extension renamed PrivateUse1 to (torch_npu: "npu")
        dtypes=[torch.bfloat16, torch.float16],  # torch.acme.get_amp_supported_dtype(), default first
        priority=-20,  # a test device must never be chosen by device=None over a real one (cpu is 0)
    )


# -- optional hooks ------------------------------------------------------------------------


@hookimpl
def ampcore_unavailable_reason() -> str | None:
    # Your copy:  try: import torch_acme  except Exception as exc: return f"...{exc}"
    try:
        import ampcore_testdevice

        ampcore_testdevice.install(BACKEND, autocast=autocast_mode())  # type: ignore[arg-type]
    except Exception as exc:
        return f"installing the acme test device failed ({type(exc).__name__}: {exc})"
    return None


@hookimpl
def ampcore_device_count() -> int:
    return int(torch.acme.device_count())  # type: ignore[attr-defined]


@hookimpl
def ampcore_device_name(device_index: int) -> str:
    # the test device's autocast registrations, in place of a chip name
    return f"acme TEMPLATE device ({autocast_mode()})"


@hookimpl
def ampcore_needs_loss_scaling(dtype: torch.dtype) -> bool:
    return dtype == torch.float16


@hookimpl
def ampcore_op_list_adjustments(dtype: torch.dtype) -> Mapping[str, Sequence[str]] | None:
    return adjustments_for(autocast_mode(), dtype)


@hookimpl
def ampcore_synchronize(device_index: int) -> None:
    # torch.accelerator.synchronize() is unsupported for a device registered from Python;
    # ask your own runtime (torch.acme.synchronize() here: nothing to wait for).
    torch.acme.synchronize(device_index)  # type: ignore[attr-defined]


# The memory hook (ampcore_memory) is left out: the test device cannot measure memory, so
# `ampcore bench` prints "unavailable".  Implement it with your runtime's allocator statistics.
