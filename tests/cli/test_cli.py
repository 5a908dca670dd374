"""The command line: ``ampcore info`` as text and JSON, and a broken third-party plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ampcore._cli.main import main


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ampcore", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.slow
def test_info_json_lists_cpu_and_cuda_with_distribution() -> None:
    result = _run("info", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    backends = {b["name"]: b for b in info["backends"]}
    assert backends["cpu"]["available"] and backends["cpu"]["default_dtype"] == "bfloat16"
    assert backends["cpu"]["distribution"] == "ampcore"
    assert backends["cuda"]["distribution"] == "ampcore"
    if not backends["cuda"]["available"]:
        assert backends["cuda"]["reason"]
    assert info["ampcore"] and info["torch"] and info["python"]


def test_info_text_shows_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "Plugins:" in out and "Backends:" in out
    assert any(line.split()[:1] == ["cpu"] and "yes" in line for line in out.splitlines())


@pytest.mark.slow
def test_broken_distribution_beside_ampcore(tmp_path: Path) -> None:
    """A distribution whose entry point raises on import leaves ampcore and every other
    backend working, and ``ampcore info`` shows its error."""
    (tmp_path / "ampcore_broken_vendor.py").write_text(
        "raise ImportError('libvendor.so: cannot open shared object file')\n"
    )
    dist_info = tmp_path / "ampcore_broken-0.3.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: ampcore-broken\nVersion: 0.3\n")
    (dist_info / "entry_points.txt").write_text("[ampcore]\nbroken = ampcore_broken_vendor\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = _run("info", "--json", env=env)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    plugins = {p["name"]: p for p in info["plugins"]}
    assert plugins["broken"]["status"] == "failed"
    assert plugins["broken"]["distribution"] == "ampcore-broken"
    assert "libvendor.so" in plugins["broken"]["error"]
    assert {b["name"] for b in info["backends"]} >= {"cpu", "cuda"}
    assert any("ampcore-broken" in w for w in info["load_warnings"])
    code = (
        "import torch, ampcore\n"
        "with ampcore.autocast(device='cpu'):\n"
        "    print(torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )
    assert run.returncode == 0 and run.stdout.strip() == "torch.bfloat16"
    assert 'Error loading ampcore plugin "broken" (distribution "ampcore-broken"' in run.stderr


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "info" in capsys.readouterr().out
