"""NPU adapter: float16 (default) and bfloat16 autocast on Huawei Ascend NPUs via torch_npu.

``torch_npu`` renames torch's PrivateUse1 device to ``"npu"`` and registers its own
``AutocastPrivateUse1`` kernels (the same policy lists as CUDA's), so ``torch.autocast("npu")``
and torch's scaler kernels work once it is imported.  It is imported lazily, the first time
the backend is used or listed, and every failure to import it (not installed, no Ascend CANN
toolkit, a torch/torch_npu version mismatch) makes the backend *unavailable* with the reason;
nothing else is affected.

bfloat16 needs an Ascend 910B or later (``torch.npu.is_bf16_supported()``); ``npu`` declares
both dtypes because dtypes are read without a device, and the capability check raises for
bf16 on an NPU without it.

Overflow: SoCs before the Ascend 910B (and any SoC with ``INF_NAN_MODE_ENABLE=0``) run in
*saturation mode*: an fp16 overflow saturates to +-65504 instead of producing inf, so a
non-finite check on the gradients sees nothing.  There the adapter reads and clears the
chip's float-status register (``torch_npu.npu_get_float_status`` /
``torch_npu.npu_clear_float_status``) on the device; the scaler ORs it into ``found_inf``
before the distributed all-reduce.  In INF_NAN mode the flag hooks return ``None``.

torch_npu documents no NPU-specific change to the fp16 op lists (its ``AutoCastOps.cpp``
registers the upstream CUDA policies), so ``ampcore_op_list_adjustments`` is not implemented.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Final, Literal

import torch

from ampcore import BackendSpec, CapabilityIssue, hookimpl

#: The adapter contract this plugin targets (ampcore.hookspec).
AMPCORE_CONTRACT = 2

#: ``c10_npu::SocVersion`` values (torch_npu/csrc/core/npu/NpuVariables.h) that set the rules.
ASCEND_910B1: Final = 220
ASCEND_310B1: Final = 240
ASCEND_910_9391: Final = 250

OverflowDetection = Literal["inf_nan", "float_status"]


@dataclass(frozen=True)
class NpuDeviceProperties:
    """What the adapter needs to know about one Ascend NPU (recordable, testable).

    ``soc_version`` is ``torch_npu.npu.get_soc_version()`` (the ``SocVersion`` enum value,
    e.g. 102 for Ascend910A, 220 for Ascend910B1).  ``bf16_supported`` is
    ``torch.npu.is_bf16_supported()`` and ``inf_nan_mode`` is
    ``torch_npu.npu.utils.is_support_inf_nan()`` when they were read, else ``None``: then the
    SoC version decides, with torch_npu's own rules.
    """

    name: str
    soc_version: int | None = None
    bf16_supported: bool | None = None
    inf_nan_mode: bool | None = None

    @property
    def where(self) -> str:
        soc = "unknown" if self.soc_version is None else str(self.soc_version)
        return f"current NPU is {self.name} (SoC version {soc})"


def supports_bf16(props: NpuDeviceProperties) -> bool | None:
    """torch.npu.is_bf16_supported() when recorded, else torch_npu's rule: SoC >= Ascend910B1."""
    if props.bf16_supported is not None:
        return props.bf16_supported
    if props.soc_version is None:
        return None
    return props.soc_version >= ASCEND_910B1


def overflow_detection(props: NpuDeviceProperties) -> OverflowDetection:
    """How overflow shows on this NPU: ``"inf_nan"`` (infs and nans in the results) or
    ``"float_status"`` (saturation mode: only the chip's float-status register knows).

    The recorded ``inf_nan_mode`` decides; without it torch_npu's default by SoC: INF_NAN on
    Ascend910B1..910B4 and Ascend910_93xx and later, saturation on older and 310 SoCs.  An
    unknown SoC is treated as saturating: reading the register is safe on every SoC that has
    it, while missing a saturated overflow corrupts the weights.

    Example::

        >>> overflow_detection(NpuDeviceProperties("Ascend910A", 102))
        'float_status'
        >>> overflow_detection(NpuDeviceProperties("Ascend910B1", 220))
        'inf_nan'
    """
    inf_nan = props.inf_nan_mode
    if inf_nan is None and props.soc_version is not None:
        soc = props.soc_version
        inf_nan = ASCEND_910B1 <= soc < ASCEND_310B1 or soc >= ASCEND_910_9391
    return "inf_nan" if inf_nan else "float_status"


