"""XPU adapter: the capability check and availability as pure functions of recorded Intel GPU
properties (values as ``torch.xpu.get_device_properties`` reports them on these GPUs)."""

from __future__ import annotations

import pytest
import torch

import ampcore
from ampcore_backends.xpu import XpuDeviceProperties, unavailable_reason, xpu_capability_issues

MAX_1100 = XpuDeviceProperties("Intel(R) Data Center GPU Max 1100")
ARC_A770 = XpuDeviceProperties("Intel(R) Arc(TM) A770 Graphics", bf16_native=False)
ARC_B580 = XpuDeviceProperties("Intel(R) Arc(TM) B580 Graphics")
IRIS_XE = XpuDeviceProperties("Intel(R) Iris(R) Xe Graphics", bf16_native=False, has_xmx=False)
NO_BF16 = XpuDeviceProperties("GPU with torch saying no bf16", bf16_supported=False, bf16_native=False)
NO_FP16 = XpuDeviceProperties("GPU without fp16", has_fp16=False)

# (GPU, fp16 finding, bf16 finding)
GPUS = [
    (MAX_1100, None, None),
    (ARC_B580, None, None),
    (ARC_A770, None, "warning"),
    (IRIS_XE, "warning", "warning"),
    (NO_BF16, None, "error"),
    (NO_FP16, "error", None),
]


def _severity(props: XpuDeviceProperties, dtype: torch.dtype) -> str | None:
    issues = xpu_capability_issues(props, dtype)
    assert len(issues) <= 1
    return issues[0].severity if issues else None


@pytest.mark.parametrize(("props", "fp16", "bf16"), GPUS, ids=[g[0].name for g in GPUS])
def test_capability_table(props: XpuDeviceProperties, fp16: str | None, bf16: str | None) -> None:
    assert _severity(props, torch.float16) == fp16
    assert _severity(props, torch.bfloat16) == bf16


def test_messages_name_the_gpu_and_the_property() -> None:
    (emulated,) = xpu_capability_issues(ARC_A770, torch.bfloat16)
    assert "A770" in emulated.message and "has_bfloat16_conversions" in emulated.message
    (no_xmx,) = xpu_capability_issues(IRIS_XE, torch.float16)
    assert "Iris" in no_xmx.message and "XMX" in no_xmx.message
    (refused,) = xpu_capability_issues(NO_BF16, torch.bfloat16)
    assert "torch.xpu.is_bf16_supported()" in refused.message and "dtype=torch.float16" in refused.message


@pytest.mark.parametrize(
    ("compiled", "available", "expected"),
    [
        (False, False, "this torch build (2.13.0+cpu) has no XPU support"),
        (True, False, "torch.xpu.is_available() is False: no Intel GPU or driver found"),
        (True, True, None),
    ],
)
def test_unavailable_reason(compiled: bool, available: bool, expected: str | None) -> None:
    assert unavailable_reason("2.13.0+cpu", compiled, available) == expected


def test_backend_description_and_availability_here() -> None:
    backend = ampcore.get_backend("xpu")
    assert (backend.device_type, backend.priority, backend.default_dtype) == ("xpu", 80, torch.float16)
    assert backend.supported_dtypes == (torch.float16, torch.bfloat16)
    assert backend.op_list_adjustments(torch.float16) == {}
    assert backend.hook("ampcore_device_overflow_flag") is None  # XPU arithmetic produces inf
    if torch.xpu.is_available():
        assert backend.is_available
    else:
        assert backend.unavailable_reason
        with pytest.raises(ampcore.BackendUnavailableError, match="xpu.*unavailable"):
            ampcore.autocast(device="xpu")


@pytest.mark.skipif(not torch.xpu.is_available(), reason="needs an Intel GPU with an XPU build of torch")
def test_fp16_autocast_on_the_gpu() -> None:
    x = torch.randn(8, 8, device="xpu")
    with ampcore.autocast(device="xpu", dtype=torch.float16):
        assert torch.mm(x, x).dtype == torch.float16
        assert torch.softmax(x, -1).dtype == torch.float32
