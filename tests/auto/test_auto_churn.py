"""Issue 27 (ninth stop): a root fed more input signatures than it keeps programs for, and
plans that gain shape classes while roots run programs.

* A stream of signatures beyond a root's table (a sequence length that changes every step
  over 1-1024, the table keeps 256) settles soon after the table is full: the calls it has
  no program for apply the plan call by call (no recording, no dispatch mode), and their
  outputs (values and dtypes) are those of the fixed precision the plan gives.  Before, the
  root recorded every new signature until it had dropped 256 programs (512 distinct
  lengths: about 700 steps), and ``bench_auto_patterns.py seqlen-long`` recorded on most
  timed steps.
* Signatures that come back within what a root keeps (lengths 1-256) keep their programs:
  a second pass records nothing and applies nothing call by call.
* A plan that gains a shape class no program ran (a new length bucket measured) leaves the
  programs valid: before, every change of the plan made every program of every root record
  again (about 100 of 160 recordings of ``seqlen`` in its timed steps).  A new class that
  changes what a program depends on (its family's decisions now differ, or a call the
  program ran undecided) still makes it record again.

Recordings are counted (every :class:`Recording`, with or without its dispatch mode), never
timed.  The plans are loaded (frozen: nothing is measured) or set directly.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep import LOW, _clean, _load, fixed_region
from torch import nn

import ampcore
from ampcore._auto import Costs, _program, _roots, _store
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _keys(layers: Any, length: int) -> list[tuple[nn.Linear, str]]:
    """The shape classes of the ``layers`` that are Linear on a sequence of ``length``
    (float32 and bfloat16 inputs)."""
    found = []
    for layer in layers:
        if isinstance(layer, nn.Linear):
            for dtype in (torch.float32, LOW):
                x = torch.zeros(length, layer.in_features, dtype=dtype)
                found.append((layer, shape_class(layer, (x,), "cpu") or ""))
    return found


def _decide(model: nn.Module, top: int) -> None:
    """Load a plan for every length bucket up to ``top``: the last layer low, the others
    float32 (mixed programs; one low layer: bfloat16 kernels made per new shape are slow)."""
    decisions: dict[str, str] = {}
    length = 1
    while length <= 2 * top:
        for layer, key in _keys(model, length):
            decisions[key] = "low" if layer.out_features == 4 else "fp32"
        length *= 2
    _load(decisions)


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Root calls recorded (with the dispatch mode: they may give programs) and applied call by
    call (the global hooks without it)."""
    made = {"recorded": 0, "call-by-call": 0}
    real = _roots.Recording

    def counted(*args: Any) -> Any:
        rec = real(*args)
        made["recorded" if rec.mode is not None else "call-by-call"] += 1
        return rec

    monkeypatch.setattr(_roots, "Recording", counted)
    yield made


def _step(model: nn.Module, length: int, enter: Any) -> torch.Tensor:
    with enter():
        out = model(torch.randn(length, 16))
    out.float().pow(2).mean().backward()
    return out


def _auto() -> Any:
    return ampcore.autocast("cpu", level="auto")


def _same_as_fixed(model: nn.Module, reference: nn.Module, length: int, seed: int) -> None:
    """A step of ``model`` under auto gives the output (values, dtype) and gradients of the
    same step of ``reference`` (its copy) under the fixed precision the plan gives."""
    torch.manual_seed(seed)
    want = _step(reference, length, fixed_region)
    torch.manual_seed(seed)
    got = _step(model, length, _auto)
    _clean(model)
    assert got.dtype == want.dtype, f"length {length}"
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
        p.grad = q.grad = None


