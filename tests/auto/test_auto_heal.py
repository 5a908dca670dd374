"""Issue 27, thirteenth stop: class decisions that heal.  A shape class measured busy or
noisy is provisional: it is measured again later in the process that measured it (when the
device is not busy, a bounded number of times) and by a later process, and a clear new
measurement replaces it in memory and in the disk cache.

Before, a class decision was decided once and cached for good unless its figures were
implausible: a burst of other work over the low-precision runs pinned a layer to float32 in
every later process.  Fake clocks, fake loads and a fake time since the recording only.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from torch import nn

import ampcore
from ampcore._auto import _again, _heal, _hooks, _roots
from ampcore._auto._cache import cache_file, forget_plans
from ampcore._auto._checks import MAX_CHECKS
from ampcore._auto._costs import Costs
from ampcore._auto._plan import Stale, seal
from ampcore._auto._shapes import shape_class
from ampcore._cli.main import main

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

QUIET = [0.6, 0.606, 0.594]  # low precision's runs on a quiet device: 0.6 x float32's
BURST = [1.3, 1.3, 0.9, 1.3, 0.9, 1.3, 0.9, 1.3]  # a burst of other work over most low runs: 1.3 x
_MEASURED = 2 + 7  # float32 runs of one class measurement: warm-up, 7 rounds, casts aside


@pytest.fixture(autouse=True)
def budget(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "1000")  # real time spent on a loaded machine decides nothing
    for name, value in (("spent_s", 0.0), ("warned", False), ("clocks", {})):
        monkeypatch.setattr(_hooks._process, name, value)
    yield


class Clock:
    """A class's float32 runs at 1 ms (a little jitter), its low runs from ``low`` in turn."""

    def __init__(self, low: list[float]) -> None:
        self.labels: list[str] = []
        self.low = itertools.cycle(low)
        self.fp32 = itertools.cycle([1.0, 1.01, 0.99])

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(label)
        return next(self.fp32) if label == "fp32" else next(self.low) if label == "low" else 0.01

    def measured(self) -> int:
        """Class measurements so far (the plausibility check's second one included)."""
        return self.labels.count("casts") // 4


class Process:
    """One process's training steps of a layer in auto regions, with a fake device clock and
    load and a fake time since its program was recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, clock: Clock, load: float | None) -> None:
        self.monkeypatch = monkeypatch
        self.now = [0.0]
        monkeypatch.setattr(_heal, "_now", lambda: self.now[0])
        self.use(clock, load)
        torch.manual_seed(0)
        self.layer, self.x = nn.Linear(8, 8), torch.randn(4, 8)
        self.key = shape_class(self.layer, (self.x,), "cpu") or ""

    def use(self, clock: Clock, load: float | None | Callable[[], float | None]) -> None:
        """From now on the device's clock is ``clock`` and its load ``load``."""
        self.clock = clock
        self.monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
        self.monkeypatch.setattr(_hooks._process, "clocks", {})
        self.monkeypatch.setattr(_hooks, "load_of", lambda region: load() if callable(load) else load)

    def steps(self, n: int, later_s: float = 0.0) -> list[torch.dtype]:
        """``n`` steps, ``later_s`` seconds after the last ones; the output dtype of each."""
        self.now[0] += later_s
        found = []
        for _ in range(n):
            with ampcore.autocast("cpu", level="auto"):
                out = self.layer(self.x)
            out.float().sum().backward()
            found.append(out.dtype)
            self.layer.zero_grad(set_to_none=True)
        return found

    def costs(self) -> Costs:
        entry = ampcore.auto_plan("cpu").entries[self.key]
        assert entry.costs is not None
        return entry.costs

    def cached(self) -> dict[str, Any]:
        path = cache_file(ampcore.auto_plan("cpu").fingerprint)
        assert path is not None
        return json.loads(path.read_text())["entries"][self.key]  # type: ignore[no-any-return]

    def cell(self) -> Any:
        return _roots._local.last[id(self.layer)].stale


def _later_process() -> None:
    """What a new process has: the disk cache only."""
    forget_plans()
    _roots.forget()


def _due(proc: Process, calls: int = _again.CALLS + 2) -> list[torch.dtype]:
    return proc.steps(calls, later_s=_again.AFTER_S)


