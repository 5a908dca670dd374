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
  left out, so ``ampcore bench`` prints memory as unavailable;
* **the dtypes** (``dtypes`` of :func:`ampcore_backend`) are read at load, before the
  extension is imported: list your product line's (what ``get_amp_supported_dtype()``
  returns on your devices); refuse one on a chip without it with an ``"error"``
  ``CapabilityIssue`` from ``ampcore_check_capability``;
* **overflow on saturating arithmetic**: a chip whose fp16 clamps to +-65504 and raises a
  status flag instead of producing inf/nan implements ``ampcore_device_overflow_flag`` and
  ``ampcore_clear_device_overflow_flag`` (docs/writing-a-backend.md, item 5); without them
  ``GradScaler`` takes an overflowed step.  ``acme`` produces inf, like the CPU it runs on.

* **dtypes that depend on the chip**: the dtypes are declared once, at load, without a
  device; :func:`ampcore_check_capability` refuses (an ``"error"`` finding) those the chip
  found here cannot run, and ampcore then leaves them out of everything done on that device;
* **an overflow flag** where the chip saturates instead of producing inf/nan
  (:func:`ampcore_device_overflow_flag`, :func:`ampcore_clear_device_overflow_flag`).

``AMPCORE_ACME_AUTOCAST`` (``none``, ``fallthrough``, ``partial``, ``generic``; default
``none``) chooses which autocast kernels the test device registers, and
``AMPCORE_ACME_FP16`` (``ieee``, default, or ``saturate``: an fp16-only chip whose float16
arithmetic clamps to +-65504 and raises an overflow flag) what its float16 arithmetic does,
so that CI can prove every situation a vendor can be in.  A real adapter has no such switch.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Final

import torch

from ampcore import BackendSpec, CapabilityIssue, hookimpl

#: The adapter contract this plugin targets (ampcore.hookspec).
AMPCORE_CONTRACT = 2

#: The device type (the name PrivateUse1 is renamed to) and the backend name users pass.
BACKEND: Final = "acme"
#: Which autocast kernels the test device registers (a real device has one answer).
AUTOCAST_ENV: Final = "AMPCORE_ACME_AUTOCAST"


#: What the test device's float16 arithmetic does on overflow (a real chip has one answer).
FP16_ENV: Final = "AMPCORE_ACME_FP16"


def autocast_mode() -> str:
    """The test device's autocast registrations, from ``AMPCORE_ACME_AUTOCAST``."""
    return os.environ.get(AUTOCAST_ENV, "none").strip() or "none"


def fp16_mode() -> str:
    """The test device's float16 arithmetic (``ieee`` or ``saturate``), from ``AMPCORE_ACME_FP16``."""
    return os.environ.get(FP16_ENV, "ieee").strip() or "ieee"


def capability_issues(dtype: torch.dtype, device_dtypes: Sequence[torch.dtype], device: str) -> list[CapabilityIssue]:
    """Refuse ``dtype`` when the chip's runtime does not list it (a pure function).

    Example::

        >>> [i.severity for i in capability_issues(torch.bfloat16, [torch.float16], "acme:0")]
        ['error']
        >>> capability_issues(torch.float16, [torch.float16], "acme:0")
        []
    """
    if dtype in device_dtypes:
        return []
    listed = ", ".join(str(d) for d in device_dtypes)
    return [CapabilityIssue("error", f"{dtype} is not supported by {device} (the chip runs {listed} only)")]


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
        dtypes=[torch.bfloat16, torch.float16],  # the product line's, default first (read at load)
        priority=-10,  # a test device must never be chosen by device=None over a real one (cpu is 0)
    )


# -- optional hooks ------------------------------------------------------------------------


@hookimpl
def ampcore_unavailable_reason() -> str | None:
    # Your copy:  try: import torch_acme  except Exception as exc: return f"...{exc}"
    try:
        import ampcore_testdevice

        ampcore_testdevice.install(BACKEND, autocast=autocast_mode(), fp16=fp16_mode())  # type: ignore[arg-type]
    except Exception as exc:
        return f"installing the acme test device failed ({type(exc).__name__}: {exc})"
    return None


@hookimpl
def ampcore_device_count() -> int:
    return int(torch.acme.device_count())  # type: ignore[attr-defined]


@hookimpl
def ampcore_device_name(device_index: int) -> str:
    # the test device's autocast registrations, in place of a chip name
    return f"acme TEMPLATE device ({autocast_mode()}, fp16 {fp16_mode()})"


@hookimpl
def ampcore_check_capability(dtype: torch.dtype, device_index: int) -> list[CapabilityIssue]:
    # your copy: what your runtime says this chip runs (torch_npu: the SoC version)
    supported = torch.acme.get_amp_supported_dtype()  # type: ignore[attr-defined]
    return capability_issues(dtype, supported, f"{BACKEND}:{device_index}")


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


