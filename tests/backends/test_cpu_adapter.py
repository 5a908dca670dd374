"""CPU adapter: native-vs-emulated detection from recorded CPU feature flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ampcore
from ampcore_backends import cpu
from ampcore_backends.cpu import capabilities_from_cpuinfo, cpu_capability_issues, read_capabilities

SAPPHIRE_RAPIDS = {
    "cpu_name": "Intel Xeon Platinum 8480+",
    "avx512_bf16": True,
    "amx_bf16": True,
    "amx_fp16": True,
    "avx512_fp16": True,
}
ICE_LAKE = {
    "cpu_name": "Intel Xeon Platinum 8380",
    "avx512_bf16": False,
    "amx_bf16": False,
    "amx_fp16": False,
    "avx512_fp16": False,
}
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


def test_unknown_capabilities_say_the_check_cannot_tell() -> None:
    # torch 2.8 has no torch.cpu.get_capabilities(); without /proc/cpuinfo nothing answers
    for dtype in (torch.bfloat16, torch.float16):
        (issue,) = cpu_capability_issues({}, dtype)
        assert issue.severity == "warning"
        assert issue.message.startswith(f"cannot tell whether {dtype} runs natively on this CPU")
        assert torch.__version__ in issue.message and "/proc/cpuinfo" in issue.message


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu
"""


def test_cpuinfo_flags_stand_in_for_torch_capabilities() -> None:
    caps = capabilities_from_cpuinfo(CPUINFO)
    assert caps == {
        "cpu_name": "Intel(R) Xeon(R) Platinum 8480+",
        "amx_bf16": True, "amx_fp16": False, "avx512_bf16": True, "avx512_fp16": False,
    }  # fmt: skip
    assert cpu_capability_issues(caps, torch.bfloat16) == []
    assert "runs emulated" in cpu_capability_issues(caps, torch.float16)[0].message
    assert capabilities_from_cpuinfo("") == {}  # no flags line: unknown


def test_without_torch_capabilities_the_adapter_reads_cpuinfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)  # as on torch 2.8
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    monkeypatch.setattr(cpu, "CPUINFO", str(tmp_path / "cpuinfo"))
    assert read_capabilities()["avx512_bf16"] is True
    monkeypatch.setattr(cpu, "CPUINFO", str(tmp_path / "missing"))
    assert read_capabilities() == {}
    assert cpu.ampcore_check_capability(torch.bfloat16)[0].message.startswith("cannot tell")


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
