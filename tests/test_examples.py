"""examples/train_o1.py: float16 trains with a GradScaler; a backend that cannot run here
ends in one clear line, not a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import ampcore

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_o1.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_o1", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("dtype", "scaling"), [("float16", True), ("bfloat16", False)])
def test_training_uses_a_grad_scaler(
    dtype: str,
    scaling: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_emulation_warning: None,
) -> None:
    scaled: list[bool] = []
    real_scale = ampcore.GradScaler.scale
    monkeypatch.setattr(
        ampcore.GradScaler, "scale", lambda self, loss: scaled.append(self.is_enabled()) or real_scale(self, loss)
    )
    argv = ["train_o1.py", "--device", "cpu", "--dtype", dtype, "--steps", "3", "--size", "16", "--batch", "8"]
    monkeypatch.setattr(sys, "argv", argv)
    _example().main()
    assert scaled == [scaling] * 3  # every O1 step went through the scaler; it scales for float16 only
    out = capsys.readouterr().out
    assert f"dtype torch.{dtype}" in out and "loss scale" in out


def _unavailable() -> str:
    names = [b.name for b in ampcore.list_backends() if not b.is_available]
    if not names:
        pytest.skip("every installed backend is available here")
    return "cuda" if "cuda" in names else names[0]


@pytest.mark.parametrize("device", ["unavailable", "tpu"])
def test_a_backend_that_cannot_run_gives_a_clear_message(device: str) -> None:
    name = _unavailable() if device == "unavailable" else device
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", name], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("train_o1.py: ") and name in last
    assert ("unavailable" in last) if device == "unavailable" else ("unknown backend 'tpu'" in last)