def test_a_class_measured_in_a_burst_then_quiet_flips_in_the_same_process(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(BURST), None)
    assert proc.steps(3)[1:] == [torch.float32] * 2  # the burst made low look 30% slower
    costs = proc.costs()
    assert costs.provisional and costs.checks == 1 and proc.cached()["costs"]["provisional"] is True
    assert isinstance(proc.cell(), _heal.Heal)  # the countdown: programs of provisional classes only
    quiet = Clock(QUIET)
    proc.use(quiet, 0.1)
    later = _due(proc)
    assert quiet.measured() == 1  # measured again, once
    assert later[-1] == torch.bfloat16  # the quiet decision runs from the next root calls on
    entry = ampcore.auto_plan("cpu").entries[proc.key]
    assert (entry.decision, entry.source, entry.costs and entry.costs.provisional) == ("low", "measured", False)
    raw = proc.cached()
    assert raw["decision"] == "low" and raw["costs"]["checks"] == 2 and "provisional" not in raw["costs"]
    assert raw["costs"]["load"] == 0.1 and raw["costs"]["low_ms"] == pytest.approx(0.6)
    assert type(proc.cell()) is Stale  # settled: the plain cell, no countdown
    proc.steps(4 * _again.CALLS, later_s=10 * _again.AFTER_S)
    assert quiet.measured() == 1  # a settled class is never measured again
    _later_process()
    Process(monkeypatch, quiet, 0.1).steps(3)
    assert quiet.measured() == 1  # nor by a later process


def test_a_settled_class_is_never_measured_again_and_keeps_the_plain_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet = Clock(QUIET)
    proc = Process(monkeypatch, quiet, 0.1)
    assert proc.steps(3)[1:] == [torch.bfloat16] * 2
    assert not proc.costs().provisional and type(proc.cell()) is Stale
    assert "provisional" not in proc.cached()["costs"] and "checks" not in proc.cached()["costs"]
    for _ in range(4):
        proc.steps(_again.CALLS + 1, later_s=10 * _again.AFTER_S)
    _later_process()
    proc = Process(monkeypatch, quiet, 2.0)
    proc.steps(3)
    assert quiet.measured() == 1
    assert "?" not in ampcore.debugging.auto_plan_table("cpu").splitlines()[2]


def test_a_class_measured_noisy_again_stays_provisional_and_is_measured_at_most_n_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    burst = Clock(BURST)  # noisy throughout (the adapter does not say its load)
    proc = Process(monkeypatch, burst, None)
    proc.steps(3)
    for _ in range(6):
        _due(proc)
    assert burst.measured() == 1 + _heal.MAX_HEAL
    costs = proc.costs()
    assert costs.provisional and costs.checks == MAX_CHECKS - 1  # not made final by the count here
    assert type(proc.cell()) is Stale  # nothing left to measure here: the settled path as before
    assert ampcore.auto_plan("cpu").healed[proc.key] == _heal.MAX_HEAL


def test_a_class_measured_busy_waits_for_a_quiet_device(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(BURST), 2.0)
    proc.steps(3)
    assert proc.costs().provisional and proc.costs().load == 2.0
    quiet = Clock(QUIET)
    proc.use(quiet, 2.0)  # the figures would be right, but the adapter still says busy
    for _ in range(3):
        assert _due(proc)[-1] == torch.float32
    assert quiet.measured() == 0 and isinstance(proc.cell(), _heal.Heal)
    proc.use(quiet, 0.2)
    assert _due(proc)[-1] == torch.bfloat16
    assert quiet.measured() == 1 and not proc.costs().provisional


def test_a_device_busy_for_good_gives_the_countdown_up(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(BURST), 2.0)
    proc.steps(3)
    monkeypatch.setattr(_again, "MAX_LOOKS", 3)
    for _ in range(4):
        _due(proc)
    assert proc.clock.measured() == 1 and type(proc.cell()) is Stale  # dropped here, for a later process
    assert proc.costs().provisional


def test_a_class_measured_busy_is_measured_again_by_later_processes_until_final(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    quiet = Clock(QUIET)  # the figures are clear, but every process measures at load 2
    proc = Process(monkeypatch, quiet, 2.0)
    proc.steps(3)
    assert proc.costs().provisional and proc.costs().checks == 1
    for checks in range(2, MAX_CHECKS + 1):
        _later_process()
        proc = Process(monkeypatch, quiet, 2.0)
        proc.steps(3)  # measured again at its first call, busy or not
        assert quiet.measured() == checks and proc.costs().checks == checks
        assert proc.costs().provisional is (checks < MAX_CHECKS)
    _later_process()
    Process(monkeypatch, quiet, 2.0).steps(3)
    assert quiet.measured() == MAX_CHECKS  # final: never measured again


def test_a_later_process_replaces_a_provisional_decision_with_a_clear_one(monkeypatch: pytest.MonkeyPatch) -> None:
    Process(monkeypatch, Clock(BURST), 2.0).steps(3)
    _later_process()
    quiet = Clock(QUIET)
    proc = Process(monkeypatch, quiet, 0.1)
    assert proc.steps(3) == [torch.float32] + [torch.bfloat16] * 2  # its first call runs as cached, then measured
    assert quiet.measured() == 1 and proc.cached()["decision"] == "low"
    assert proc.cached()["costs"]["checks"] == 2 and "provisional" not in proc.cached()["costs"]


def test_a_noisier_measurement_does_not_replace_a_quieter_one(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(QUIET), 2.0)  # clear figures, measured busy
    proc.steps(3)
    first = proc.costs()
    proc.use(Clock(BURST), lambda: 2.0 if proc.clock.labels else 0.1)  # quiet at the look, busy while measured
    assert _due(proc)[-1] == torch.bfloat16
    kept = proc.costs()
    assert kept.low_ms == first.low_ms and kept.checks == 2 and kept.provisional


def test_a_re_measurement_with_the_same_decision_records_no_program_again(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(QUIET), 2.0)
    proc.steps(3)
    plan = ampcore.auto_plan("cpu")
    changes = plan.changes
    proc.use(Clock(QUIET), 0.1)
    _due(proc)
    assert plan.changes == changes and not proc.costs().provisional  # same decision: programs stay valid


def test_a_frozen_plan_or_a_spent_budget_measures_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(BURST), None)
    proc.steps(3)
    monkeypatch.setattr(_hooks._process, "spent_s", 600.0)  # over half of the budget: kept for first measurements
    _due(proc)
    assert proc.clock.measured() == 1 and proc.costs().provisional and type(proc.cell()) is Stale


