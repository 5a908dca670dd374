"""CPU adapter: native-vs-emulated detection from recorded CPU feature flags."""

from __future__ import annotations

import pytest
import torch

import ampcore
from ampcore_backends.cpu import cpu_capability_issues, read_capabilities

SAPPHIRE_RAPIDS = {"cpu_name": "Intel Xeon Platinum 8480+", "avx512_bf16": True, "amx_bf16": True, "amx_fp16": True, "avx512_fp16": True}
ICE_LAKE = {"cpu_name": "Intel Xeon Platinum 8380", "avx512_bf16": False, "amx_bf16": False, "amx_fp16": False, "avx512_fp16": False}
ZEN4 = {"cpu_name": "AMD EPYC 9654", "avx512_bf16": True, "amx_bf16": False, "amx_fp16": False, "avx512_fp16": False}

# (cpu, dtype, warns?)
TABLE = [
    (SAPPHIRE_RAPIDS, torch.bfloat16, False),
    (SAPPHIRE_RAPIDS, torch.float16, False),
    (ICE_LAKE, torch.bfloat16, True),
    (ICE_LAKE, torch.float16, True),
    (ZEN4, torch.bfloat16, False),
    (ZEN4, torch.float16, True),
]


@pytest.mark.parametrize(("caps", "dtype", "warns"), TABLE)
def test_emulation_table(caps: dict[str, object], dtype: torch.dtype, warns: bool) -> None:
    issues = cpu_capability_issues(caps, dtype)
    assert [i.severity for i in issues] == (["warning"] if warns else [])
    if warns:
        assert str(caps["cpu_name"]) in issues[0].message and "slower than float32" in issues[0].message


def test_unknown_capabilities_give_no_finding() -> None:
    assert cpu_capability_issues({}, torch.bfloat16) == []


def test_cpu_backend_description() -> None:
    backend = ampcore.get_backend("cpu")
    assert backend.is_available and backend.default_dtype == torch.bfloat16
    assert backend.supported_dtypes == (torch.bfloat16, torch.float16)
    assert backend.priority == 0


def test_the_warning_matches_this_machines_flags() -> None:
    caps = read_capabilities()
    backend = ampcore.get_backend("cpu")
    for dtype in backend.supported_dtypes:
        assert backend.capability_issues(dtype) == tuple(cpu_capability_issues(caps, dtype))
