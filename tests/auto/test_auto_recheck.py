"""Issue 27, twelfth stop: a provisional whole-call verdict is measured again in the process
that measured it, once its program has run settled for a while.

Before, a process whose first check was taken in a noisy moment (another process's burst,
the first steps' allocator growth) kept that verdict for its whole life; only a later
process measured it again.  Fake clocks, fake loads and a fake time since the check only:
no wall-clock threshold.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_root_check import _LOSES, _WINS, Clock, Net, _decide, budget  # noqa: F401 (budget: an autouse fixture)
from torch import nn

import ampcore
from ampcore._auto import _again, _hooks, _roots, _verify
from ampcore._auto._cache import cache_file
from ampcore._auto._checks import MAX_CHECKS

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py
_PLAN, _LOW = (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)  # output dtypes per verdict
_NOISY_LOW = [9.0, 9.0, 10.2, 9.0, 10.2, 9.0, 10.2, 9.0] * 8  # the O1 lists' runs spread 0.13


class Process:
    """One process's training steps in auto regions (one place in the code), with a fake
    time since auto's re-check countdown started (``later``) and a fake load."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, clock: Clock, load: float | None, net: nn.Module, small: Any = _LOSES
    ) -> None:
        self.monkeypatch, self.net = monkeypatch, net
        self.now = [0.0]
        monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "1000")  # real time spent on a loaded machine decides nothing
        monkeypatch.setattr(_again, "_now", lambda: self.now[0])
        self.use(clock, load)
        self.x, self.y = torch.randn(4, 32), torch.randn(4, 8)
        _decide(net, self.x, self.y, small)  # type: ignore[arg-type]

    def use(self, clock: Clock, load: float | None) -> None:
        """From now on the device's clock is ``clock`` and its load ``load``."""
        self.clock = clock
        self.monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
        self.monkeypatch.setattr(_hooks._process, "clocks", {})
        self.monkeypatch.setattr(_hooks, "load_of", lambda region: load)

    def steps(self, n: int, later_s: float = 0.0, zero: bool = True) -> list[tuple[torch.dtype, ...]]:
        """``n`` steps, ``later_s`` seconds after the last ones; the output dtypes of each."""
        self.now[0] += later_s
        found = []
        for _ in range(n):
            with ampcore.autocast("cpu", level="auto"):
                out = self.net(self.x, self.y)
            sum(o.float().sum() for o in out).backward()
            found.append(tuple(o.dtype for o in out))
            if zero:
                self.net.zero_grad(set_to_none=True)
        return found


def _check() -> Any:
    (check,) = ampcore.auto_plan("cpu").roots.values()
    return check


def _cached() -> dict[str, Any]:
    path = cache_file(ampcore.auto_plan("cpu").fingerprint)
    assert path is not None
    (raw,) = json.loads(path.read_text())["roots"].values()
    return raw  # type: ignore[no-any-return]


def _settled_cell(net: nn.Module) -> Any:
    return _roots._local.last[id(net)].stale


_ROUNDS = 3 * (1 + 7)  # one whole-call check of a mixed program: 3 candidates, warmed, 7 rounds


def test_a_provisional_verdict_whose_later_rounds_are_clear_flips_in_the_same_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    busy = Clock(8.0, 9.0, 12.0)  # under load the program looks 11% faster
    proc = Process(monkeypatch, busy, 2.0, Net())
    assert proc.steps(3)[1:] == [_PLAN] * 2
    assert (_check().verdict, _check().provisional, _check().checks) == ("plan", True, 1)
    assert isinstance(_settled_cell(proc.net), _again.Recheck)  # the countdown: provisional programs only
    quiet = Clock(9.0, 9.0, 12.0)  # quiet: no win
    proc.use(quiet, 0.1)
    later = proc.steps(_again.CALLS + 2, later_s=_again.AFTER_S)
    assert len(quiet.labels) == _ROUNDS  # measured again, once
    assert later[-1] == _LOW  # the quiet verdict runs from the next root call on
    check = _check()
    assert (check.verdict, check.provisional, check.checks, check.source) == ("low", False, 2, "measured")
    raw = _cached()  # and is what the next process reads
    assert (raw["verdict"], raw["provisional"], raw["checks"], raw["load"]) == ("low", False, 2, 0.1)
    assert raw["spread"] == check.spread
    assert not isinstance(_settled_cell(proc.net), _again.Recheck)  # clear: no countdown any more
    proc.steps(4 * _again.CALLS, later_s=10 * _again.AFTER_S)
    assert len(quiet.labels) == _ROUNDS  # a clear verdict is never measured again


