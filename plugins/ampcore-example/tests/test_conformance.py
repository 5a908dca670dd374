"""Run ampcore's vendor conformance suite against the ``example`` backend.

This is the test a vendor keeps (with its backend name): ``ampcore conformance --backend
<name>`` runs every case the backend claims (dtypes x ops x levels x scaler) on the real
device and fails when no device is found, so zero tests can never read as green.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BACKEND = "example"


def _ampcore(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ampcore", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "AMPCORE_STRICT_PLUGINS": "1"},
        check=False,
    )


def _has_conformance_command() -> bool:
    return _ampcore("conformance", "--help", timeout=300).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _has_conformance_command(), reason="conformance suite not available")
def test_conformance_suite_passes_on_the_example_backend(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    result = _ampcore("conformance", "--backend", BACKEND, "--report-dir", str(reports))
    assert result.returncode == 0, (
        f"ampcore conformance --backend {BACKEND} failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    )
    report = json.loads((reports / "report.json").read_text())
    assert BACKEND in json.dumps(report["backend"])
    assert report["summary"]["passed"] > 0 and report["summary"]["failed"] == 0
