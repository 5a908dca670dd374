"""Issue 27, fourteenth stop: class decisions that heal, second pass.

* a machine busy for good: a class measured busy by a clock that leaves other work's time
  out (a thread's CPU time, runs pre-empted timed again) is provisional only where its own
  runs spread (before: every class, so the next two processes measured every class again);
* a root applied call by call (no program) heals in the process too (before: a later
  process only);
* the classes due in one root call are paced (:data:`._heal.STEP_MS` of estimated
  measurements per call and window; before: all of them in one call, one very slow step);
* copies adopting a kept program (a fresh copy each step) heal (before: a plain cell);
* a class is measured again at most once per process, within the budget's accounting.

Fake clocks, fake loads and a fake time since the recording only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_heal import BURST, QUIET, Clock, Process, _due, _later_process, budget  # noqa: F401
from torch import nn

import ampcore
from ampcore._auto import _again, _heal, _hooks
from ampcore._auto._hostclock import HostClock
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state", "budget")

NEAR = [0.95, 0.97, 0.93, 0.95]  # 0.95 x float32, runs spread about 4%: a tie within the spread


class Shielded(Clock):
    """A clock that leaves other work's time out (a thread's CPU time): nothing exposed."""

    exposed = 0

    def shields(self) -> bool:
        return True


class Exposed(Clock):
    """The wall clock with no count of waits: every run could have been lengthened."""

    exposed = 0

    def __call__(self, run: Callable[[], None], label: str) -> float:
        self.exposed += 1
        return super().__call__(run, label)

    def shields(self) -> bool:
        return False


# --- 1. a machine busy for good ---------------------------------------------------------


def test_the_host_clock_says_which_runs_other_work_could_lengthen() -> None:
    from ampcore._auto._hostclock import exposure, shields

    ticks = iter([0.0, 0.004, 1.0, 1.003])
    own = HostClock(lambda: None, lambda: lambda: next(ticks))  # a thread's CPU time
    own(lambda: None, "fp32")
    assert exposure(own) == 0 and shields(own)
    wall = HostClock(lambda: None)
    wall(lambda: None, "fp32")
    assert exposure(wall) == 1 and not shields(wall)
    waits = iter([0.0, 0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0])  # a clean try, then four pre-empted
    counted = HostClock(lambda: None, waited=lambda: lambda: next(waits))
    counted(lambda: None, "fp32")
    assert exposure(counted) == 0
    counted(lambda: None, "low")
    assert exposure(counted) == 1 and not shields(counted)
    assert exposure(Clock(QUIET)) is None and not shields(Clock(QUIET))  # cannot tell: as the wall clock


def test_a_clear_class_measured_busy_by_a_shielded_clock_is_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    own = Shielded(QUIET)
    proc = Process(monkeypatch, own, 2.0)
    assert proc.steps(3)[1:] == [torch.bfloat16] * 2
    costs = proc.costs()
    assert costs.load == 2.0 and not costs.provisional and costs.checks == 1
    assert "provisional" not in proc.cached()["costs"]
    for _ in range(2):  # busy for good: later processes measure nothing again
        _later_process()
        Process(monkeypatch, own, 2.0).steps(3)
    assert own.measured() == 1


def test_a_busy_shielded_measurement_whose_sides_lie_within_their_spread_stays_provisional(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc = Process(monkeypatch, Shielded(NEAR), 2.0)
    proc.steps(2)
    costs = proc.costs()
    assert _heal.close(costs) and not _heal.noisy(costs)  # (spread under NOISY_SPREAD)
    assert costs.provisional  # the load reached the figures: measured again
    _later_process()
    proc = Process(monkeypatch, Shielded(NEAR), 0.1)
    proc.steps(2)
    assert not proc.costs().provisional  # quiet: the same figures settle


@pytest.mark.parametrize("load, provisional", [(2.0, True), (0.1, False)])
def test_an_exposed_clock_keeps_the_load_rule(monkeypatch: pytest.MonkeyPatch, load: float, provisional: bool) -> None:
    proc = Process(monkeypatch, Exposed(QUIET), load)
    proc.steps(2)
    assert proc.costs().provisional is provisional


def test_a_shielded_clock_measures_a_noisy_class_again_whatever_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Shielded(BURST), 2.0)  # noisy figures
    proc.steps(3)
    assert proc.costs().provisional
    quiet = Shielded(QUIET)
    proc.use(quiet, 2.0)  # still busy: a plain clock would wait for a quiet device
    assert _due(proc)[-1] == torch.bfloat16
    assert quiet.measured() == 1 and not proc.costs().provisional


# --- 2. a root applied call by call -----------------------------------------------------


class Unsigned(nn.Module):
    """A root the guard cannot see (an object among its arguments): applied call by call."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, config: object) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out


