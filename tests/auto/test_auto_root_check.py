"""The whole-call check of a mixed program (issue 27, fourth stop): per-module decisions that
each win locally, composed into a program that loses to a fixed choice, must not run.

Decisions are given (``plan.set`` with costs), whole-call times come from a fake clock
(labels ``root-plan``, ``root-low``, ``root-fp32``): no wall-clock threshold anywhere.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from torch import nn

import ampcore
from ampcore._auto import Costs, _hooks
from ampcore._auto._cache import cache_file, forget_plans
from ampcore._auto._checks import check_from_mapping, choose
from ampcore._auto._measure import MIN_RUNS
from ampcore._auto._shapes import shape_class
from ampcore._cli.main import main

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py
_LOSES, _WINS = Costs(1.0, 2.0, 0.1), Costs(2.0, 1.0, 0.1)  # low/fp32 2.0: fp32; 0.5: low


class Net(nn.Module):
    """One big layer (decided low) and two small ones (decided float32): a mixed program."""

    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.big = nn.Linear(32, 32)
        self.small = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.norm = nn.Sequential(nn.BatchNorm1d(8), nn.Dropout(0.5)) if norm else nn.Identity()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for layer in self.small:
            y = layer(y)
        return self.big(x), self.norm(y)


class Clock:
    """Whole-call figures per candidate (a little jitter); module measurements must not happen."""

    def __init__(self, plan: float, low: float, fp32: float) -> None:
        self.labels: list[str] = []
        jitter = [1.0, 1.01, 0.99]
        self.figures = {
            f"root-{name}": itertools.cycle([ms * j for j in jitter])
            for name, ms in (("plan", plan), ("low", low), ("fp32", fp32))
        }

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(label)
        return next(self.figures[label])


@pytest.fixture(autouse=True)
def budget(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("AMPCORE_AUTO_BUDGET", raising=False)
    for name, value in (("spent_s", 0.0), ("warned", False), ("clocks", {})):
        monkeypatch.setattr(_hooks._process, name, value)
    yield


def _decide(net: Net, x: torch.Tensor, y: torch.Tensor, small: Costs = _LOSES) -> None:
    plan = ampcore.auto_plan("cpu")
    plan.set(shape_class(net.big, (x,), "cpu") or "", _WINS, source="given")
    for dtype in (torch.float32, torch.bfloat16):  # the second small layer's input is low when the first is
        plan.set(shape_class(net.small[0], (y.to(dtype),), "cpu") or "", small, source="given")


def _steps(monkeypatch: pytest.MonkeyPatch, clock: Any, net: Net, n: int = 3) -> list[tuple[torch.dtype, ...]]:
    """``n`` training steps in auto regions (one place in the code); the output dtypes of each."""
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    monkeypatch.setattr(_hooks._process, "clocks", {})  # this clock, not one an earlier run kept
    x, y = torch.randn(4, 32), torch.randn(4, 8)
    _decide(net, x, y)
    found = []
    for _ in range(n):
        with ampcore.autocast("cpu", level="auto"):
            out = net(x, y)
        sum(o.float().sum() for o in out).backward()
        found.append(tuple(o.dtype for o in out))
        net.zero_grad(set_to_none=True)
    return found


@pytest.mark.parametrize(
    ("figures", "verdict", "small_dtype"),
    [
        ((10.0, 9.0, 12.0), "low", torch.bfloat16),  # each decision wins alone, the program loses
        ((10.0, 11.0, 8.0), "fp32", torch.float32),  # float32 beats both
        ((8.0, 9.0, 12.0), "plan", torch.float32),  # the program wins beyond the noise: kept
        ((8.9, 9.0, 12.0), "low", torch.bfloat16),  # a 1% win is within the noise: torch.autocast's choice
    ],
)
def test_a_mixed_program_runs_only_where_it_beats_the_better_fixed_choice(
    monkeypatch: pytest.MonkeyPatch, figures: tuple[float, float, float], verdict: str, small_dtype: torch.dtype
) -> None:
    net = Net()
    clock = Clock(*figures)
    first, *later = _steps(monkeypatch, clock, net)
    assert first == (torch.bfloat16, torch.float32)  # recorded with the plan's decisions
    big_dtype = torch.float32 if verdict == "fp32" else torch.bfloat16
    assert later == [(big_dtype, small_dtype)] * 2  # checked once, then run as the verdict says
    (key, check), *_ = ampcore.auto_plan("cpu").roots.items()
    assert (check.verdict, check.source, check.runs) == (verdict, "measured", 7)
    assert key.startswith("Net in=[4x32, 4x8] grad program=")
    assert len(clock.labels) == 3 * (1 + 7)  # one check: each candidate warmed, then 7 rounds


def test_the_check_warms_each_candidate_and_balances_the_order_of_its_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each candidate follows each other equally often, across the rounds' boundaries too,
    and never itself: a run pays for what the run before it left behind (issue 27, sixteenth
    stop: every permutation in turn balanced the rounds' insides only; over 7 rounds the
    program followed float32 4 times and the O1 lists twice, float32 followed the O1 lists 4
    times, the O1 lists followed themselves once)."""
    clock = Clock(10.0, 9.0, 12.0)
    _steps(monkeypatch, clock, Net())
    labels = clock.labels
    names = {"root-plan", "root-low", "root-fp32"}
    assert set(labels[:3]) == names  # warm-up, untimed
    assert len(labels) == 3 * (1 + 7) and all(set(labels[i : i + 3]) == names for i in range(3, len(labels), 3))
    after = Counter((run, before) for before, run in itertools.pairwise(labels[2:]))  # a timed run, the one before
    assert all(run != before for run, before in after)
    for run in names:
        counts = [after[run, before] for before in names - {run}]
        assert max(counts) - min(counts) <= 1, (run, after)  # 7 rounds: one cycle of 2 rounds left half done


