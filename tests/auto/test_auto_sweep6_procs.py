"""Issue 27, sixth held-out sweep: one cache directory shared by two processes that decide
different models at once, with the real clock.  Both read the cold cache before either
writes (a barrier); each writes its measurements later.  Before, the last writer replaced
the file with its own plan: the next process running the other model measured it all
again.  The children's decisions are whatever this machine measures: the tests check
where they came from, never a time (a later process may still measure a class again
where the cold one's figures were cut short by the load: the file is what is checked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

_CHILD = r"""
import json, sys, time, warnings
from pathlib import Path
import torch
from torch import nn
import ampcore

which, barrier = sys.argv[1], Path(sys.argv[2])
torch.manual_seed(0)
if which == "a":  # a GEMM and small layers
    model = nn.Sequential(nn.Linear(96, 96), nn.ReLU(), nn.Linear(96, 12))
    x = torch.randn(64, 96)
else:  # convolutions: no class in common with "a"
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 4))
    x = torch.randn(4, 3, 8, 8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ampcore.auto_plan("cpu")  # the cache read (cold, for both at once)
    if barrier.name:
        (barrier / which).touch()
        deadline = time.monotonic() + 120
        while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    for step in range(3):
        with ampcore.autocast("cpu", level="auto"):
            out = model(x)
        out.float().sum().backward()
plan = ampcore.auto_plan("cpu")
print(json.dumps({
    "measured": any("measuring the costs" in str(w.message) for w in caught),
    "warnings": [str(w.message) for w in caught if "measuring the costs" not in str(w.message)],
    "sources": sorted({e.source for e in plan.entries.values()}),
    "mine": sorted(k for k in plan.entries if (("Linear(in_features=96" in k) == (which == "a"))),
}))
"""


def _start(cache: Path, which: str, barrier: Path | None) -> subprocess.Popen[str]:
    env = {**os.environ, "AMPCORE_AUTO_CACHE": str(cache), "AMPCORE_AUTO_BUDGET": "20"}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, which, str(barrier or "")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return found


def test_two_processes_deciding_different_models_at_once_keep_both(tmp_path: Path) -> None:
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    first, second = _start(cache, "a", barrier), _start(cache, "b", barrier)
    decided = set()
    for proc in (first, second):
        cold = _result(proc)
        assert cold["measured"] and cold["warnings"] == [] and cold["mine"]
        decided |= set(cold["mine"])
    (path,) = cache.glob("auto-*.json")
    kept = set(json.loads(path.read_text())["entries"])
    assert decided <= kept, f"a write lost the other process's classes: {sorted(decided - kept)}"
    for which in ("a", "b"):  # the next process of each model reads its classes from the file
        warm = _result(_start(cache, which, None))
        assert warm["warnings"] == [] and "cache" in warm["sources"], (which, warm)
    assert not list(cache.glob(".*.tmp"))