def test_older_cache_entries_read_as_settled_and_provisional_ones_as_due(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(QUIET), None)
    plan = ampcore.auto_plan("cpu")
    path = cache_file(plan.fingerprint)
    assert path is not None
    old = {"decision": "fp32", "costs": {"fp32_ms": 1.0, "low_ms": 1.3, "cast_ms": 0.01, "runs": 7}}
    marked = {"decision": "fp32", "costs": {**old["costs"], "low_spread": 0.3, "load": 2.0, "provisional": True}}
    other = proc.key.replace("4x8", "64x8")
    entries = {proc.key: marked, other: old}
    fp = plan.fingerprint
    path.parent.mkdir(parents=True, exist_ok=True)
    seals = {"entries": {k: seal(fp, k, v) for k, v in entries.items()}, "roots": {}}
    path.write_text(
        json.dumps({"format": 2, "fingerprint": fp, "margin": 0.03, "entries": entries, "roots": {}, "seals": seals})
    )
    _later_process()
    plan = ampcore.auto_plan("cpu")
    assert plan.due == {proc.key}
    costs = plan.entries[other].costs
    assert costs is not None and (costs.provisional, costs.checks, costs.load, costs.spikes) == (False, 1, None, 0)
    table = ampcore.debugging.auto_plan_table("cpu")
    row = next(line for line in table.splitlines() if line.startswith(proc.key))
    assert row.split()[-4:] == ["2.00", "1?", "fp32", "cache"] and "?: provisional" in table
    assert proc.steps(2) == [torch.float32, torch.bfloat16]  # measured again after its first call
    assert proc.clock.measured() == 1 and plan.due == set()


def test_plan_show_marks_provisional_classes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = Process(monkeypatch, Clock(BURST), 1.5)
    proc.steps(2)
    assert main(["plan", "show", "--device", "cpu"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(proc.key))
    assert row.split()[-4:] == ["1.50", "1?", "fp32", "measured"]


@pytest.mark.parametrize(
    "field, value",
    [("provisional", "yes"), ("checks", 0), ("load", -1.0), ("load", "busy"), ("spikes", -2), ("checks", True)],
)
def test_the_new_cost_fields_are_checked(field: str, value: Any) -> None:
    from ampcore._auto._costs import costs_from_mapping

    with pytest.raises(ValueError, match=field):
        costs_from_mapping({"fp32_ms": 1.0, "low_ms": 0.5, field: value})


def test_a_provisional_cache_entry_dropped_as_implausible_is_measured_once(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(QUIET), None)
    plan = ampcore.auto_plan("cpu")
    fp, path = plan.fingerprint, cache_file(plan.fingerprint)
    assert path is not None
    costs = {"fp32_ms": 1.0, "low_ms": 1.3, "cast_ms": 0.01, "runs": 7, "low_spread": 0.3, "provisional": True}
    entries = {
        proc.key: {"decision": "fp32", "costs": costs},  # disagrees with its neighbour (0.3): both dropped
        proc.key.replace("4x8", "8x8"): {"decision": "low", "costs": {**costs, "low_ms": 0.3, "low_spread": 0.0}},
    }
    seals = {"entries": {k: seal(fp, k, v) for k, v in entries.items()}, "roots": {}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 2, "fingerprint": fp, "entries": entries, "roots": {}, "seals": seals}))
    _later_process()
    assert ampcore.auto_plan("cpu").due == set()
    assert proc.steps(4)[1:] == [torch.bfloat16] * 3
    assert proc.clock.measured() == 1  # measured as new, not again as due
