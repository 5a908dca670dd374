"""The conformance suite proves overflow detection (issue 25): run as a vendor would
(``ampcore conformance`` in a subprocess) against adapters of a device whose float16
arithmetic saturates (the in-repo test device, ``fp16="saturate"``), with a working flag,
without one, with a read hook that returns None and with a flag that never rises.  Only
the working one may pass the overflow checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# plugins/ampcore-testdevice and the acme adapter: skipped, with the reason, where they are not
# installed or this torch cannot host the device (tests/conftest.py)
pytestmark = pytest.mark.testdevice

ADAPTER = """
import torch
import ampcore_testdevice
from ampcore import BackendSpec, hookimpl

AMPCORE_CONTRACT = 2

@hookimpl
def ampcore_backend():
    return BackendSpec(name="{name}", device_type="{name}", dtypes=[torch.float16], priority=-30)

@hookimpl
def ampcore_unavailable_reason():
    ampcore_testdevice.install("{name}", autocast="generic", fp16="saturate")
    return None
{extra}
"""

FLAGS = {
    "working": ("ampcore_testdevice.overflow_flag()", "ampcore_testdevice.clear_overflow_flag()"),
    "none": ("None", "ampcore_testdevice.clear_overflow_flag()"),
    "never": ("torch.zeros(1, device=device)", "None"),
}
HOOKS = """
@hookimpl
def ampcore_device_overflow_flag(device):
    return {read}

@hookimpl
def ampcore_clear_device_overflow_flag(device):
    {clear}
"""
CHECKS = ("test_overflow_is_detected", "test_scaler_skips_a_step_whose_forward_overflowed")


def _install(site: Path, name: str, extra: str) -> None:
    (site / f"ampcore_{name}_adapter.py").write_text(textwrap.dedent(ADAPTER.format(name=name, extra=extra)))
    info = site / f"ampcore_{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ampcore-{name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[ampcore]\n{name} = ampcore_{name}_adapter\n")


def _run(variant: str, tmp_path: Path) -> dict[str, str]:
    """The outcomes of the overflow checks for one adapter variant (its own process)."""
    name = f"sat{variant}"
    read, clear = FLAGS.get(variant, ("", ""))
    _install(tmp_path, name, HOOKS.format(read=read, clear=clear) if read else "")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "AMPCORE_BLOCK_PLUGINS": "acme,example", "AMPCORE_STRICT_PLUGINS": "1"}  # fmt: skip
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "ampcore", "conformance", "--backend", name, "--report-dir", str(out),
         "--", "-q", "-k", " or ".join(CHECKS)],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert (out / "report.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return {t["name"]: f"{t['outcome']}: {t.get('message') or ''}" for t in report["tests"]}


@pytest.mark.parametrize(
    ("variant", "says"),
    [
        ("missing", "declares no overflow flag"),
        ("none", "returned None"),
        ("never", "did not rise"),
    ],
)
def test_a_saturating_device_without_a_working_flag_fails(variant: str, says: str, tmp_path: Path) -> None:
    outcomes = _run(variant, tmp_path)
    for check in ("test_overflow_is_detected[float16-max*2]", "test_overflow_is_detected[float16-matmul]"):
        assert outcomes[check].startswith("failed") and says in outcomes[check], outcomes[check]
    scaler = outcomes["test_scaler_skips_a_step_whose_forward_overflowed[float16]"]
    assert scaler.startswith("failed") and "overflowed" in scaler, scaler


def test_a_saturating_device_with_a_working_flag_passes(tmp_path: Path) -> None:
    outcomes = _run("working", tmp_path)
    assert len(outcomes) == 3 and all(o.startswith("passed") for o in outcomes.values()), outcomes
