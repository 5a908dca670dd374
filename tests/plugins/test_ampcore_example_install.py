"""plugins/ampcore-example installs with pip like any third-party distribution and is found
through the ``ampcore`` entry-point group, beside ampcore's own backends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[2] / "plugins" / "ampcore-example"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.slow
def test_pip_installed_template_is_discovered(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(TEMPLATE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    # --no-build-isolation: build with the setuptools already installed (works offline)
    pip = _run(
        "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(target), str(source)
    )
    assert pip.returncode == 0, pip.stderr
    assert (target / "ampcore_example" / "plugin.py").is_file()

    env = {
        "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]),
        "AMPCORE_STRICT_PLUGINS": "1",
    }
    info = _run("-m", "ampcore", "info", "--json", env=env)
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    plugins = {p["name"]: p for p in data["plugins"]}
    assert (plugins["example"]["distribution"], plugins["example"]["status"]) == ("ampcore-example", "loaded")
    backends = {b["name"]: b for b in data["backends"]}
    assert backends["example"]["available"] and backends["example"]["dtypes"] == ["bfloat16"]
    assert backends["example"]["device_type"] == "cpu" and backends["example"]["priority"] == -10
    assert {"cpu", "cuda", "npu", "xpu"} <= set(backends)

    # the copy found is the one pip put in the target folder, and it runs
    code = (
        "import torch, ampcore, ampcore_example.plugin as p\n"
        "with ampcore.autocast(device='example'):\n"
        "    print(p.__file__, torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype)\n"
    )
    run = _run("-c", code, env=env)
    assert run.returncode == 0, run.stderr
    where, dtype = run.stdout.split()
    assert Path(where).is_relative_to(target) and dtype == "torch.bfloat16"