def test_a_verdict_still_within_the_noise_stays_on_torch_autocasts_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    noisy = Clock(9.0, 9.0, 12.0)
    noisy.figures["root-low"] = iter(_NOISY_LOW)
    proc = Process(monkeypatch, noisy, None, Net())
    assert proc.steps(3)[1:] == [_LOW] * 2
    assert (_check().verdict, _check().provisional) == ("low", True)
    again = Clock(9.0, 9.0, 12.0)
    again.figures["root-low"] = iter(_NOISY_LOW)
    proc.use(again, None)
    assert proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S) == [_LOW] * (_again.CALLS + 1)
    check = _check()
    assert again.labels and (check.verdict, check.provisional, check.checks) == ("low", True, 2)
    assert _cached()["provisional"] is True


def test_re_checks_in_one_process_are_bounded_and_leave_the_verdict_to_a_later_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    noisy = Clock(9.0, 9.0, 12.0)  # noisy throughout (the adapter does not say its load): provisional
    noisy.figures["root-low"] = itertools.cycle(_NOISY_LOW)
    proc = Process(monkeypatch, noisy, None, Net())
    proc.steps(3)
    for _ in range(6):
        proc.steps(_again.CALLS, later_s=_again.AFTER_S)
    assert len(noisy.labels) == _ROUNDS * (1 + _again.MAX_AGAIN)
    check = _check()
    assert check.provisional and check.checks == MAX_CHECKS - 1  # not made final by count here
    assert not isinstance(_settled_cell(proc.net), _again.Recheck)  # no countdown left: the settled path as before


def test_not_before_the_program_ran_settled_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = Clock(8.0, 9.0, 12.0)
    proc = Process(monkeypatch, busy, 2.0, Net())
    proc.steps(3)
    proc.use(proc.clock, 0.1)  # the device is quiet by the time it is due
    proc.steps(3 * _again.CALLS)  # many calls, no time: not yet
    proc.steps(_again.CALLS - 2, later_s=_again.AFTER_S)  # time, too few calls since the last look: not yet
    assert len(busy.labels) == _ROUNDS
    proc.steps(2)
    assert len(busy.labels) == 2 * _ROUNDS


def test_a_re_check_stays_within_the_processs_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = Clock(8.0, 9.0, 12.0)
    proc = Process(monkeypatch, busy, 2.0, Net())
    proc.steps(3)
    proc.use(proc.clock, 0.1)  # the device is quiet by the time it is due
    monkeypatch.setattr(_hooks._process, "spent_s", _hooks.budget_s())  # the budget is spent
    assert proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S)[-1] == _PLAN  # the verdict as it was
    assert len(busy.labels) == _ROUNDS and _check().checks == 1
    assert not isinstance(_settled_cell(proc.net), _again.Recheck)  # skipped, not deferred: no countdown left
    monkeypatch.setattr(_hooks._process, "spent_s", 0.0)
    proc.steps(2 * _again.CALLS, later_s=_again.AFTER_S)
    assert len(busy.labels) == _ROUNDS


def test_a_re_check_leaves_the_rest_of_the_budget_to_first_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = Clock(8.0, 9.0, 12.0)
    proc = Process(monkeypatch, busy, 2.0, Net())
    proc.steps(3)
    proc.use(proc.clock, 0.1)  # the device is quiet by the time it is due
    monkeypatch.setattr(_hooks._process, "spent_s", _again.SPARE * _hooks.budget_s())  # budget left, not spare
    proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S)
    assert len(busy.labels) == _ROUNDS and not isinstance(_settled_cell(proc.net), _again.Recheck)


def test_a_re_check_counts_in_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    proc = Process(monkeypatch, Clock(8.0, 9.0, 12.0), 2.0, Net())
    proc.steps(3)
    proc.use(proc.clock, 0.1)  # the device is quiet by the time it is due
    spent = _hooks._process.spent_s
    proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S)
    assert _hooks._process.spent_s > spent and _check().checks == 2


def test_a_frozen_plan_is_never_checked_again_in_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    net = Net()
    proc = Process(monkeypatch, Clock(8.0, 9.0, 12.0), 2.0, net)
    proc.steps(3)
    exported = ampcore.auto_plan("cpu").to_dict()
    from ampcore._auto import _store
    from ampcore._auto._cache import forget_plans

    forget_plans()
    _store.forget()
    _roots.forget()
    ampcore.load_plan(exported, freeze=True)
    silent = Clock(9.0, 9.0, 12.0)
    proc.use(silent, 0.0)
    proc.steps(3 * _again.CALLS, later_s=_again.AFTER_S)
    proc.steps(_again.CALLS, later_s=_again.AFTER_S)
    assert silent.labels == [] and not isinstance(_settled_cell(net), _again.Recheck)


