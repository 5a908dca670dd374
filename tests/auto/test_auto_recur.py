"""Issue 27, sixteenth stop: recordings after settling, on many roots of one class.

An ``ensemble`` process of the last stop's end A/B (20 small models of one class, each a
root in a region of its own per step) recorded 20 times in its timed steps, one per model.
Cause: the 19 models adopting the first one's program (:mod:`._twins`) share one
:class:`._heal.Heal` cell, and a provisional class coming due set it for good: every model
recorded again, though one recording measures the class; a cell that found nothing left to
measure (measured by another root's recording, given up while busy, no budget) recorded
its root again too.  Now one root call records (and measures) per class due; the others
keep their programs (their cell swaps to a plain one at their next lookup, so their
settled path is as before); where the new figures change the decision, the other roots
adopt the first one's new program instead of each recording.

Fake clocks, fake loads and a fake time since the recording only (tests/auto/test_auto_heal.py's).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_heal import BURST, QUIET, Clock, Process, budget  # noqa: F401
from torch import nn

import ampcore
from ampcore._auto import _again, _heal, _roots
from ampcore._auto._plan import Stale

pytestmark = pytest.mark.usefixtures("auto_state", "budget")

MODELS = 6


class Ensemble:
    """``MODELS`` models of one class (copies of one: the same layers), each a root in a
    region of its own per step, at one place in the code; recordings counted per model."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, proc: Process, one_layer: bool = False) -> None:
        self.proc = proc
        monkeypatch.setattr(_again, "_now", lambda: proc.now[0])  # a provisional verdict's countdown: the fake time too
        torch.manual_seed(0)
        base = nn.Linear(8, 8) if one_layer else nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.models = [copy.deepcopy(base) for _ in range(MODELS)]
        self.x = torch.randn(4, 8)
        self.recorded: Counter[int] = Counter()
        real = _roots._record

        def counted(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            self.recorded[id(module)] += 1
            return real(module, *args, **kwargs)

        monkeypatch.setattr(_roots, "_record", counted)

    def steps(self, n: int, later_s: float = 0.0) -> list[torch.dtype]:
        self.proc.now[0] += later_s
        found = []
        for _ in range(n):
            for m in self.models:
                with ampcore.autocast("cpu", level="auto"):
                    out = m(self.x)
                out.float().sum().backward()
                found.append(out.dtype)
                m.zero_grad(set_to_none=True)
        return found

    def cells(self) -> list[type]:
        """The type of each model's stale cell (inside a provisional verdict's countdown, if any)."""
        cells = [_roots._local.last[id(m)].stale for m in self.models]
        return [type(c.cell if isinstance(c, _again.Recheck) else c) for c in cells]

    def recordings(self) -> int:
        return sum(self.recorded.values())


def _settled(monkeypatch: pytest.MonkeyPatch, clock: Clock, load: float | None, one_layer: bool = False) -> Ensemble:
    ens = Ensemble(monkeypatch, Process(monkeypatch, clock, load), one_layer)
    ens.steps(3)
    plan = ampcore.auto_plan("cpu")
    assert any(e.costs is not None and e.costs.provisional for e in plan.entries.values())
    assert all(issubclass(c, _heal.Heal) for c in ens.cells())  # counting down to a measurement again
    ens.recorded.clear()
    return ens


def test_a_class_measured_again_with_the_same_decision_records_one_root_not_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ens = _settled(monkeypatch, Clock(QUIET), 2.0)  # clear figures, measured busy: provisional
    plan = ampcore.auto_plan("cpu")
    changes = plan.changes
    quiet = Clock(QUIET)
    ens.proc.use(quiet, 0.1)
    ens.steps(_again.CALLS + 2, later_s=_again.AFTER_S)
    assert plan.changes == changes and sum(plan.healed.values()) == 2  # each class once, same decisions
    assert quiet.measured() == 2
    assert ens.recordings() == 1  # the root whose call measured them (before: every model, 6)
    ens.steps(3)
    assert ens.recordings() == 1
    assert ens.cells() == [Stale] * MODELS  # nothing left to measure: the plain cell, the settled path as before


def test_a_device_busy_for_good_gives_the_countdown_up_without_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    ens = _settled(monkeypatch, Clock(BURST), 2.0)
    measured = ens.proc.clock.measured()
    monkeypatch.setattr(_again, "MAX_LOOKS", 3)
    for _ in range(4):
        ens.steps(_again.CALLS + 2, later_s=_again.AFTER_S)
    assert ens.proc.clock.measured() == measured  # not measured again: left to a later process
    assert ens.recordings() == 0  # (before: every model recorded again, for nothing)
    assert ens.cells() == [Stale] * MODELS


def test_a_spent_budget_records_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from ampcore._auto import _hooks

    ens = _settled(monkeypatch, Clock(BURST), None)
    monkeypatch.setattr(_hooks._process, "spent_s", 600.0)  # over half of the budget: kept for first measurements
    ens.steps(_again.CALLS + 2, later_s=_again.AFTER_S)
    assert ens.recordings() == 0 and ens.cells() == [Stale] * MODELS


def test_a_changed_decision_records_one_root_and_the_others_adopt_its_program(monkeypatch: pytest.MonkeyPatch) -> None:
    ens = _settled(monkeypatch, Clock(BURST), None, one_layer=True)  # a burst made low look slower: float32
    assert ens.steps(1) == [torch.float32] * MODELS
    quiet = Clock(QUIET)
    ens.proc.use(quiet, 0.1)
    later = ens.steps(_again.CALLS + 2, later_s=_again.AFTER_S)
    assert later[-MODELS:] == [torch.bfloat16] * MODELS  # the quiet decision, in every model
    # the recording that measured (the plan changed under it: no program, so that model records
    # once more), one under the new decision, whose program the others adopt (before: 7)
    assert quiet.measured() == 1 and ens.recordings() == 3
    ens.steps(3)
    assert ens.recordings() == 3 and ens.cells() == [Stale] * MODELS


def test_a_model_changed_in_place_still_records(monkeypatch: pytest.MonkeyPatch) -> None:
    ens = _settled(monkeypatch, Clock(QUIET), 2.0)
    ens.proc.use(Clock(QUIET), 0.1)
    ens.steps(_again.CALLS + 2, later_s=_again.AFTER_S)
    ens.recorded.clear()
    ens.models[3][2].to(torch.bfloat16)  # a layer converted in place: its guard sees it
    out = ens.steps(2)
    assert ens.recorded[id(ens.models[3])] >= 1 and sum(ens.recorded.values()) == ens.recorded[id(ens.models[3])]
    assert out[3] == out[MODELS + 3] == torch.bfloat16


def test_copies_re_checking_a_provisional_verdict_keep_their_own_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_auto_heal_more import Shielded

    ens = Ensemble(monkeypatch, Process(monkeypatch, Shielded(QUIET), 2.0))  # clear classes, a verdict measured busy
    ens.steps(3)
    plan = ampcore.auto_plan("cpu")
    assert not any(e.costs is not None and e.costs.provisional for e in plan.entries.values())
    lasts = [_roots._local.last[id(m)] for m in ens.models]
    assert all(isinstance(last.stale, _again.Recheck) for last in lasts)  # a provisional verdict's countdown
    assert len({id(last.stale) for last in lasts}) == MODELS  # each model its own (before: the copies shared one)
    ens.proc.use(Shielded(QUIET), 0.1)
    ens.steps(_again.CALLS + 2, later_s=_again.AFTER_S)  # re-checked, quiet
    for m in ens.models:  # each runs a program on its own modules (before: the copies ran the first model's)
        owners = {id(p) for p, _, _ in _roots._local.last[id(m)].weights}
        assert owners and owners <= {id(layer._parameters) for layer in m}
    ens.recorded.clear()
    ens.models[3][2].to(torch.bfloat16)  # so a layer converted in place is seen
    out = ens.steps(1)
    assert ens.recorded[id(ens.models[3])] == 1 == ens.recordings() and out[3] == torch.bfloat16
