"""The whole-call check of a model that uses a weight more than once in one call (issue 27,
fourteenth stop): a layer applied in a loop (ALBERT-like shared blocks, an RNN cell stepped
T times, a recurrent refinement), a weight-tied embedding and head.  A real torch.autocast
step casts such a weight to the low dtype once (autocast's weight cache); the check's timed
runs must cost what that step costs, not a cast per use (a bias toward float32 on exactly
these models).  And the region's cache must stay as it was where a call before the check
(the same root at another signature) cast weights a later call reuses.

Casts are counted with a dispatch mode (``aten._to_copy`` of a parameter to bfloat16) per
timed run of a fake clock: no wall-clock threshold anywhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_root_check import budget  # noqa: F401 (fixture: the process's measuring budget, fresh)
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampcore
from ampcore._auto import Costs, _hooks
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state", "budget")  # tests/auto/_auto_testing.py
BF16 = torch.bfloat16
_LOSES, _WINS = Costs(1.0, 2.0, 0.1), Costs(2.0, 1.0, 0.1)  # low/fp32 2.0: fp32; 0.5: low


class Looped(nn.Module):
    """One shared block applied ``steps`` times (decided low) and a small head layer
    (decided float32): a mixed program whose low layer's weight is used ``steps`` times."""

    def __init__(self, steps: int = 4, tied: bool = False) -> None:
        super().__init__()
        self.block = nn.Linear(16, 16)
        self.head = nn.Linear(16, 8)
        self.steps, self.tied = steps, tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            x = torch.tanh(self.block(x))
        if self.tied:  # the block's weight once more, outside the block: as a tied LM head
            x = x @ self.block.weight.t()
        return self.head(x)


class Casts(TorchDispatchMode):
    """Counts the casts of the given parameters to bfloat16, by parameter name."""

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__()
        self.names, self.found = names, Counter[str]()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == BF16:
            name = self.names.get(args[0].data_ptr())
            if name is not None and args[0].dtype == torch.float32:
                self.found[name] += 1
        return func(*args, **kwargs)


def _names(net: nn.Module) -> dict[int, str]:
    return {p.data_ptr(): name for name, p in net.named_parameters()}


class Clock:
    """Whole-call figures per candidate (the program wins); the casts of each timed run."""

    def __init__(self, net: nn.Module) -> None:
        self.names = _names(net)
        self.runs: list[tuple[str, Counter[str]]] = []

    def __call__(self, run: Callable[[], None], label: str) -> float:
        with Casts(self.names) as casts:
            run()
        self.runs.append((label, casts.found))
        return {"root-plan": 8.0, "root-low": 9.0, "root-fp32": 12.0}[label]


def _decide(net: Looped, x: torch.Tensor) -> None:
    plan = ampcore.auto_plan("cpu")
    for dtype in (torch.float32, BF16):  # the block's input is low from its second use on
        plan.set(shape_class(net.block, (x.to(dtype),), "cpu") or "", _WINS, source="given")
    for dtype in (torch.float32, BF16):
        plan.set(shape_class(net.head, (x.to(dtype),), "cpu") or "", _LOSES, source="given")


def _torch_step(net: nn.Module, x: torch.Tensor) -> Counter[str]:
    """The casts of one torch.autocast training step of ``net``."""
    with Casts(_names(net)) as casts:
        with torch.autocast("cpu", dtype=BF16):
            out = net(x)
        torch.autograd.grad(out.float().sum(), list(net.parameters()))
    return casts.found


def _real_casts(clock: Clock, step: Callable[[], torch.Tensor]) -> Counter[str]:
    """The casts of one step in an auto region (``step`` gives its loss; backward after
    the region), the whole-call check's timed runs left out."""
    before = len(clock.runs)
    with Casts(clock.names) as casts:
        with ampcore.autocast("cpu", level="auto"):
            loss = step()
        loss.backward()
    for _, found in clock.runs[before:]:
        casts.found.subtract(found)
    return casts.found


def _trained(monkeypatch: pytest.MonkeyPatch, net: Looped, x: torch.Tensor, retain: bool = False) -> Clock:
    """Three training steps of ``net`` in auto regions (recorded, checked, settled): the clock."""
    clock = Clock(net)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    _decide(net, x)
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            out = net(x)
        out.float().sum().backward(retain_graph=retain)
    return clock


