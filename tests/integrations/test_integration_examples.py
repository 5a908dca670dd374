"""The integration examples run (each where its frameworks are installed)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "integration_lightning.py": ("lightning", "transformers"),
    "integration_accelerate.py": ("accelerate", "transformers"),
    "integration_hf_trainer.py": ("accelerate", "transformers"),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_trains(script: str) -> None:
    missing = [name for name in EXAMPLES[script] if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{script} needs {', '.join(missing)} (pip install ampcore[integrations])")
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), "--steps", "2"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "loss scale" in run.stdout