def test_a_stream_of_more_signatures_than_a_root_keeps_settles(
    recordings: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench_auto_patterns.py seqlen-long``'s stream: lengths 1-1024 in random order, a
    root keeping 256.  Once the table is full and drops programs never run again, new
    lengths apply the plan call by call; after 400 steps (about 330 distinct lengths) none
    records.  Before: recorded until 256 programs were dropped (512 distinct lengths)."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    torch.manual_seed(0)
    model = _mlp()
    reference = copy.deepcopy(model)
    _decide(model, 1024)
    rnd = random.Random(0)
    lengths = [rnd.randint(1, 1024) for _ in range(500)]
    for length in lengths[:400]:
        _step(model, length, _auto)
        _clean(model)
        model.zero_grad(set_to_none=True)
    recordings.update({"recorded": 0, "call-by-call": 0})
    for i, length in enumerate(lengths[400:]):
        _same_as_fixed(model, reference, length, i)
    assert recordings["recorded"] == 0, recordings
    assert recordings["call-by-call"] > 0  # the lengths it has no program for
    table = [p for p in _store._programs[model].values() if isinstance(p, _program.Program)]
    assert len(table) <= _store._MAX_SIGNATURES


def test_signatures_within_what_a_root_keeps_stay_settled(
    recordings: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lengths 1-256 (as many as a root keeps), twice in random order: the second pass runs
    programs only (nothing recorded, nothing call by call), also after a third pass of
    lengths 1-64 in turn."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    torch.manual_seed(0)
    model = _mlp()
    _decide(model, 256)
    lengths = list(range(1, 257))
    for seed in range(3):
        random.Random(seed).shuffle(lengths)
        if seed == 1:
            recordings.update({"recorded": 0, "call-by-call": 0})
        for length in lengths[: 64 if seed == 2 else 256]:
            _step(model, length, _auto)
            _clean(model)
            model.zero_grad(set_to_none=True)
    assert recordings == {"recorded": 0, "call-by-call": 0}


def _settle(model: nn.Module, lengths: list[int]) -> None:
    for _ in range(2):
        for length in lengths:
            _step(model, length, _auto)
            _clean(model)
            model.zero_grad(set_to_none=True)


def test_a_new_class_no_program_ran_keeps_the_programs(
    recordings: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root settled on lengths 1-64; the plan then gains the classes of lengths 65-256 with
    the decisions of their families (what measuring a new bucket does): lengths 1-64 run
    their programs, nothing recorded (before: every program recorded again)."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    torch.manual_seed(0)
    model = _mlp()
    _decide(model, 64)
    _settle(model, list(range(1, 65)))
    plan = ampcore.auto_plan("cpu")
    for length in (128, 256):
        for layer, key in _keys(model, length):
            if plan.decision(key) is None:
                low = layer.out_features == 4
                plan.set(key, Costs(fp32_ms=1.0, low_ms=0.25 if low else 4.0, cast_ms=0.1))
    recordings.update({"recorded": 0, "call-by-call": 0})
    _settle(model, list(range(1, 65)))
    assert recordings == {"recorded": 0, "call-by-call": 0}


@pytest.mark.parametrize("change", ["family-differs", "undecided-call", "redecided", "dropped"])
def test_a_class_a_program_depends_on_makes_it_record_again(
    change: str, recordings: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new class whose family's decisions now differ (the program's calls of that family
    must be guarded: a shape change could change their decision), one a program ran without
    a decision (it ran as the O1 lists), an existing class decided again or dropped: the
    programs record again and every step equals the fixed precision the plan now gives."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    torch.manual_seed(0)
    model = _mlp()
    reference = copy.deepcopy(model)
    _decide(model, 8)  # lengths 1-16
    lengths = [3, 5, 16] if change != "undecided-call" else [3, 5, 16, 17]  # 17: bucket 32, not in the plan
    _settle(model, lengths)
    plan = ampcore.auto_plan("cpu")
    fp32, low = Costs(fp32_ms=1.0, low_ms=4.0, cast_ms=0.1), Costs(fp32_ms=1.0, low_ms=0.25, cast_ms=0.1)
    if change == "family-differs":  # the first layer's family: float32 everywhere so far
        plan.set(_keys(model, 1024)[0][1], low)
    elif change == "undecided-call":  # length 17 ran the first layer as the O1 lists (low)
        plan.set(_keys(model, 17)[0][1], fp32)
    elif change == "redecided":
        plan.set(_keys(model, 5)[0][1], low)
    else:
        plan.drop(_keys(model, 16)[2][1])  # the second layer's, on 16: undecided now (O1 lists)
    recordings.update({"recorded": 0, "call-by-call": 0})
    for i, length in enumerate(lengths):
        _same_as_fixed(model, reference, length, i)
    assert recordings["recorded"] >= 1


class _Scaled(nn.Module):
    """A model whose call takes an object the guard cannot see (its signature is unknown)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, config: Any) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))) * config.scale


class _Config:
    """Slots, no ``__dict__``: the guard cannot read it (an object holding plain data it reads)."""

    __slots__ = ()
    scale = 0.5


def test_a_root_called_with_an_argument_the_guard_cannot_see_is_not_recorded_every_call(
    recordings: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No program can hold such a call: it applies the plan call by call.  Before, every call
    after the first was recorded too (the dispatch mode on every op) for nothing kept."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    torch.manual_seed(0)
    model = _Scaled()
    reference = copy.deepcopy(model)
    decisions = {
        key: "fp32" if layer is model.a else "low" for n in (8, 5) for layer, key in _keys(model.children(), n)
    }
    _load(decisions)

    def step(m: nn.Module, n: int, enter: Any) -> torch.Tensor:
        with enter():
            out = m(torch.randn(n, 16), _Config())
        out.float().pow(2).mean().backward()
        return out

    for i, n in enumerate([8, 5, 8, 8, 5, 8]):
        torch.manual_seed(i)
        want = step(reference, n, fixed_region)
        torch.manual_seed(i)
        got = step(model, n, _auto)
        _clean(model)
        assert got.dtype == want.dtype == LOW
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        if i == 0:
            recordings.update({"recorded": 0, "call-by-call": 0})
    assert recordings == {"recorded": 0, "call-by-call": 5}


def test_a_new_phase_with_shapes_of_its_own_still_gets_programs(
    recordings: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root keeping 16 signatures (256 in use: the test is shorter) runs lengths 1-16 for a
    while (a dummy call of length 200 first, never again), then lengths 17-32: the programs
    of the first phase ran before the second replaced them, so the root keeps recording and
    the second phase settles with programs of its own (nothing call by call)."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    monkeypatch.setattr(_store, "_MAX_SIGNATURES", 16)
    torch.manual_seed(0)
    model = _mlp()
    _decide(model, 256)
    _step(model, 200, _auto)
    _settle(model, list(range(1, 17)))
    _settle(model, list(range(17, 33)))
    recordings.update({"recorded": 0, "call-by-call": 0})
    _settle(model, list(range(17, 33)))
    assert recordings == {"recorded": 0, "call-by-call": 0}