def test_a_re_check_leaves_parameters_gradients_buffers_rng_and_optimizer_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[bool]] = []
    original = _verify._check

    def spy(root: nn.Module, *args: Any) -> Any:
        state = {k: v.clone() for k, v in root.state_dict().items()}
        grads = [None if p.grad is None else p.grad.clone() for p in root.parameters()]
        rng = torch.get_rng_state()
        moments = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state.items()}
        modes = [m.training for m in root.modules()]
        grad_mode = torch.is_grad_enabled()
        found = original(root, *args)
        seen.append(
            [
                all(torch.equal(v, state[k]) for k, v in root.state_dict().items()),
                all(
                    (g is None and p.grad is None) or (g is not None and p.grad is not None and torch.equal(g, p.grad))
                    for g, p in zip(grads, root.parameters(), strict=True)
                ),
                torch.equal(rng, torch.get_rng_state()),
                all(torch.equal(t, moments[k][n]) for k, s in opt.state.items() for n, t in s.items()),
                modes == [m.training for m in root.modules()],
                grad_mode == torch.is_grad_enabled(),
            ]
        )
        return found

    monkeypatch.setattr(_verify, "_check", spy)
    net = Net(norm=True)  # BatchNorm (running statistics) and dropout (the RNG), training mode
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    proc = Process(monkeypatch, Clock(8.0, 9.0, 12.0), 2.0, net)
    proc.steps(3)
    proc.use(proc.clock, 0.1)  # the device is quiet by the time it is due
    opt.step()  # momentum buffers; the gradients of the next steps accumulate (no zero_grad)
    proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S, zero=False)
    assert len(seen) == 2 and seen[1] == [True] * 6  # the first check, then the re-check


def test_a_re_check_whose_forward_raises_keeps_the_verdict_and_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    busy = Clock(8.0, 9.0, 12.0)
    proc = Process(monkeypatch, busy, 2.0, Net())
    proc.steps(3)
    proc.use(proc.clock, 0.1)  # the device is quiet by the time it is due

    def fails(*args: Any) -> Any:
        raise RuntimeError("a bad batch")

    monkeypatch.setattr(_verify, "_check", fails)
    assert proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S)[-1] == _PLAN
    assert _check().checks == 1 and not isinstance(_settled_cell(proc.net), _again.Recheck)


def test_a_uniform_programs_provisional_tie_flips_to_float32_when_float32_is_clearly_faster_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    noisy = Clock(9.0, 9.0, 9.0)  # every module low: torch.autocast's program, timed against float32
    noisy.figures["root-plan"] = iter(_NOISY_LOW)
    proc = Process(monkeypatch, noisy, None, Net(), small=_WINS)
    assert proc.steps(3)[1:] == [_LOW] * 2
    assert (_check().verdict, _check().provisional) == ("low", True)
    clear = Clock(10.0, 10.0, 8.0)  # float32 20% faster, quietly
    proc.use(clear, 0.0)
    later = proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S)
    assert set(clear.labels) == {"root-plan", "root-fp32"} and len(clear.labels) == 2 * (1 + 7)
    assert later[-1] == (torch.float32, torch.float32)
    assert (_check().verdict, _check().provisional, _cached()["verdict"]) == ("fp32", False, "fp32")


def test_a_re_check_waits_while_the_device_is_still_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured busy, a check is provisional whatever its figures: re-checking on a device
    still busy would only spend the budget (at load 8-11 a re-check took seconds of wall
    time).  It waits for a quieter moment, then flips."""
    busy = Clock(8.0, 9.0, 12.0)
    proc = Process(monkeypatch, busy, 2.0, Net())
    proc.steps(3)
    for _ in range(3):  # due three times, busy each time: looked at, not measured
        proc.steps(_again.CALLS, later_s=_again.AFTER_S)
    assert len(busy.labels) == _ROUNDS and isinstance(_settled_cell(proc.net), _again.Recheck)
    quiet = Clock(9.0, 9.0, 12.0)
    proc.use(quiet, 0.1)
    assert proc.steps(_again.CALLS + 1, later_s=_again.AFTER_S)[-1] == _LOW
    assert len(quiet.labels) == _ROUNDS and (_check().verdict, _check().provisional) == ("low", False)


def test_a_device_busy_for_good_drops_the_re_check(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = Clock(8.0, 9.0, 12.0)
    proc = Process(monkeypatch, busy, 2.0, Net())
    proc.steps(3)
    for _ in range(_again.MAX_LOOKS + 1):
        proc.steps(_again.CALLS, later_s=_again.AFTER_S)
    assert len(busy.labels) == _ROUNDS  # never measured busy
    assert not isinstance(_settled_cell(proc.net), _again.Recheck)  # no countdown left on the settled path