def _steps(root: nn.Module, x: torch.Tensor, n: int, call: Callable[[nn.Module], torch.Tensor]) -> list[Any]:
    found = []
    for _ in range(n):
        with ampcore.autocast("cpu", level="auto"):
            out = call(root)
        out.float().sum().backward()
        root.zero_grad(set_to_none=True)
        found.append(out.dtype)
    return found


def _nested(x: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
    def call(root: nn.Module) -> torch.Tensor:
        with ampcore.autocast("cpu", level="auto"):  # a region inside a region: call by call for its life
            out: torch.Tensor = root.body(x)
        return out

    return call


@pytest.mark.parametrize("why", ["unsigned", "nested"])
def test_a_root_applied_call_by_call_heals_in_the_process(monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    proc = Process(monkeypatch, Clock(BURST), None)
    root, config = Unsigned(), object()
    x = torch.randn(4, 8)
    call = (lambda r: r(x, config)) if why == "unsigned" else _nested(x)
    assert _steps(root, x, 3, call)[1:] == [torch.float32] * 2
    key = shape_class(root.body, (x,), "cpu")
    plan = ampcore.auto_plan("cpu")
    assert key is not None and plan.entries[key].costs.provisional  # type: ignore[union-attr]
    quiet = Clock(QUIET)
    proc.use(quiet, 0.1)
    proc.now[0] += _again.AFTER_S
    later = _steps(root, x, _again.CALLS + 2, call)
    assert quiet.measured() == 1 and later[-1] == torch.bfloat16
    assert not plan.entries[key].costs.provisional  # type: ignore[union-attr]
    proc.now[0] += 10 * _again.AFTER_S
    _steps(root, x, 3 * _again.CALLS, call)
    assert quiet.measured() == 1 and not plan.waits  # once: nothing waits any more


def test_a_call_by_call_class_waits_for_a_quiet_device_then_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(BURST), 2.0)
    monkeypatch.setattr(_again, "MAX_LOOKS", 3)
    root, config, x = Unsigned(), object(), torch.randn(4, 8)
    call = lambda r: r(x, config)  # noqa: E731
    _steps(root, x, 3, call)
    for _ in range(4):
        proc.now[0] += _again.AFTER_S
        _steps(root, x, _again.CALLS + 1, call)
    plan = ampcore.auto_plan("cpu")
    assert proc.clock.measured() == 1 and not plan.waits and not plan.due  # given up: a later process


# --- 3. many classes due at once: paced --------------------------------------------------


class Branches(nn.Module):
    """Four layers on the same float32 input: their classes stay whatever the others decide
    (in a chain, a layer turned low changes the next one's input dtype: a new class)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads = nn.ModuleList(nn.Linear(8, n) for n in (16, 24, 32, 40))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([head(x).float() for head in self.heads], dim=1)


def _model() -> nn.Module:
    return Branches()


def test_classes_due_together_are_measured_a_few_per_root_call(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(BURST), None)
    model, x = _model(), torch.randn(4, 8)
    call = lambda m: m(x)  # noqa: E731
    _steps(model, x, 3, call)
    plan = ampcore.auto_plan("cpu")
    keys = [k for k, e in plan.entries.items() if e.costs is not None and e.costs.provisional]
    assert len(keys) == 4
    one = max(_heal.estimate_ms(plan.entries[k].costs) for k in keys)
    monkeypatch.setattr(_heal, "STEP_MS", 1.5 * one)  # room for one class per call and window
    quiet = Clock(QUIET)
    proc.use(quiet, 0.1)
    seen = []
    for _ in range(4):
        proc.now[0] += _again.AFTER_S
        _steps(model, x, _again.CALLS + 1, call)
        seen.append(sum(plan.healed.values()))
    assert seen == [1, 2, 3, 4]  # one class a window (before: all four in one call)
    assert all(plan.entries[k].decision == "low" and not plan.entries[k].costs.provisional for k in keys)  # type: ignore[union-attr]


def test_the_pace_takes_at_least_one_class_and_what_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    Process(monkeypatch, Clock(BURST), None)
    plan = ampcore.auto_plan("cpu")
    from ampcore._auto._costs import Costs

    for key, ms in (("a", 300.0), ("b", 1.0), ("c", 20.0)):
        plan.set(key, Costs(ms, ms, 0.0, runs=7))
    monkeypatch.setattr(_heal, "STEP_MS", 200.0)
    assert _heal._pace(plan, ["a", "b", "c"]) == ["a"]  # over the step alone: taken (one at least)
    assert _heal._pace(plan, ["b", "c"]) == []  # the window is spent
    monkeypatch.setattr(_heal, "_now", lambda: 10.0)
    assert _heal._pace(plan, ["b", "c"]) == ["b"]  # a new window: 18 ms, then 360 would pass the step
    assert _heal.estimate_ms(plan.entries["a"].costs) == 400.0  # one class's share at most


# --- 4. copies adopting a kept program ---------------------------------------------------


def test_a_fresh_copy_each_step_heals(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(BURST), None)
    base, x = _model(), torch.randn(4, 8)
    found: list[nn.Module] = []

    def call(_: nn.Module) -> torch.Tensor:
        found.append(copy.deepcopy(base))  # a fresh copy per step (an EMA, a replica)
        out: torch.Tensor = found[-1](x)
        return out

    _steps(base, x, 4, call)
    plan = ampcore.auto_plan("cpu")
    keys = [k for k, e in plan.entries.items() if e.costs is not None and e.costs.provisional]
    assert len(keys) == 4
    from ampcore._auto import _twins

    assert _twins._kept and all(isinstance(p.stale, _heal.Heal) for p, _ in _twins._kept.values())
    quiet = Clock(QUIET)
    proc.use(quiet, 0.1)
    proc.now[0] += _again.AFTER_S
    later = _steps(base, x, _again.CALLS + 3, call)
    assert sum(plan.healed.values()) == 4 and len(later) == _again.CALLS + 3  # measured again (before: never here)
    assert all(plan.entries[k].decision == "low" and not plan.entries[k].costs.provisional for k in keys)  # type: ignore[union-attr]


# --- 5. at most once per class, within the budget ----------------------------------------


def test_a_class_is_measured_again_once_per_process_and_the_budget_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(BURST), None)
    proc.steps(3)
    monkeypatch.setattr(_hooks._process, "spent_s", 0.0)
    burst = Clock(BURST)  # noisy again: still provisional, left to a later process
    proc.use(burst, None)
    for _ in range(5):
        _due(proc)
    assert burst.measured() == 1 == _heal.MAX_HEAL
    assert _hooks._process.spent_s > 0.0  # its time is the process's budget's
    costs = proc.costs()
    assert costs.provisional and costs.checks == 2 and type(proc.cell()) is not _heal.Heal
    _later_process()
    proc = Process(monkeypatch, Clock(QUIET), 0.1)
    proc.steps(3)
    assert proc.clock.measured() == 1 and not proc.costs().provisional  # the later process settles it


def test_a_provisional_cache_entry_is_measured_once_in_the_reading_process(monkeypatch: pytest.MonkeyPatch) -> None:
    Process(monkeypatch, Clock(BURST), None).steps(3)
    _later_process()
    burst = Clock(BURST)
    proc = Process(monkeypatch, burst, None)
    proc.steps(3)
    assert burst.measured() == 1 and proc.costs().provisional
    for _ in range(3):
        _due(proc)
    assert burst.measured() == 1 and type(proc.cell()) is not _heal.Heal
