"""XPU adapter: float16 (default) and bfloat16 autocast on Intel GPUs through upstream ``torch.xpu``.

Upstream torch (2.4 and later, XPU builds) has native ``AutocastXPU`` kernels and XPU kernels
for ``torch._amp_foreach_non_finite_check_and_unscale_`` and ``torch._amp_update_scale_``,
so the adapter only describes the device: no op-list changes, no unscale kernels, no
overflow flag (Intel GPUs produce infs and nans).  Intel Extension for PyTorch is not needed.

Capability (from ``torch.xpu.get_device_properties``): fp16 needs ``has_fp16`` and is fast
only with the XMX matrix engines (``has_subgroup_matrix_multiply_accumulate``, i.e. DPAS);
bf16 needs ``torch.xpu.is_bf16_supported()`` and runs emulated (with a warning) on GPUs
without native bf16 conversions (``has_bfloat16_conversions``, e.g. Arc A770).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampcore import BackendSpec, CapabilityIssue, hookimpl

#: The adapter contract this plugin targets (ampcore.hookspec).
AMPCORE_CONTRACT = 2


@dataclass(frozen=True)
class XpuDeviceProperties:
    """What the capability check needs to know about one Intel GPU (recordable, testable).

    ``bf16_supported`` is ``torch.xpu.is_bf16_supported()`` (torch's answer, emulation
    included); ``bf16_native`` is ``has_bfloat16_conversions``; ``has_xmx`` is
    ``has_subgroup_matrix_multiply_accumulate``.
    """

    name: str
    has_fp16: bool = True
    bf16_supported: bool = True
    bf16_native: bool = True
    has_xmx: bool = True


def xpu_capability_issues(props: XpuDeviceProperties, dtype: torch.dtype) -> list[CapabilityIssue]:
    """The findings for ``dtype`` on an Intel GPU with ``props`` (a pure function).

    Example::

        >>> a770 = XpuDeviceProperties("Intel(R) Arc(TM) A770 Graphics", bf16_native=False)
        >>> xpu_capability_issues(a770, torch.bfloat16)[0].severity
        'warning'
        >>> xpu_capability_issues(a770, torch.float16)
        []
    """
    where = f"current GPU is {props.name}"
    if dtype == torch.float16:
        if not props.has_fp16:
            return [CapabilityIssue("error", f"float16 autocast needs fp16 support; {where}, which has none")]
        if props.has_xmx:
            return []
        return [
            CapabilityIssue(
                "warning",
                f"{where}, which has no XMX matrix engines (has_subgroup_matrix_multiply_accumulate "
                "is False): expect no speed-up from float16",
            )
        ]
    if dtype == torch.bfloat16:
        if not props.bf16_supported:
            return [
                CapabilityIssue(
                    "error",
                    f"bfloat16 autocast needs torch.xpu.is_bf16_supported(); {where}, for which it "
                    "is False. Use dtype=torch.float16 on this GPU",
                )
            ]
        if props.bf16_native:
            return []
        return [
            CapabilityIssue(
                "warning",
                f"{where}, which has no native bfloat16 conversions (has_bfloat16_conversions is "
                "False): bf16 runs emulated and is likely slower than float16",
            )
        ]
    return []


def unavailable_reason(torch_version: str, compiled: bool, is_available: bool) -> str | None:
    """Why XPU cannot run, from recorded facts (a pure function).

    Example::

        >>> unavailable_reason("2.13.0+cpu", False, False)
        'this torch build (2.13.0+cpu) has no XPU support'
    """
    if not compiled:
        return f"this torch build ({torch_version}) has no XPU support"
    if not is_available:
        return "torch.xpu.is_available() is False: no Intel GPU or driver found"
    return None


def read_properties(device_index: int) -> XpuDeviceProperties:
    """Record the properties of Intel GPU ``device_index`` (needs an XPU build and device)."""
    props = torch.xpu.get_device_properties(device_index)
    with torch.xpu.device(device_index):
        bf16 = bool(torch.xpu.is_bf16_supported())
    return XpuDeviceProperties(
        str(props.name),
        bool(getattr(props, "has_fp16", True)),
        bf16,
        bool(getattr(props, "has_bfloat16_conversions", bf16)),
        bool(getattr(props, "has_subgroup_matrix_multiply_accumulate", True)),
    )


def _compiled() -> bool:
    check = getattr(torch.xpu, "_is_compiled", None)
    if check is not None:
        return bool(check())
    return bool(getattr(torch._C, "_has_xpu", False))


@hookimpl
def ampcore_backend() -> BackendSpec:
    # O2's master-weight updates on whole tensors: a few multi-tensor kernels per param group
    return BackendSpec(
        name="xpu",
        device_type="xpu",
        dtypes=[torch.float16, torch.bfloat16],
        priority=80,
        master_update_chunk_elements=None,
    )


@hookimpl
def ampcore_unavailable_reason() -> str | None:
    compiled = _compiled()
    return unavailable_reason(torch.__version__, compiled, compiled and torch.xpu.is_available())


@hookimpl
def ampcore_device_count() -> int:
    return torch.xpu.device_count()


@hookimpl
def ampcore_device_name(device_index: int) -> str:
    return torch.xpu.get_device_name(device_index)


@hookimpl
def ampcore_check_capability(dtype: torch.dtype, device_index: int) -> list[CapabilityIssue]:
    return xpu_capability_issues(read_properties(device_index), dtype)
