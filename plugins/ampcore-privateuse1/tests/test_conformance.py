"""Run ampcore's vendor conformance suite against the ``acme`` backend (keep it, renamed).

``ampcore conformance --backend <name>`` runs every case the backend claims on the device and
fails when no device is found, so zero tests can never read as green.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BACKEND = "acme"
MANIFEST = Path(__file__).resolve().parents[1] / "conformance-manifest.toml"


@pytest.mark.parametrize("mode", ["none", "generic"])
def test_conformance_suite_passes(tmp_path: Path, mode: str) -> None:
    reports = tmp_path / "reports"
    done = subprocess.run(
        [sys.executable, "-m", "ampcore", "conformance", "--backend", BACKEND, "--dtype", "float16",
         "--report-dir", str(reports), "--manifest", str(MANIFEST)],
        capture_output=True, text=True, timeout=1800, check=False,
        env={**os.environ, "AMPCORE_STRICT_PLUGINS": "1", "AMPCORE_ACME_AUTOCAST": mode, "AMPCORE_BLOCK_PLUGINS": ""},
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    report = json.loads((reports / "report.json").read_text())
    assert report["summary"]["passed"] > 0 and report["summary"]["failed"] == 0
