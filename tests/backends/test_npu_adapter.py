"""NPU adapter: bf16 support, saturation-mode overflow and availability as pure functions of
recorded Ascend properties; the flag hooks against a stand-in ``torch_npu`` on the CPU."""

from __future__ import annotations

import contextlib
import importlib.machinery
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ampcore
from ampcore_backends import npu
from ampcore_backends.npu import NpuDeviceProperties, npu_capability_issues, overflow_detection, unavailable_reason

# (name, SoC version as torch_npu reports it, bf16 finding, overflow detection by default)
SOCS = [
    ("Ascend910A", 102, "error", "float_status"),
    ("Ascend910ProB", 103, "error", "float_status"),
    ("Ascend310P3", 202, "error", "float_status"),
    ("Ascend910B1", 220, None, "inf_nan"),
    ("Ascend910B4", 224, None, "inf_nan"),
    ("Ascend310B1", 240, None, "float_status"),
    ("Ascend910_9391", 250, None, "inf_nan"),
]


@pytest.mark.parametrize(("name", "soc", "bf16", "detection"), SOCS, ids=[s[0] for s in SOCS])
def test_soc_table(name: str, soc: int, bf16: str | None, detection: str) -> None:
    props = NpuDeviceProperties(name, soc)
    issues = npu_capability_issues(props, torch.bfloat16)
    assert [i.severity for i in issues] == ([bf16] if bf16 else [])
    assert npu_capability_issues(props, torch.float16) == []
    assert overflow_detection(props) == detection


def test_bf16_error_names_the_npu_and_suggests_fp16() -> None:
    (issue,) = npu_capability_issues(NpuDeviceProperties("Ascend910A", 102, bf16_supported=False), torch.bfloat16)
    assert "Ascend910A (SoC version 102)" in issue.message
    assert "torch.npu.is_bf16_supported() is False" in issue.message
    assert "dtype=torch.float16" in issue.message


def test_recorded_answers_override_the_soc_rules() -> None:
    # torch.npu.is_bf16_supported() is the authority when it was read
    assert npu_capability_issues(NpuDeviceProperties("Odd", 102, bf16_supported=True), torch.bfloat16) == []
    assert npu_capability_issues(NpuDeviceProperties("Odd", 220, bf16_supported=False), torch.bfloat16)
    # INF_NAN_MODE_ENABLE=0 (+ INF_NAN_MODE_FORCE_DISABLE=1) puts a 910B into saturation mode
    assert overflow_detection(NpuDeviceProperties("Ascend910B1", 220, inf_nan_mode=False)) == "float_status"
    assert overflow_detection(NpuDeviceProperties("Ascend910A", 102, inf_nan_mode=True)) == "inf_nan"


def test_unknown_soc_reads_the_float_status_and_refuses_bf16() -> None:
    unknown = NpuDeviceProperties("Ascend?")
    assert overflow_detection(unknown) == "float_status"
    (issue,) = npu_capability_issues(unknown, torch.bfloat16)
    assert issue.severity == "error" and "neither" in issue.message


@pytest.mark.parametrize(
    ("installed", "error", "available", "count", "expected"),
    [
        (False, None, False, 0, "torch_npu is not installed"),
        (
            True,
            "ImportError: libascendcl.so: cannot open shared object file",
            False,
            0,
            "importing torch_npu failed (ImportError: libascendcl.so",
        ),
        (True, None, False, 0, "torch.npu.is_available() is False"),
        (True, None, True, 8, None),
    ],
)
def test_unavailable_reason(
    installed: bool, error: str | None, available: bool, count: int, expected: str | None
) -> None:
    reason = unavailable_reason("2.13.0+cpu", installed, error, available, count)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(expected)


def test_backend_description() -> None:
    backend = ampcore.get_backend("npu")
    assert (backend.device_type, backend.priority) == ("npu", 100)
    assert backend.supported_dtypes == (torch.float16, torch.bfloat16)
    assert backend.default_dtype == torch.float16
    assert backend.needs_loss_scaling(torch.float16) and not backend.needs_loss_scaling(torch.bfloat16)
    assert backend.op_list_adjustments(torch.float16) == {}
    infos = {p.name: p for p in ampcore.list_plugins()}
    assert (infos["npu"].status, infos["npu"].distribution) == ("loaded", "ampcore")


def _has_torch_npu() -> bool:
    try:
        import torch_npu  # noqa: F401
    except Exception:
        return False
    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


def test_backend_is_unavailable_with_a_reason_without_torch_npu() -> None:
    backend = ampcore.get_backend("npu")
    if _has_torch_npu():
        assert backend.is_available
    else:
        assert backend.unavailable_reason
        with pytest.raises(ampcore.BackendUnavailableError, match="npu.*unavailable"):
            ampcore.autocast(device="npu")