def npu_capability_issues(props: NpuDeviceProperties, dtype: torch.dtype) -> list[CapabilityIssue]:
    """The findings for ``dtype`` on an NPU with ``props`` (a pure function).

    float16 runs on every Ascend NPU (overflow detection adapts to saturation mode); bfloat16
    needs an Ascend 910B or later and is an error elsewhere.

    Example::

        >>> npu_capability_issues(NpuDeviceProperties("Ascend910A", 102), torch.bfloat16)[0].severity
        'error'
        >>> npu_capability_issues(NpuDeviceProperties("Ascend910B2", 221), torch.bfloat16)
        []
    """
    if dtype != torch.bfloat16:
        return []
    supported = supports_bf16(props)
    if supported:
        return []
    if supported is None:
        why = "torch_npu reported neither torch.npu.is_bf16_supported() nor a SoC version"
    else:
        why = "torch.npu.is_bf16_supported() is False"
    return [
        CapabilityIssue(
            "error",
            f"bfloat16 autocast needs an Ascend NPU with bf16 support (Ascend 910B or later); "
            f"{props.where}: {why}. Use dtype=torch.float16 on this NPU",
        )
    ]


def unavailable_reason(
    torch_version: str, installed: bool, import_error: str | None, is_available: bool, device_count: int
) -> str | None:
    """Why the NPU backend cannot run, from recorded facts (a pure function).

    Example::

        >>> unavailable_reason("2.13.0+cpu", False, None, False, 0)
        'torch_npu is not installed (pip install torch-npu matching your torch and Ascend CANN versions)'
    """
    if not installed:
        return "torch_npu is not installed (pip install torch-npu matching your torch and Ascend CANN versions)"
    if import_error is not None:
        return (
            f"importing torch_npu failed ({import_error}); check the Ascend CANN toolkit and that "
            f"torch_npu matches torch {torch_version}"
        )
    if not is_available or device_count < 1:
        return "torch.npu.is_available() is False: no Ascend NPU or driver found"
    return None


def _torch_npu() -> ModuleType:
    """Import torch_npu (raises what the import raises)."""
    return importlib.import_module("torch_npu")


@functools.cache
def read_properties(device_index: int) -> NpuDeviceProperties:
    """Record the properties of NPU ``device_index`` (needs torch_npu and the device).

    Cached: they cannot change within a process, and the overflow-flag hooks ask every step.
    """
    torch_npu = _torch_npu()
    npu = torch_npu.npu
    name = str(npu.get_device_name(device_index))
    soc = getattr(npu, "get_soc_version", None)
    bf16 = getattr(npu, "is_bf16_supported", None)
    inf_nan = getattr(npu.utils, "is_support_inf_nan", None)
    with npu.device(device_index):
        return NpuDeviceProperties(
            name,
            int(soc()) if soc is not None else None,
            bool(bf16()) if bf16 is not None else None,
            bool(inf_nan()) if inf_nan is not None else None,
        )


def _uses_float_status(device: torch.device) -> bool:
    index = device.index if device.index is not None else 0
    return overflow_detection(read_properties(index)) == "float_status"


@hookimpl
def ampcore_backend() -> BackendSpec:
    # O2's master-weight updates on whole tensors: a few multi-tensor kernels per param group
    return BackendSpec(
        name="npu",
        device_type="npu",
        dtypes=[torch.float16, torch.bfloat16],
        priority=100,
        master_update_chunk_elements=None,
    )


@hookimpl
def ampcore_unavailable_reason() -> str | None:
    version = torch.__version__
    if importlib.util.find_spec("torch_npu") is None:
        return unavailable_reason(version, False, None, False, 0)
    try:
        npu = _torch_npu().npu
        available = bool(npu.is_available())
        count = int(npu.device_count()) if available else 0
    except Exception as exc:  # missing CANN libraries, ABI mismatch, driver errors
        return unavailable_reason(version, True, f"{type(exc).__name__}: {exc}", False, 0)
    return unavailable_reason(version, True, None, available, count)


@hookimpl
def ampcore_device_count() -> int:
    return int(_torch_npu().npu.device_count())


@hookimpl
def ampcore_device_name(device_index: int) -> str:
    return str(_torch_npu().npu.get_device_name(device_index))


@hookimpl
def ampcore_check_capability(dtype: torch.dtype, device_index: int) -> list[CapabilityIssue]:
    return npu_capability_issues(read_properties(device_index), dtype)


@hookimpl
def ampcore_device_overflow_flag(device: torch.device) -> torch.Tensor | None:
    if not _uses_float_status(device):
        return None
    status = _torch_npu().npu_get_float_status(torch.zeros(8, device=device))
    return (status[:1] != 0).float()


@hookimpl
def ampcore_clear_device_overflow_flag(device: torch.device) -> None:
    if _uses_float_status(device):
        _torch_npu().npu_clear_float_status(torch.zeros(8, device=device))
