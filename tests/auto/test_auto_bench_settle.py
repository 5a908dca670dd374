"""Issue 27, seventeenth stop: ``bench_auto.py`` times auto's settled steps, not its warm-up.

On the GPU (H200, ``--rounds 3``) hf-llama ran auto at 11.0 ms a step against 9.5 for
torch.autocast, "runs as low" (the O1 lists, torch.autocast's program).  A settled step of
that program is torch.autocast's, op by op (``test_auto_hf_settled.py``); the gap was the
benchmark's: on a cold cache auto's first three steps are the new root's call (its classes
measured), the recording of its program and the program's whole-call check (hundreds of
ms), and the two warm-up rounds covered only the first two.  The check was the first
*timed* auto step: one of three rounds, so auto's median was the slower of its two other
steps.  The warm-up now goes on while auto's step still records or measures (``--settle``).

A fake clock gives every figure (no wall-clock threshold): a model of two small layers
whose classes measure float32 faster, a uniform program checked against the O1 lists.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_root_check import budget  # noqa: F401 (an autouse fixture: the budget unspent)
from torch import nn

from ampcore._auto import _hooks, _roots

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``benchmarks/bench_auto.py`` imported, torch's threads and denormal flag put back after."""
    monkeypatch.syspath_prepend(str(BENCH))
    threads = torch.get_num_threads()
    monkeypatch.setattr(_roots, "_record", _roots._record)  # (the bench counts recordings through it)
    try:
        yield importlib.import_module("bench_auto")
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
        for name in [n for n in sys.modules if n in ("bench_auto", "auto_procs")]:
            sys.modules.pop(name)


class Small(nn.Module):
    """Two small layers; called as ``bench_auto`` calls a model: ``model(x, target)``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        return self.net(x)


def _clock() -> Callable[[Callable[[], None], str], float]:
    """Float32 twice as fast as low precision, for the classes and the whole call alike."""
    jitter = itertools.cycle([1.0, 1.01, 0.99])

    def clock(run: Callable[[], None], label: str) -> float:
        run()
        return (2.0 if label in ("low", "root-low") else 0.1 if label == "casts" else 1.0) * next(jitter)

    return clock


def _child(bench: ModuleType, monkeypatch: pytest.MonkeyPatch, settle: int) -> dict[str, Any]:
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: _clock())
    monkeypatch.setattr(_hooks._process, "clocks", {})
    monkeypatch.setattr(bench, "build", lambda name, device: (Small(), (torch.randn(8, 16), torch.zeros(8, 8))))
    args = argparse.Namespace(
        device="cpu", clock="wall", threads=torch.get_num_threads(), noise=False, forced=False, warmup=2,
        rounds=3, settle=settle,
    )  # fmt: skip
    return bench.child("small", args)


def test_the_timed_rounds_begin_once_auto_settled(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _child(bench, monkeypatch, settle=4)
    assert result["settled_timed"] == result["busy_rounds"] == []  # no timed auto step recorded or measured
    assert result["warmup_rounds"] == 3  # the new root, the recording, the whole-call check
    assert [c[0] for c in result["roots"].values()] == ["fp32"] and len(result["times"]["auto"]) == 3


def test_two_warm_up_rounds_left_the_whole_call_check_in_the_first_timed_round(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old warm-up (``--settle 0``): the check is one of the three timed auto steps."""
    result = _child(bench, monkeypatch, settle=0)
    assert result["warmup_rounds"] == 2 and len(result["settled_timed"]) == 1 and result["busy_rounds"] == [0]
    assert result["settled_timed"][0] == result["times"]["auto"][0]