def test_torch_npu_that_fails_to_import_makes_npu_unavailable_only(tmp_path: Path) -> None:
    """An installed torch_npu whose import raises (no CANN toolkit) lists npu as unavailable
    with the error; every other backend works."""
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('libascendcl.so: cannot open shared object file')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    code = (
        "import json, torch, ampcore\n"
        "from ampcore._cli.info import collect_info\n"
        "with ampcore.autocast(device='cpu'):\n"
        "    dtype = str(torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype)\n"
        "print(json.dumps({'dtype': dtype, 'info': collect_info()}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    backends = {b["name"]: b for b in out["info"]["backends"]}
    assert not backends["npu"]["available"]
    assert "importing torch_npu failed (ImportError: libascendcl.so" in backends["npu"]["reason"]
    assert backends["cpu"]["available"] and out["dtype"] == "torch.bfloat16"
    assert {p["name"]: p["status"] for p in out["info"]["plugins"]}["npu"] == "loaded"


# -- the overflow-flag hooks against a stand-in torch_npu (CPU tensors) --------------------


class FakeTorchNpu(types.ModuleType):
    """The slice of torch_npu the adapter uses; the float-status register is a CPU tensor."""

    def __init__(self, soc: int, inf_nan: bool) -> None:
        super().__init__("torch_npu")
        self.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
        self.register = torch.zeros(8)
        self.calls: list[str] = []
        utils = types.SimpleNamespace(is_support_inf_nan=lambda: inf_nan)
        self.npu = types.SimpleNamespace(
            get_device_name=lambda index=0: f"Ascend-{soc}",
            get_soc_version=lambda: soc,
            is_bf16_supported=lambda: soc >= 220,
            utils=utils,
            device=lambda index: contextlib.nullcontext(),
            is_available=lambda: True,
            device_count=lambda: 1,
        )

    def npu_get_float_status(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append("get")
        return self.register.clone()

    def npu_clear_float_status(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append("clear")
        self.register.zero_()
        return self.register.clone()


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeTorchNpu]]:
    npu.read_properties.cache_clear()

    def install(soc: int, inf_nan: bool) -> FakeTorchNpu:
        module = FakeTorchNpu(soc, inf_nan)
        monkeypatch.setitem(sys.modules, "torch_npu", module)
        return module

    yield install  # type: ignore[misc]
    npu.read_properties.cache_clear()


def test_saturation_mode_reads_and_clears_the_float_status(fake_npu) -> None:
    chip = fake_npu(102, inf_nan=False)
    device = torch.device("cpu")
    npu.ampcore_clear_device_overflow_flag(device)
    flag = npu.ampcore_device_overflow_flag(device)
    assert flag is not None and flag.shape == (1,) and flag.item() == 0.0
    chip.register[0] = 1.0  # an fp16 op saturated during backward
    flag = npu.ampcore_device_overflow_flag(device)
    assert flag is not None and flag.item() > 0 and flag.device == device
    npu.ampcore_clear_device_overflow_flag(device)
    assert npu.ampcore_device_overflow_flag(device).item() == 0.0  # type: ignore[union-attr]
    assert chip.calls == ["clear", "get", "get", "clear", "get"]


def test_inf_nan_mode_needs_no_flag(fake_npu) -> None:
    chip = fake_npu(220, inf_nan=True)
    chip.register[0] = 1.0
    assert npu.ampcore_device_overflow_flag(torch.device("cpu")) is None
    npu.ampcore_clear_device_overflow_flag(torch.device("cpu"))
    assert chip.calls == []


def test_hooks_read_the_device_through_torch_npu(fake_npu) -> None:
    fake_npu(102, inf_nan=False)
    assert npu.ampcore_unavailable_reason() is None
    assert npu.ampcore_device_name(0) == "Ascend-102"
    (issue,) = npu.ampcore_check_capability(torch.bfloat16, 0)
    assert issue.severity == "error" and "Ascend-102 (SoC version 102)" in issue.message


@pytest.mark.skipif(not _has_torch_npu(), reason="needs an Ascend NPU with torch_npu")
def test_fp16_autocast_on_the_npu() -> None:
    x = torch.randn(8, 8, device="npu")
    with ampcore.autocast(device="npu", dtype=torch.float16):
        assert torch.mm(x, x).dtype == torch.float16
        assert torch.softmax(x, -1).dtype == torch.float32


def test_grad_scaler_skips_a_step_that_saturated(fake_npu, register) -> None:
    """End to end with ampcore.GradScaler: finite (saturated) gradients, but the chip's
    float-status register says overflow, so the step is skipped and the scale backs off.
    The NPU flag hooks are served on the CPU by a stand-in adapter that uses them."""
    from conftest import make_adapter

    chip = fake_npu(102, inf_nan=False)
    register(
        make_adapter(
            "npu-sim",
            dtypes=(torch.float16,),
            ampcore_device_overflow_flag=npu.ampcore_device_overflow_flag,
            ampcore_clear_device_overflow_flag=npu.ampcore_clear_device_overflow_flag,
        ),
        name="npu-sim",
    )
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampcore.GradScaler("npu-sim", dtype=torch.float16, init_scale=1024.0)

    def train_step(saturates: bool) -> None:
        opt.zero_grad()
        loss = model(torch.ones(2, 4)).sum()
        scaler.scale(loss).backward()
        if saturates:
            chip.register[0] = 1.0  # an fp16 op saturated at 65504 during backward
        scaler.step(opt)
        scaler.update()

    before = model.weight.detach().clone()
    train_step(saturates=True)
    assert torch.equal(model.weight, before) and scaler.get_scale() == 512.0
    assert "clear" in chip.calls and "get" in chip.calls
    train_step(saturates=False)  # scale() cleared the register before backward
    assert not torch.equal(model.weight, before) and scaler.get_scale() == 512.0
