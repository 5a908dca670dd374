"""The whole-call check of a *uniform* program (issue 27, tenth stop, helper autocheck).

A program whose planned calls all decided one way (every class low: torch.autocast's
program; or every class float32) was never timed as a whole, so one wrong per-class
figure (a burst of other work over one side's runs, a noisy tie that went to low) or the
work no class's figures hold (the casts between layers, launches) pinned the whole model
to the slower fixed choice for good.  It is now checked once against the *other* fixed
choice, with the same paired, interleaved rounds and noise band as a mixed program.

Decisions are given (``plan.set`` with costs) and whole-call figures come from a fake clock
(labels ``root-plan``, ``root-low``, ``root-fp32``; a module label fails the test): no
wall-clock threshold anywhere.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, counting  # noqa: F401 (fixture)
from test_auto_root_check import budget  # noqa: F401 (an autouse fixture: the budget unspent)
from torch import nn

import ampcore
from ampcore._auto import Costs, _hooks, _roots, _store
from ampcore._auto._cache import cache_file, forget_plans
from ampcore._auto._checks import MAX_CHECKS
from ampcore._auto._measure import MIN_RUNS
from ampcore._auto._shapes import shape_class
from ampcore._cli.main import main

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py
_LOW, _FP32 = Costs(2.0, 1.0, 0.1), Costs(1.0, 2.0, 0.1)  # (fp32 ms, low ms, cast ms): low wins / float32 wins
_CHECK = 2 * (1 + 7)  # a uniform check: two candidates, each warmed, then 7 rounds


class Net(nn.Module):
    """Two layers and a ReLU: every planned call one way when both classes decide alike."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


X = torch.randn(4, 16)


class Clock:
    """Whole-call figures per candidate (a little jitter); ``None``: the candidate must not run."""

    def __init__(self, plan: float, low: float | None, fp32: float | None) -> None:
        self.labels: list[str] = []
        jitter = [1.0, 1.01, 0.99]
        self.figures = {
            f"root-{name}": itertools.cycle([ms * j for j in jitter])
            for name, ms in (("plan", plan), ("low", low), ("fp32", fp32))
            if ms is not None
        }

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(label)
        return next(self.figures[label])  # KeyError: a candidate (or a module) that must not be timed


def _decide(net: Net, costs: Costs) -> None:
    """Every planned class of ``net`` on ``X`` decided by ``costs`` (the second layer's
    input is low precision when the first layer's output is)."""
    plan = ampcore.auto_plan("cpu")
    for dtype in (torch.float32, torch.bfloat16):
        plan.set(shape_class(net.a, (X.to(dtype),), "cpu") or "", costs, source="given")
        plan.set(shape_class(net.b, (torch.zeros(4, 16, dtype=dtype),), "cpu") or "", costs, source="given")


def _new_process() -> None:
    forget_plans()
    _store.forget()
    _roots.forget()


