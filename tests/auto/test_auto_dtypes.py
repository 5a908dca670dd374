"""Issue 27: a module's output dtype under ``level="auto"`` does not depend on which call it is.

The same call (same module, same inputs) gives the same output dtype on its first call
(recorded with the global hooks, or measured) and on every later one (run by the root's
program), whatever the program's default.  The dtype is the one torch.autocast gives for
the plan's decision: the low-precision dtype for ``"low"`` (a white-list module under
torch.autocast), float32 for ``"fp32"`` (the module with autocast off).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from torch import nn

import ampcore
from ampcore._auto import _hooks, _program, _store
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's measuring budget unspent."""
    monkeypatch.delenv("AMPCORE_AUTO_BUDGET", raising=False)
    for name, value in (("spent_s", 0.0), ("warned", False), ("exhausted_warned", False), ("clocks", {})):
        monkeypatch.setattr(_hooks._process, name, value)


class Chain(nn.Module):
    """``fp32`` small layers, then ``low`` layers; ``relu``: an op between the layers (else
    each layer's output goes straight into the next one, the last one's is returned)."""

    def __init__(self, fp32: int, low: int, relu: bool) -> None:
        super().__init__()
        self.small = nn.ModuleList(nn.Linear(8, 8) for _ in range(fp32))
        self.big = nn.ModuleList(nn.Linear(32, 32) for _ in range(low))
        self.relu = relu
        self.seen: list[torch.dtype] = []  # every layer's output dtype, in call order

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen = []
        for layer in [*self.small, *self.big]:
            out = layer(y if layer in self.small else x)
            self.seen.append(out.dtype)
            if layer in self.small:
                y = torch.relu(out) if self.relu else out
            else:
                x = torch.relu(out) if self.relu else out
        return y, x


def _decide(net: Chain, y: torch.Tensor, x: torch.Tensor) -> None:
    """Small layers float32, big ones low precision (a plan given to ``load_plan``)."""
    with torch.enable_grad():
        keys = {shape_class(net.small[0], (y,), "cpu"): "fp32", shape_class(net.big[0], (x,), "cpu"): "low"}
        keys[shape_class(net.big[0], (x.bfloat16(),), "cpu")] = "low"
    entries = {k: {"decision": d} for k, d in keys.items() if k is not None}
    ampcore.load_plan({"format": 2, "fingerprint": ampcore.auto_plan("cpu").fingerprint, "entries": entries})


def _calls(net: Chain, y: torch.Tensor, x: torch.Tensor, n: int = 4) -> list[list[torch.dtype]]:
    """Each call's layer output dtypes, then the root's output dtypes."""
    seen = []
    for _ in range(n):
        with ampcore.autocast("cpu", level="auto"):
            out = net(y, x)
        seen.append([*net.seen, *(t.dtype for t in out)])
    return seen


@pytest.mark.parametrize("relu", [True, False], ids=["op-between", "layer-to-layer"])
@pytest.mark.parametrize(("fp32", "low"), [(6, 1), (1, 3)], ids=["mostly-fp32", "mostly-low"])
def test_a_recorded_call_and_the_program_give_the_same_dtypes(fp32: int, low: int, relu: bool) -> None:
    net, y, x = Chain(fp32, low, relu), torch.randn(4, 8), torch.randn(4, 32)
    _decide(net, y, x)
    first, *later = _calls(net, y, x)
    assert all(dtypes == first for dtypes in later), (first, later)
    # the dtype torch.autocast gives for each decision
    assert first[: fp32 + low] == [torch.float32] * fp32 + [torch.bfloat16] * low
    assert isinstance(next(iter(_store._programs[net].values())), _program.Program)


class _Clock:
    """A device clock for the measurement: ``fp32`` / ``low`` ms per run (a little jitter);
    a whole call follows its modules' figures (the whole-call check of a uniform program:
    the program, ``root-plan``, as fast as the side that won)."""

    def __init__(self, fp32: float, low: float) -> None:
        jitter = itertools.cycle([1.0, 1.01, 0.99])
        ms = {"fp32": fp32, "low": low, "root-fp32": fp32, "root-low": low, "root-plan": min(fp32, low)}
        self.figures = {label: map(value.__mul__, jitter) for label, value in ms.items()}

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        return next(self.figures.get(label, itertools.repeat(0.01)))


@pytest.mark.parametrize(("fp32_ms", "low_ms", "expected"), [(1.0, 4.0, torch.float32), (4.0, 1.0, torch.bfloat16)])
@pytest.mark.parametrize("relu", [True, False], ids=["op-between", "layer-to-layer"])
def test_a_measured_call_gives_the_dtype_of_its_decision(
    monkeypatch: pytest.MonkeyPatch, fp32_ms: float, low_ms: float, expected: torch.dtype, relu: bool
) -> None:
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: _Clock(fp32_ms, low_ms))
    net, y, x = Chain(3, 0, relu), torch.randn(4, 8), torch.randn(4, 32)
    first, *later = _calls(net, y, x)  # the first call ran before its class was measured
    assert ampcore.auto_plan("cpu").decision(shape_class(net.small[0], (y,), "cpu") or "") is not None
    assert first == [expected] * 3 + [expected, torch.float32]
    assert all(dtypes == first for dtypes in later), (first, later)
