"""Issue 27, fifteenth stop: whole-call verdicts follow the clock's busy rule, as classes do.

A whole-call check (:mod:`ampcore._auto._verify`) measured while the adapter reports other
work (``ampcore_auto_load`` over 0.5) was provisional whatever its clock: every later
process measured it again (three times in all) and the process that measured it re-checked
it, waiting for a quiet moment that a machine busy for good never gives.  A class's
measurement already trusted a clock that leaves other work's time out of every run (the CPU
adapter's one-thread CPU time: *shielded*), provisional under load only where its sides lie
within twice their spread (``_heal.provisional``).  The whole-call check now does the same:
a shielded check is busy only where a comparison its verdict rests on is :func:`close`; a
clock that cannot say (the wall clock with no count of waits, event clocks) keeps the load
rule; the shielding is stored with the check (``shielded``) so the provisional mark a later
process reads still follows from the figures.  A provisional verdict's re-check in the same
process still waits for quiet whatever the clock (measured: re-checks under load came out
noisy again and cost seconds of the user's steps).

Fake clocks (``exposed`` and ``shields`` as :class:`ampcore._auto._hostclock.HostClock`
says them) and fake loads only: no wall-clock threshold.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_provisional import _new_process, _process
from test_auto_recheck import _NOISY_LOW, _ROUNDS, Process, _cached, _check, _settled_cell
from test_auto_root_check import Clock, Net, budget  # noqa: F401 (budget: an autouse fixture)

import ampcore
from ampcore._auto import _again
from ampcore._auto._cache import cache_file
from ampcore._auto._checks import RootCheck, check_from_mapping, close, provisional

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py
_PLAN, _LOW = (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)  # output dtypes per verdict


class Timed(Clock):
    """A clock that says whether other work could lengthen its runs (``exposed`` grows per
    run the wall clock times) and whether it leaves other work out (``shields``)."""

    def __init__(self, plan: float, low: float, fp32: float, shielded: bool = True) -> None:
        super().__init__(plan, low, fp32)
        self.shielded, self.exposed = shielded, 0

    def __call__(self, run: Callable[[], None], label: str) -> float:
        self.exposed += not self.shielded
        return super().__call__(run, label)

    def shields(self) -> bool:
        return self.shielded


def Shielded(plan: float, low: float, fp32: float) -> Timed:  # noqa: N802 (a clock's kind)
    return Timed(plan, low, fp32)


def Exposed(plan: float, low: float, fp32: float) -> Timed:  # noqa: N802
    return Timed(plan, low, fp32, shielded=False)


def test_a_clear_verdict_measured_busy_by_a_shielded_clock_is_final(monkeypatch: pytest.MonkeyPatch) -> None:
    # the program 11% faster, runs spread ~2%: no burst of other work is in a thread's CPU time
    net = Net()
    later, check = _process(monkeypatch, Shielded(8.0, 9.0, 12.0), net, load=2.0)
    assert later == [_PLAN] * 2
    assert (check.verdict, check.provisional, check.shielded, check.load) == ("plan", False, True, 2.0)
    raw = _cached()
    assert (raw["provisional"], raw["shielded"]) == (False, True)
    assert not isinstance(_settled_cell(net), _again.Recheck)  # no re-check in this process either
    for _ in range(2):  # later processes, busy too: read, not measured again
        _new_process()
        silent = Shielded(1.0, 9.0, 12.0)
        later, check = _process(monkeypatch, silent, net, load=3.0)
        assert silent.labels == [] and later == [_PLAN] * 2 and (check.checks, check.source) == (1, "cache")


def test_a_busy_shielded_check_whose_comparison_lies_within_the_spread_stays_provisional(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Shielded(8.0, 9.0, 12.0)
    clock.figures["root-plan"] = itertools.cycle([8.0, 8.6, 8.0, 8.9, 8.3])  # 0.92-0.99 x low, spread ~4%
    _, check = _process(monkeypatch, clock, Net(), load=2.0)
    assert check.shielded and check.near and check.provisional
    _new_process()
    again = Shielded(9.0, 9.0, 12.0)
    _process(monkeypatch, again, Net(), load=2.0)
    assert len(again.labels) == _ROUNDS  # measured again by the next process


@pytest.mark.parametrize("clock", [Exposed, Clock], ids=["wall-clock", "cannot-tell"])
def test_a_clock_that_can_see_other_work_keeps_the_load_rule(monkeypatch: pytest.MonkeyPatch, clock: Any) -> None:
    _, check = _process(monkeypatch, clock(8.0, 9.0, 12.0), Net(), load=2.0)
    assert (check.provisional, check.shielded) == (True, False)
    assert "shielded" not in _cached()  # written only where set: earlier versions' entries keep their seals


def test_a_noisy_check_stays_provisional_with_a_shielded_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Shielded(9.0, 9.0, 12.0)
    clock.figures["root-low"] = iter(_NOISY_LOW)
    _, check = _process(monkeypatch, clock, Net(), load=0.1)
    assert check.spread > 0.1 and check.provisional


@pytest.mark.parametrize("clock", [Shielded, Exposed], ids=["shielded", "exposed"])
def test_a_provisional_verdicts_re_check_in_its_process_waits_for_quiet_with_any_clock(
    monkeypatch: pytest.MonkeyPatch, clock: Any
) -> None:
    """A noisy check under load: re-measured at once in the process, it came out noisy
    again (spreads 0.12-0.17 of thread CPU time at load 2-3 here) and cost the user's steps
    a whole check each time (5-7 s of measuring per warm process in ``bench_auto.py``
    instead of 1-2 s): the re-check in the process keeps waiting for quiet; a later
    process measures it (above)."""
    noisy = clock(8.0, 9.0, 12.0)
    noisy.figures["root-low"] = iter(_NOISY_LOW)
    proc = Process(monkeypatch, noisy, 2.0, Net())
    assert proc.steps(3)[1:] == [_PLAN] * 2 and _check().provisional
    proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S)
    assert len(noisy.labels) == _ROUNDS and isinstance(_settled_cell(proc.net), _again.Recheck)
    quiet = clock(9.0, 9.0, 12.0)
    proc.use(quiet, 0.1)
    assert proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S)[-1] == _LOW
    assert len(quiet.labels) == _ROUNDS and (_check().verdict, _check().provisional) == ("low", False)


_CLEAR = {"plan": [8.0, 8.1, 7.9] * 3, "low": [9.0] * 9, "fp32": [12.0] * 9}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"shielded": "yes"}, "shielded = 'yes'"),
        ({"shielded": False}, "provisional = False does not follow"),  # a busy clear check made final by hand
    ],
)
def test_a_damaged_shielded_mark_is_refused(change: dict[str, Any], match: str) -> None:
    raw = RootCheck.of(_CLEAR, load=2.0, shielded=True).as_dict()
    assert raw["shielded"] is True and raw["provisional"] is False
    assert check_from_mapping(raw, "cache").shielded
    with pytest.raises(ValueError, match=match):
        check_from_mapping({**raw, **change}, "cache")


def test_the_rule() -> None:
    # a uniform program (one ratio exactly 1): only float32 against the O1 lists decides
    assert not close(1.0, 0.5, 0.05) and close(1.0, 0.97, 0.02)
    # a mixed program: also the program against the better fixed choice
    assert close(0.95, 0.47, 0.04) and not close(0.80, 0.40, 0.05)
    assert provisional(0.05, 2.0, 1) and not provisional(0.05, 2.0, 1, shielded=True, near=False)
    assert provisional(0.15, 2.0, 1, shielded=True, near=False)  # noisy: whatever the clock


def test_a_long_steps_check_cut_by_the_budget_is_final_where_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 ms step gets the budget's few rounds (``PER_ROOT_MS``: 4 here, not 7); timed by a
    shielded clock its clear verdict no longer waits for quiet processes: the budget rule
    for long steps is the busy rule (a close or noisy one is measured again, in this
    process and the next)."""
    net = Net()
    later, check = _process(monkeypatch, Shielded(80.0, 100.0, 130.0), net, load=2.0)
    assert check.runs < 7 and (check.verdict, check.provisional) == ("plan", False)
    assert later == [_PLAN] * 2
    near = Shielded(96.0, 100.0, 130.0)  # 4% within a 2% jitter's twice-the-spread: provisional
    near.figures["root-plan"] = itertools.cycle([92.0, 99.0, 97.0, 95.0])
    cache_file(ampcore.auto_plan("cpu").fingerprint).unlink()  # type: ignore[union-attr]
    _new_process()
    _, check = _process(monkeypatch, near, Net(), load=2.0)
    assert check.runs < 7 and check.provisional