def _steps(
    monkeypatch: pytest.MonkeyPatch, clock: Any, net: Net, costs: Costs, n: int = 3, decide: bool = True
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """``n`` training steps in auto regions: each step's output and the parameters' gradients."""
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    monkeypatch.setattr(_hooks._process, "clocks", {})
    if decide:
        _decide(net, costs)
    found = []
    for _ in range(n):
        with ampcore.autocast("cpu", level="auto"):
            out = net(X)
        out.float().sum().backward()
        found.append((out.detach(), [p.grad.clone() for p in net.parameters() if p.grad is not None]))
        net.zero_grad(set_to_none=True)
    return found


def _fixed_step(net: Net, low: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The fixed choice's step: torch.autocast (``low``) or plain float32."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
        out = net(X)
    out.float().sum().backward()
    found = (out.detach(), [p.grad.clone() for p in net.parameters() if p.grad is not None])
    net.zero_grad(set_to_none=True)
    return found


def _same(a: tuple[torch.Tensor, list[torch.Tensor]], b: tuple[torch.Tensor, list[torch.Tensor]]) -> bool:
    return a[0].dtype == b[0].dtype and torch.equal(a[0], b[0]) and all(map(torch.equal, a[1], b[1]))


def test_an_all_low_program_runs_float32_where_float32_wins_as_a_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # every class decided low (a noisy tie that went to low, or a burst over the float32
    # runs), yet the whole float32 call is 20% faster: the root runs the float32 step
    net = Net()
    clock = Clock(10.0, None, 8.0)
    first, *later = _steps(monkeypatch, clock, net, _LOW)
    assert first[0].dtype == torch.bfloat16  # recorded with the plan's decisions
    fp32_step = _fixed_step(net, low=False)
    assert all(_same(step, fp32_step) for step in later)  # exactly the float32 step
    (key, check), *_ = ampcore.auto_plan("cpu").roots.items()
    assert "program=low+0" in key and (check.verdict, check.source, check.runs) == ("fp32", "measured", 7)
    assert check.plan_over_low == 1.0 and check.plan_over_fp32 > 1.2  # the program is the O1 lists
    assert len(clock.labels) == _CHECK and set(clock.labels) == {"root-plan", "root-fp32"}


def test_an_all_fp32_program_runs_the_o1_lists_where_they_win_as_a_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    net = Net()
    clock = Clock(10.0, 8.0, None)
    first, *later = _steps(monkeypatch, clock, net, _FP32)
    assert first[0].dtype == torch.float32
    autocast_step = _fixed_step(net, low=True)
    assert autocast_step[0].dtype == torch.bfloat16
    assert all(_same(step, autocast_step) for step in later)  # exactly torch.autocast's step
    (key, check), *_ = ampcore.auto_plan("cpu").roots.items()
    assert "program=fp32+0" in key and (check.verdict, check.plan_over_fp32) == ("low", 1.0)
    assert len(clock.labels) == _CHECK and set(clock.labels) == {"root-plan", "root-low"}


@pytest.mark.parametrize(
    ("costs", "figures", "verdict", "dtype"),
    [
        (_LOW, (10.0, None, 9.9), "low", torch.bfloat16),  # a 1% float32 win: within the noise, as recorded
        (_FP32, (10.0, 10.1, None), "low", torch.bfloat16),  # a tie: torch.autocast's choice, not float32
        (_FP32, (10.0, 12.0, None), "fp32", torch.float32),  # float32 wins beyond the noise: as recorded
        (_LOW, (10.0, None, 12.0), "low", torch.bfloat16),  # the O1 lists win: as recorded
    ],
    ids=["low-tie", "fp32-tie", "fp32-wins", "low-wins"],
)
def test_a_tie_goes_to_torch_autocast_and_a_win_keeps_the_program(
    monkeypatch: pytest.MonkeyPatch,
    costs: Costs,
    figures: tuple[float, float | None, float | None],
    verdict: str,
    dtype: torch.dtype,
) -> None:
    net = Net()
    later = _steps(monkeypatch, Clock(*figures), net, costs)[1:]
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.verdict == verdict
    assert all(_same(step, _fixed_step(net, low=dtype == torch.bfloat16)) for step in later)


def test_a_uniform_program_is_checked_once_and_settled_steps_do_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    made = counting(monkeypatch)
    checks: list[int] = []
    from ampcore._auto import _verify

    original = _verify._check

    def spy(*args: Any) -> Any:
        checks.append(1)
        return original(*args)

    monkeypatch.setattr(_verify, "_check", spy)
    clock = Clock(10.0, None, 8.0)
    _steps(monkeypatch, clock, Net(), _LOW, n=6)
    assert len(made) == 1 and len(checks) == 1  # recorded once, checked once
    assert len(clock.labels) == _CHECK  # nothing timed on the four settled steps after it


@pytest.mark.parametrize("case", ["frozen-plan", "no-budget", "no-clock", "process-group", "torch-func"])
def test_the_check_is_skipped_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    net = Net()
    clock = Clock(10.0, None, 8.0)  # would say float32 if asked
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: None if case == "no-clock" else clock)
    _decide(net, _LOW)
    if case == "frozen-plan":
        ampcore.load_plan(ampcore.auto_plan("cpu").to_dict())
    elif case == "no-budget":
        monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    elif case == "process-group":  # the others ranks would wait in the root's collectives
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    params = dict(net.named_parameters())
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            if case == "torch-func":  # every call inside a transform (its tensors are wrapped)

                def loss(p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
                    found = torch.func.functional_call(net, p, (X,))
                    return found.float().sum(), found.detach()

                grads, out = torch.func.grad(loss, has_aux=True)(params)
                assert all(g.dtype == torch.float32 for g in grads.values())
            else:
                out = net(X)
        assert out.dtype == torch.bfloat16  # the program as recorded: torch.autocast's
    assert clock.labels == [] and ampcore.auto_plan("cpu").roots == {}


def test_the_verdict_survives_a_new_process_through_the_cache(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    net = Net()
    _steps(monkeypatch, Clock(10.0, None, 8.0), net, _LOW)
    (key, _), *_ = ampcore.auto_plan("cpu").roots.items()
    _new_process()  # reads the decisions and the verdict from the cache, measures nothing
    silent = Clock(10.0, None, 12.0)  # would say low if asked
    first, *later = _steps(monkeypatch, silent, net, _LOW, decide=False)
    fp32_step = _fixed_step(net, low=False)
    assert first[0].dtype == torch.bfloat16  # the recording applies the plan's decisions
    assert all(_same(step, fp32_step) for step in later)  # then the cached verdict
    check = ampcore.auto_plan("cpu").roots[key]
    assert silent.labels == [] and (check.source, check.verdict) == ("cache", "fp32")
    path = cache_file(ampcore.auto_plan("cpu").fingerprint)
    assert path is not None and main(["plan", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert key in shown and "uniform one" in shown


def test_an_exported_verdict_runs_in_a_process_that_loads_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    net = Net()
    _steps(monkeypatch, Clock(10.0, 8.0, None), net, _FP32)  # rank 0: the O1 lists win as a whole
    exported = ampcore.auto_plan("cpu").to_dict()
    _new_process()
    plan = ampcore.load_plan(exported)  # frozen: measures nothing, keeps the verdict
    assert [c.source for c in plan.roots.values()] == ["loaded"]
    silent = Clock(10.0, 12.0, None)
    steps = _steps(monkeypatch, silent, net, _FP32, decide=False)
    assert silent.labels == [] and all(_same(step, _fixed_step(net, low=True)) for step in steps[1:])


def test_a_busy_check_is_provisional_and_measured_again_by_later_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hooks, "load_of", lambda region: 2.0)  # other work keeps the CPU busy
    net = Net()
    counts = []
    for _ in range(MAX_CHECKS + 1):
        _new_process()
        clock = Clock(10.0, None, 8.0)
        _steps(monkeypatch, clock, net, _LOW, n=2)
        counts.append(len(clock.labels))
        (check,) = ampcore.auto_plan("cpu").roots.values()
    assert counts == [_CHECK] * MAX_CHECKS + [0]  # measured again until MAX_CHECKS, then final
    assert check.checks == MAX_CHECKS and not check.provisional and check.verdict == "fp32"


def test_a_noisy_uniform_check_is_provisional(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(10.0, None, 8.0)
    clock.figures["root-fp32"] = itertools.cycle([8.0, 6.0, 8.0, 7.0])  # spread well over 0.10, float32 wins
    _steps(monkeypatch, clock, Net(), _LOW, n=2)
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.spread > 0.10 and check.provisional and check.verdict == "fp32" and check.runs >= MIN_RUNS


class Planned(nn.Linear):
    """A root that is itself a planned module: its own hooks decide, no whole-call check."""


def test_a_planned_root_and_a_root_without_planned_calls_are_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(10.0, None, 8.0)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    layer = Planned(16, 16)
    ampcore.auto_plan("cpu").set(shape_class(layer, (X,), "cpu") or "", _LOW, source="given")
    plain = nn.Sequential(nn.ReLU(), nn.Tanh())  # nothing planned, nothing of the O1 lists
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            assert layer(X).dtype == torch.bfloat16
            assert plain(X).dtype == torch.float32
    assert clock.labels == [] and ampcore.auto_plan("cpu").roots == {}