@hookimpl
def ampcore_device_overflow_flag(device: torch.device) -> torch.Tensor | None:
    # a chip that saturates: its runtime's overflow status (torch_npu: npu_get_float_status);
    # a chip whose arithmetic produces inf/nan needs no flag (return None)
    if fp16_mode() != "saturate":
        return None
    import ampcore_testdevice

    return ampcore_testdevice.overflow_flag()


@hookimpl
def ampcore_clear_device_overflow_flag(device: torch.device) -> None:
    if fp16_mode() == "saturate":
        import ampcore_testdevice

        ampcore_testdevice.clear_overflow_flag()


# -- level="auto": costs from a cost model instead of ampcore's micro-benchmarks --------------

#: The sustained figures of the (fictional) acme chip that the cost model below reads.  In
#: your copy: your chip's datasheet or profiler numbers.  (The test device itself runs the
#: host CPU's kernels, so these describe the chip a vendor would ship, not this machine.)
DATASHEET: Final[Mapping[str, object]] = {
    "fp32_tflops": 20.0,
    "low_tflops": {torch.float16: 80.0, torch.bfloat16: 80.0},
    "bandwidth_gbs": 400.0,
    "launch_us": 5.0,  # fixed cost of one kernel launch
}

_LINEAR: Final = re.compile(
    r"Linear\(in_features=(\d+), out_features=(\d+), bias=(?:True|False)\) "
    r"in=\[(\d+(?:x\d+)*)(?::\w+)?\] (grad|no-grad)"
)


def linear_costs(
    shape_class: str, dtype: torch.dtype, sheet: Mapping[str, object] = DATASHEET
) -> dict[str, float] | None:
    """Roofline costs (ms) of one ``nn.Linear`` shape class on the chip of ``sheet``.

    Each of forward, and with ``grad`` the two backward matmuls, takes the longer of its
    compute (2 flops per multiply-add at the dtype's throughput) and its memory traffic
    (input, weight and output at the dtype's width), plus one kernel launch; the
    low-precision path also pays two cast kernels, of input and weight (read float32, write
    low precision), which small layers do not earn back.  ``None`` (let ampcore
    measure) for other module kinds, several inputs, or a dtype the sheet does not list.

    Example::

        >>> layer = "Linear(in_features=4096, out_features=4096, bias=True)"
        >>> big = linear_costs(f"{layer} in=[4096x4096] grad", torch.float16)
        >>> big["low_ms"] < big["fp32_ms"]
        True
        >>> tiny = linear_costs("Linear(in_features=16, out_features=16, bias=True) in=[16x16] grad", torch.float16)
        >>> tiny["low_ms"] > tiny["fp32_ms"]
        True
        >>> linear_costs("Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1)) in=[8x4x32x32] grad", torch.float16) is None
        True
    """
    match = _LINEAR.fullmatch(shape_class)
    low_tflops = dict(sheet["low_tflops"]).get(dtype)  # type: ignore[call-overload]
    if match is None or low_tflops is None:
        return None
    features_in, features_out = int(match[1]), int(match[2])
    rows = math.prod(int(d) for d in match[3].split("x")[:-1])
    passes = 3 if match[4] == "grad" else 1
    flops = 2.0 * rows * features_in * features_out * passes
    elements = (rows * features_in + features_in * features_out + rows * features_out) * passes
    bandwidth = float(sheet["bandwidth_gbs"]) * 1e9  # type: ignore[arg-type]
    launch_ms = float(sheet["launch_us"]) * 1e-3  # type: ignore[arg-type]
    fp32_tflops = float(sheet["fp32_tflops"])  # type: ignore[arg-type]
    fp32_ms = max(flops / (fp32_tflops * 1e12), elements * 4 / bandwidth) * 1e3 + passes * launch_ms
    cast_ms = (rows * features_in + features_in * features_out) * (4 + 2) / bandwidth * 1e3 + 2 * launch_ms
    low_ms = max(flops / (low_tflops * 1e12), elements * 2 / bandwidth) * 1e3 + passes * launch_ms + cast_ms
    return {"fp32_ms": fp32_ms, "low_ms": low_ms, "cast_ms": cast_ms}


@hookimpl
def ampcore_auto_costs(shape_class: str, dtype: torch.dtype) -> Mapping[str, float] | None:
    return linear_costs(shape_class, dtype)


# The memory hook (ampcore_memory) is left out: the test device cannot measure memory, so
# `ampcore bench` prints "unavailable".  Implement it with your runtime's allocator statistics.
