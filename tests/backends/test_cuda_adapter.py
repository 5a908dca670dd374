"""CUDA adapter: the capability check as a pure function of recorded GPU properties."""

from __future__ import annotations

import pytest
import torch

import ampcore
from ampcore_backends.cuda import CudaDeviceProperties, cuda_capability_issues, unavailable_reason

# (GPU, compute capability, fp16 finding, bf16 finding): recorded properties of real GPUs.
GPUS = [
    ("Tesla K40m", 3, 5, "warning", "error"),
    ("Tesla P100-PCIE-16GB", 6, 0, "warning", "error"),
    ("Tesla V100-SXM2-16GB", 7, 0, None, "error"),
    ("Tesla T4", 7, 5, None, "error"),
    ("NVIDIA A100-SXM4-40GB", 8, 0, None, None),
    ("NVIDIA H100 80GB HBM3", 9, 0, None, None),
]


def _severities(props: CudaDeviceProperties, dtype: torch.dtype) -> str | None:
    issues = cuda_capability_issues(props, dtype)
    assert len(issues) <= 1
    return issues[0].severity if issues else None


@pytest.mark.parametrize(("name", "major", "minor", "fp16", "bf16"), GPUS, ids=[g[0] for g in GPUS])
def test_capability_table(name: str, major: int, minor: int, fp16: str | None, bf16: str | None) -> None:
    props = CudaDeviceProperties(name, major, minor)
    assert _severities(props, torch.float16) == fp16
    assert _severities(props, torch.bfloat16) == bf16


def test_fp16_warning_text_names_the_gpu_and_capability() -> None:
    (issue,) = cuda_capability_issues(CudaDeviceProperties("Tesla K40m", 3, 5), torch.float16)
    assert issue.message == (
        "AMP only supports NVIDIA GPUs with compute capability 7.0 or higher; current GPU is "
        "Tesla K40m with compute capability 3.5: expect no speed-up"
    )


def test_bf16_error_text_suggests_fp16() -> None:
    (issue,) = cuda_capability_issues(CudaDeviceProperties("Tesla V100-SXM2-16GB", 7, 0), torch.bfloat16)
    assert "compute capability 8.0 or higher" in issue.message and "Tesla V100-SXM2-16GB" in issue.message
    assert "dtype=torch.float16" in issue.message


def test_recorded_bf16_support_overrides_the_capability_rule() -> None:
    # torch's is_bf16_supported(including_emulation=False) is the authority when recorded
    assert _severities(CudaDeviceProperties("Odd GPU", 8, 0, bf16_native=False), torch.bfloat16) == "error"
    assert _severities(CudaDeviceProperties("Odd GPU", 7, 5, bf16_native=True), torch.bfloat16) is None


def test_rocm_devices_are_not_judged_by_nvidia_capabilities() -> None:
    mi = CudaDeviceProperties("AMD Instinct MI250X", 9, 0, bf16_native=True, is_rocm=True)
    assert cuda_capability_issues(mi, torch.float16) == []
    assert cuda_capability_issues(mi, torch.bfloat16) == []


@pytest.mark.parametrize(
    ("cuda", "hip", "available", "expected"),
    [
        (None, None, False, "this torch build (2.13.0+cpu) has no CUDA support"),
        ("12.4", None, False, "torch.cuda.is_available() is False: no CUDA device or driver found"),
        ("12.4", None, True, None),
        (None, "6.2", True, None),
    ],
)
def test_unavailable_reason(cuda: str | None, hip: str | None, available: bool, expected: str | None) -> None:
    assert unavailable_reason("2.13.0+cpu", cuda, hip, available) == expected


def test_backend_reports_unavailability_here_or_works_on_a_gpu() -> None:
    backend = ampcore.get_backend("cuda")
    assert backend.supported_dtypes == (torch.float16, torch.bfloat16)
    assert backend.needs_loss_scaling(torch.float16) and not backend.needs_loss_scaling(torch.bfloat16)
    if torch.cuda.is_available():
        assert backend.is_available
    else:
        assert backend.unavailable_reason is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch here)")
def test_fp16_autocast_on_the_gpu() -> None:
    x = torch.randn(8, 8, device="cuda")
    with ampcore.autocast(device="cuda", dtype=torch.float16):
        assert torch.mm(x, x).dtype == torch.float16
        assert torch.softmax(x, -1).dtype == torch.float32