@pytest.mark.parametrize("tied", [False, True], ids=["loop", "loop-and-tied-head"])
def test_the_check_casts_a_looped_weight_once_per_run_as_a_torch_autocast_step(
    monkeypatch: pytest.MonkeyPatch, tied: bool
) -> None:
    """Before the fix the check's runs cast the block's weight at each of its uses (4, 5)
    where a torch.autocast step casts it once: the low side was timed dearer than it is."""
    torch.manual_seed(0)
    net, x = Looped(tied=tied), torch.randn(4, 16)
    reference = _torch_step(net, x)
    # autocast's cache: one cast per step (the tied head's transposed view is not cached)
    assert reference["block.weight"] == (2 if tied else 1)
    clock = _trained(monkeypatch, net, x)
    low = [found for label, found in clock.runs if label == "root-low"]
    assert len(low) == 8  # warmed, then 7 rounds: one check
    assert [found for found in low if found != reference] == [], reference
    plan = [found for label, found in clock.runs if label == "root-plan"]
    assert {found["block.weight"] for found in plan} == {reference["block.weight"]}  # the program's low block too


def test_the_call_after_the_check_casts_its_own_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check's cast weights (their graphs the check's) are not left in the region's
    cache for the real call: it casts once, as the step it is."""
    torch.manual_seed(0)
    net, x = Looped(), torch.randn(4, 16)
    clock = Clock(net)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    _decide(net, x)
    found = []
    for _ in range(3):
        found.append(_real_casts(clock, lambda: net(x).float().sum())["block.weight"])
    assert len(clock.runs) == 3 * 8 and found == [1, 1, 1]


def test_a_check_after_an_earlier_call_in_the_region_keeps_that_calls_casts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A root called at two batch sizes in one region: the second is checked after the
    first cast the weights; the region's cache keeps them, so the third call casts nothing
    and the gradients of the three calls sum before one cast's backward, as torch.autocast."""
    torch.manual_seed(0)
    net, x = Looped(), torch.randn(8, 16)
    clock = Clock(net)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    _decide(net, x)
    for dtype in (torch.float32, BF16):
        ampcore.auto_plan("cpu").set(shape_class(net.block, (x[:2].to(dtype),), "cpu") or "", _WINS, source="given")
        ampcore.auto_plan("cpu").set(shape_class(net.head, (x[:2].to(dtype),), "cpu") or "", _LOSES, source="given")
    found = []
    for _ in range(3):
        found.append(_real_casts(clock, lambda: sum(net(b).float().sum() for b in (x[:4], x[:2], x[4:]))))
    assert clock.runs and [f["block.weight"] for f in found] == [1, 1, 1]


def test_a_check_after_another_roots_call_in_the_region_keeps_that_roots_casts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A generator called twice in one region around a discriminator checked between: the
    generator's casts of the first call stay for the second (one cast, as torch.autocast)."""
    torch.manual_seed(0)
    gen, disc, x = Looped(steps=2), Looped(), torch.randn(4, 16)
    names = {**{k: f"gen.{v}" for k, v in _names(gen).items()}, **{k: f"disc.{v}" for k, v in _names(disc).items()}}
    clock = Clock(disc)
    clock.names = names
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    for net in (gen, disc):
        _decide(net, x)
    found = []
    for _ in range(3):

        def step() -> torch.Tensor:
            fake = gen(x)
            score = disc(torch.cat([fake.float(), fake.float()], 1)[:, :16])
            return score.float().sum() + gen(x).float().sum()

        found.append(_real_casts(clock, step)["gen.block.weight"])
    assert {label for label, _ in clock.runs} >= {"root-plan", "root-low"} and found == [1, 1, 1]


@pytest.mark.parametrize("holder", ["ddp-like-reducer", "retained-graph"])
def test_accumulators_held_elsewhere_still_get_the_cache(monkeypatch: pytest.MonkeyPatch, holder: str) -> None:
    """A DDP reducer holds every parameter's gradient accumulator (to hook it), and so does a
    graph the user keeps (``retain_graph``, the previous step's output): the first look
    (:func:`~ampcore._auto._castcache.may_hold_casts`: is the accumulator held?) says yes, but
    the probe (a ``prelu`` of each held weight under the region's autocast state) sees each
    cast made again, so nothing cached is in the way: the check's runs use the cache and
    cast the looped weight once per run, as the torch.autocast step (fifteenth stop: the
    conservative path is taken only where a cast really is in the region's cache)."""
    from torch.autograd.graph import get_gradient_edge

    torch.manual_seed(0)
    net, x = Looped(), torch.randn(4, 16)
    reference = _torch_step(net, x)
    kept: list[Any] = []
    if holder == "ddp-like-reducer":
        kept = [get_gradient_edge(p).node for p in net.parameters()]
    else:
        kept = [net(x).sum()]  # a float32 graph the user keeps across steps
    clock = _trained(monkeypatch, net, x, retain=holder == "retained-graph")
    low = [found for label, found in clock.runs if label == "root-low"]
    assert kept and len(low) == 8 and all(found == reference for found in low), (low, reference)