def test_a_program_that_is_not_mixed_is_checked_against_the_other_fixed_choice_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A uniform program (every module low: exactly torch.autocast's program) was never
    checked before issue 27's tenth stop, so a wrong per-class figure pinned the model to
    the slower fixed choice for good.  It is now timed once against float32 alone (the
    program *is* the ``low`` candidate: timing it twice would only spend the budget): two
    candidates, each warmed, then 7 rounds; here the O1 lists win, so it runs as recorded.
    tests/auto/test_auto_uniform_check.py covers the verdicts that change what it runs."""
    net, x, y = Net(), torch.randn(4, 32), torch.randn(4, 8)
    clock = Clock(10.0, 9.0, 12.0)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    _decide(net, x, y, small=_WINS)  # every module low: the program is torch.autocast's
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            out = net(x, y)
    assert [o.dtype for o in out] == [torch.bfloat16] * 2
    assert len(clock.labels) == 2 * (1 + 7) and set(clock.labels) == {"root-plan", "root-fp32"}
    assert all(a != b for a, b in itertools.pairwise(clock.labels))  # in alternation: each after the other
    (key, check), *_ = ampcore.auto_plan("cpu").roots.items()
    assert "program=low+0" in key and (check.verdict, check.plan_over_low) == ("low", 1.0)


def test_the_check_leaves_parameters_gradients_buffers_and_rng_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from ampcore._auto import _verify

    seen: list[bool] = []
    original = _verify._check

    def spy(root: nn.Module, *args: Any) -> Any:
        state = {k: v.clone() for k, v in root.state_dict().items()}
        rng = torch.get_rng_state()
        found = original(root, *args)
        seen.append(all(torch.equal(v, state[k]) for k, v in root.state_dict().items()))
        seen.append(torch.equal(rng, torch.get_rng_state()))
        seen.append(all(p.grad is None for p in root.parameters()))
        return found

    monkeypatch.setattr(_verify, "_check", spy)
    net = Net(norm=True)  # BatchNorm (running statistics) and dropout (the RNG), training mode
    _steps(monkeypatch, Clock(10.0, 9.0, 12.0), net, n=2)
    assert seen == [True, True, True]


def test_the_verdict_is_cached_and_a_corrupted_one_is_checked_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    net = Net()
    _steps(monkeypatch, Clock(10.0, 9.0, 12.0), net)
    path = cache_file(ampcore.auto_plan("cpu").fingerprint)
    assert path is not None
    data = json.loads(path.read_text())
    (key, stored), *_ = data["roots"].items()
    assert stored["verdict"] == "low"

    forget_plans()  # a new process: reads the verdict, measures nothing
    from ampcore._auto import _roots, _store

    _store.forget()
    _roots.forget()
    silent = Clock(1.0, 1.0, 1.0)
    assert _steps(monkeypatch, silent, net)[1:] == [(torch.bfloat16, torch.bfloat16)] * 2
    assert silent.labels == [] and ampcore.auto_plan("cpu").roots[key].source == "cache"

    data["roots"][key]["verdict"] = "plan"  # does not follow from its figures
    path.write_text(json.dumps(data))
    forget_plans()
    _store.forget()
    _roots.forget()
    clock = Clock(8.0, 9.0, 12.0)
    with pytest.warns(ampcore.AmpcoreWarning, match="whole-call check .* does not follow from the figures"):
        later = _steps(monkeypatch, clock, net)[1:]
    assert clock.labels and later == [(torch.bfloat16, torch.float32)] * 2  # measured again: the plan wins now
    assert main(["plan", "show", str(path)]) == 0  # the cpu plan, not the best device's
    shown = capsys.readouterr().out
    assert "whole call (mixed program)" in shown and key in shown and "measured" in shown


@pytest.mark.parametrize("frozen", [True, False], ids=["loaded-plan", "no-budget"])
def test_without_measuring_a_mixed_program_runs_as_recorded(monkeypatch: pytest.MonkeyPatch, frozen: bool) -> None:
    net, x, y = Net(), torch.randn(4, 32), torch.randn(4, 8)
    clock = Clock(10.0, 9.0, 12.0)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    _decide(net, x, y)
    if frozen:
        ampcore.load_plan(ampcore.auto_plan("cpu").to_dict())
    else:
        monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            out = net(x, y)
    assert clock.labels == [] and [o.dtype for o in out] == [torch.bfloat16, torch.float32]


class Shared(nn.Module):
    """One layer on a small batch (decided float32) and on a big one (decided low)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, small: torch.Tensor, big: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer(small), self.layer(big)


@pytest.mark.parametrize(("figures", "verdict"), [((8.0, 9.0, 12.0), "plan"), ((10.0, 9.0, 12.0), "low")])
def test_a_module_whose_calls_decide_differently_gets_a_program(
    monkeypatch: pytest.MonkeyPatch, figures: tuple[float, float, float], verdict: str
) -> None:
    # issue 27, sixth stop (heldout-flip): the same layer on a batch of 16 (float32) and of
    # 512 (low) was a "conflict": no program, so every call recorded (global hooks and a
    # dispatch mode on every step: 1.2 x torch.autocast)
    from ampcore._auto import _program

    net, small, big = Shared(), torch.randn(4, 8), torch.randn(16, 8)
    clock = Clock(*figures)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    plan = ampcore.auto_plan("cpu")
    plan.set(shape_class(net.layer, (small,), "cpu") or "", _LOSES, source="given")
    plan.set(shape_class(net.layer, (big,), "cpu") or "", _WINS, source="given")
    recorded = []
    monkeypatch.setattr(
        _program.Recording, "close", lambda self, close=_program.Recording.close: recorded.append(1) or close(self)
    )
    found = []
    for _ in range(4):
        with ampcore.autocast("cpu", level="auto"):
            out = net(small, big)
        sum(o.float().sum() for o in out).backward()
        found.append(tuple(o.dtype for o in out))
    assert len(recorded) == 1  # recorded once, then a program
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.verdict == verdict and len(clock.labels) == 3 * (1 + 7)  # checked as a mixed program, once
    first = (torch.float32, torch.bfloat16)  # each call as its own decision
    assert found == [first] + [first if verdict == "plan" else (torch.bfloat16, torch.bfloat16)] * 3


def test_a_busy_check_where_float32_is_clearly_faster_runs_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 27, sixth stop (heldout-tiny on a busy machine): float32 13.4 ms, the O1 lists
    # 16.7 ms, the program 15.3 ms, rounds spread 0.46: every comparison was a "tie", so the
    # root ran as torch.autocast (1.65 x float32's step); a median of 7 rounds resolves 20%
    clock = Clock(15.3, 16.7, 13.4)
    bursts = [1.0, 1.35, 0.8, 1.2, 0.9, 1.3, 0.85]  # other work, not hitting a round's three runs alike
    for shift, (label, ms) in enumerate((("root-plan", 15.3), ("root-low", 16.7), ("root-fp32", 13.4))):
        clock.figures[label] = itertools.cycle([ms * b for b in bursts[2 * shift :] + bursts[: 2 * shift]])
    later = _steps(monkeypatch, clock, Net())[1:]
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.spread > 0.3 and check.runs == 7 and check.verdict == "fp32"
    assert later == [(torch.float32, torch.float32)] * 2


def test_choose_is_a_pure_rule_and_read_checks_follow_it() -> None:
    assert choose(10.0, 20.0, 0.95, 0.47, 0.01) == "plan"
    assert choose(10.0, 20.0, 0.95, 0.47, 0.06) == "low"  # a 5% win within a 6% spread
    assert choose(10.0, 20.0, 0.95, 0.47, 0.06, runs=7) == "plan"  # ... of single rounds: a median of 7 is tighter
    assert choose(16.7, 13.4, 0.839, 1.186, 0.46, runs=7) == "fp32"
    assert choose(16.7, 13.4, 0.839, 1.186, 0.46, runs=1) == "low"
    # heldout-tiny, warm, busy: the runs' medians 9.05 (low) and 8.53 (fp32) look alike, the
    # rounds say low / fp32 = 1.445 / 0.970: the fixed choice goes by the paired ratios
    assert choose(9.049, 8.528, 0.970, 1.445, 0.348, runs=14) == "fp32"
    assert choose(10.0, 9.0, 1.05, 1.17, 0.01) == "fp32"
    good = {"plan_ms": 9.0, "low_ms": 10.0, "fp32_ms": 20.0, "plan_over_low": 0.9, "plan_over_fp32": 0.45}
    good |= {"spread": 0.01, "runs": MIN_RUNS, "verdict": "plan"}
    assert check_from_mapping(good, "cache").verdict == "plan"
    for bad, match in (
        ({"low_ms": float("nan")}, "low_ms = nan"),
        ({"runs": 0}, "runs = 0"),
        ({"verdict": "auto"}, "verdict 'auto'"),
        ({"extra": 1}, "unknown field"),
    ):
        with pytest.raises(ValueError, match=match):
            check_from_mapping(good | bad, "cache")


def test_a_plan_file_with_a_bad_whole_call_check_is_refused_naming_it(tmp_path: Path) -> None:
    data = ampcore.auto_plan("cpu").to_dict()
    data["roots"] = {"Net in=[4x32] grad program=low+1 #0": {"plan_ms": "x"}}
    with pytest.raises(ampcore.AmpcoreError, match=r"whole-call check 'Net in=\[4x32\].*plan_ms = 'x'"):
        ampcore.load_plan(data)


def test_an_exported_plan_carries_its_verdicts_to_every_process_that_loads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from ampcore._auto import _roots, _store

    net = Net()
    _steps(monkeypatch, Clock(10.0, 9.0, 12.0), net)  # rank 0 measures: the program loses, runs as low
    exported = ampcore.auto_plan("cpu").to_dict()
    forget_plans()  # another rank or a resumed run
    _store.forget()
    _roots.forget()
    plan = ampcore.load_plan(exported)  # frozen: measures nothing
    assert [c.source for c in plan.roots.values()] == ["loaded"]
    silent = Clock(8.0, 9.0, 12.0)  # would say "plan" if asked
    assert _steps(monkeypatch, silent, net)[1:] == [(torch.bfloat16, torch.bfloat16)] * 2
    assert silent.labels == []


def test_a_check_too_noisy_to_decide_gets_more_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(8.0, 9.0, 12.0)
    first_low = [9.0, 27.0, 27.0, 27.0, 9.0, 27.0, 9.0, 9.0]  # four slow low runs of 7: no spikes, spread 2.0
    clock.figures["root-low"] = itertools.chain(first_low, clock.figures["root-low"])
    _steps(monkeypatch, clock, Net())
    (check,) = ampcore.auto_plan("cpu").roots.values()
    timed = clock.labels.count("root-low") - 1  # (a warm-up)
    assert timed > 7 and check.runs == timed - 4  # more rounds, until the four slow ones are a minority: spikes
    assert check.verdict == "plan" and check.spread < 0.05


def test_two_spikes_in_a_check_are_left_out_without_timing_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 27, eleventh stop: two rounds hit by other work (a time slice each) are left out,
    # not averaged into a spread that made the check time everything again (or tie)
    clock = Clock(8.0, 9.0, 12.0)
    first_low = [9.0, 27.0, 27.0, 9.0, 9.0, 9.0, 9.0, 9.0]
    clock.figures["root-low"] = itertools.chain(first_low, clock.figures["root-low"])
    _steps(monkeypatch, clock, Net())
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.runs == 5 and len(clock.labels) == 3 * (1 + 7)  # timed once; the two hit rounds left out
    assert check.verdict == "plan" and check.spread < 0.05


def test_a_win_far_beyond_what_the_modules_save_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(9.5, 9.0, 12.0)  # the program loses...
    clock.figures["root-plan"] = itertools.chain([4.0] * 8, clock.figures["root-plan"])  # ...but a burst says 0.44
    _steps(monkeypatch, clock, Net())  # the two float32 layers save 2 x (2.0 - 1.0) ms by their own figures
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.runs >= 14 and check.verdict == "low"  # timed again: no clear win, torch.autocast's program
