"""Issue 27, held-out model kinds (helper autoshapes): models whose low-precision work is not
all inside planned modules, and the kinds the benchmarks never used (BatchNorm, recurrent
modules, functional ops).

Found with ``benchmarks/bench_auto.py --models heldout-gru heldout-functional``: an
``nn.GRU`` (a CPU's bf16 GRU steps are 1.4 x its float32 ones) or ``F.linear`` /
``torch.matmul`` in a ``forward`` run with the O1 lists, in low precision, as in
torch.autocast; their work is in no shape class's figures, and a program whose planned
modules are all float32 (or all low) was not a *mixed* program, so no whole-call check ever
compared it with float32: auto ran 1.31-1.46 x float32.  Now a recording that saw an op of
the O1 low-precision list outside planned modules gives a program the whole-call check
applies to, and its ``fp32`` choice runs the whole root in float32.

Whole-call times come from a fake clock (labels ``root-plan``, ``root-low``,
``root-fp32``), decisions are given: no wall-clock threshold.  The correctness cases compare
auto (a frozen plan, no measurement) with the fixed precision its plan gives, as
``test_auto_sweep.py`` does, for BatchNorm, LSTM, GRU and functional ops.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_root_check import Clock, budget  # noqa: F401 (budget: an autouse fixture)
from test_auto_sweep import _load, _plan, _same
from torch import nn

import ampcore
from ampcore._auto import Costs, _hooks
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py
_LOSES = Costs(1.0, 2.0, 0.1)  # low/fp32 2.0: decided float32
_WINS = Costs(2.0, 1.0, 0.1)  # low/fp32 0.5: decided low


class Gru(nn.Module):
    """A GRU or LSTM (not a planned kind: its products run with the O1 lists; the LSTM's as
    one ``mkldnn_rnn_layer`` on the CPU) and a Linear head."""

    def __init__(self, cell: str = "GRU") -> None:
        super().__init__()
        self.rnn = getattr(nn, cell)(8, 16, batch_first=True)
        self.head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


class Functional(nn.Module):
    """Weights used by ``F.linear`` and ``torch.matmul`` in the forward (no planned module
    on the path unless ``head``)."""

    def __init__(self, head: bool = True) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.v = nn.Parameter(torch.randn(16, 16) / 4)
        self.head = nn.Linear(16, 16) if head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + torch.matmul(torch.tanh(nn.functional.linear(x, self.w)), self.v)
        return x if self.head is None else self.head(x)


def _given(pairs: list[tuple[nn.Module, torch.Tensor, Costs]]) -> None:
    """Decisions given for ``module`` on ``x`` (float32 and bfloat16 inputs), not measured."""
    plan = ampcore.auto_plan("cpu")
    for module, x, costs in pairs:
        for dtype in (torch.float32, torch.bfloat16):
            plan.set(shape_class(module, (x.to(dtype),), "cpu") or "", costs, source="given")


def _steps(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, model: nn.Module, x: torch.Tensor, ops: set[Any] | None = None
) -> list[Any]:
    """Three training steps in auto regions (one place in the code): each step's output;
    ``ops`` gets the ATen ops of the last step's forward (:func:`_ops`)."""
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    monkeypatch.setattr(_hooks._process, "clocks", {})
    found = []
    for step in range(3):
        with ampcore.autocast("cpu", level="auto"):
            if step == 2 and ops is not None:
                ops.update(_ops(lambda: found.append(model(x))))  # noqa: B023
            else:
                found.append(model(x))
        found[-1].float().sum().backward()
        model.zero_grad(set_to_none=True)
    return found


def _ops(run: Callable[[], Any]) -> set[tuple[str, torch.dtype]]:
    """The (ATen op, dtype of its first tensor argument) pairs ``run()`` dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[tuple[str, torch.dtype]] = set()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None:
                seen.add((func.overloadpacket.__name__, first.dtype))
            return func(*args, **(kwargs or {}))

    with Ops():
        run()
    return seen


@pytest.mark.parametrize("cell", ["GRU", "LSTM"])
@pytest.mark.parametrize("head", [_LOSES, _WINS], ids=["head-fp32", "head-low"])
def test_a_gru_whose_float32_step_is_faster_runs_in_float32(
    monkeypatch: pytest.MonkeyPatch, head: Costs, cell: str
) -> None:
    """The GRU's products ran in bf16 as in torch.autocast (unchecked: 1.42 x float32)."""
    torch.manual_seed(0)
    model, x = Gru(cell), torch.randn(2, 5, 8)
    _given([(model.head, torch.zeros(2, 5, 16), head)])
    clock = Clock(plan=12.0, low=12.0, fp32=8.0)  # float32 1.5 x faster as a whole
    ops: set[Any] = set()
    first, *later = _steps(monkeypatch, clock, model, x, ops)
    assert clock.labels, "the whole-call check never ran"
    (key, check), *_ = ampcore.auto_plan("cpu").roots.items()
    assert check.verdict == "fp32" and key.startswith("Gru in=[2x5x8] grad program=low")
    assert [out.dtype for out in later] == [torch.float32] * 2
    products = {("addmm", torch.float32), ("mkldnn_rnn_layer", torch.float32)}  # GRU's, LSTM's
    assert products & ops and not {op for op in ops if op[1] == torch.bfloat16}
    torch.testing.assert_close(later[-1], model(x), rtol=0, atol=0)  # exactly the float32 step


@pytest.mark.parametrize("head", [True, False], ids=["with-linear", "functional-only"])
def test_functional_products_outside_planned_modules_are_checked_against_float32(
    monkeypatch: pytest.MonkeyPatch, head: bool
) -> None:
    """``F.linear`` / ``torch.matmul`` in a forward ran with the O1 lists, unchecked (1.31 x
    float32 on heldout-functional)."""
    torch.manual_seed(0)
    model, x = Functional(head), torch.randn(4, 16)
    if model.head is not None:
        _given([(model.head, x, _LOSES)])
    clock = Clock(plan=5.0, low=5.0, fp32=4.0)
    *_, last = _steps(monkeypatch, clock, model, x)
    assert clock.labels.count("root-fp32") >= 4
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.verdict == "fp32" and last.dtype == torch.float32
    torch.testing.assert_close(last, model(x), rtol=0, atol=0)


def test_functional_products_that_pay_in_low_precision_keep_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where low precision wins as a whole, the program keeps torch.autocast's products."""
    torch.manual_seed(0)
    model, x = Functional(head=False), torch.randn(4, 16)
    clock = Clock(plan=5.0, low=5.0, fp32=9.0)
    ops: set[Any] = set()
    _steps(monkeypatch, clock, model, x, ops)
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.verdict in ("low", "plan") and ("mm", torch.bfloat16) in ops  # the same work as low


def test_low_tensors_reaching_ops_outside_planned_modules_leave_the_program_uniform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only products of the O1 list outside planned modules make a program mixed: a low layer
    whose output goes into a ReLU (every model of low layers) leaves it uniform, checked only
    against float32 (issue 27, tenth stop), never against the O1 lists it is."""
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    x = torch.randn(4, 16)
    _given([(model[0], x, _WINS), (model[2], x, _WINS)])
    clock = Clock(plan=5.0, low=1.0, fp32=6.0)  # a low figure would say the O1 lists win: never asked
    outs = _steps(monkeypatch, clock, model, x)
    assert set(clock.labels) == {"root-plan", "root-fp32"}
    (key,) = ampcore.auto_plan("cpu").roots
    assert "program=low+0" in key
    assert [out.dtype for out in outs] == [torch.bfloat16] * 3


# --- correctness of the new kinds under auto: the fixed precision the plan gives ------------


class BnNet(nn.Module):
    """Conv + BatchNorm + ReLU, pooling, a residual conv, BatchNorm1d and a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.res = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.BatchNorm2d(8))
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = torch.relu(h + self.res(h))
        return self.head(self.norm(nn.functional.max_pool2d(h, 2).mean((2, 3))))


@pytest.mark.parametrize("decisions", ["fp32-low-fp32", "low-fp32-low"])
def test_batchnorm_model_under_auto_matches_its_fixed_precision(decisions: str) -> None:
    torch.manual_seed(0)
    model, x = BnNet(), torch.randn(4, 3, 8, 8)
    stem, res, head = decisions.split("-")
    _plan([(model.stem[0], (4, 3, 8, 8), stem), (model.res[0], (4, 8, 8, 8), res), (model.head, (4, 8), head)])
    _same(model, lambda step: model(x * (step + 1)))
    stats = model.stem[1].running_mean.clone()
    _same(model, lambda step: model(x))  # the running statistics move as in the fixed precision
    assert not torch.equal(stats, model.stem[1].running_mean)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
@pytest.mark.parametrize("head", ["fp32", "low"])
def test_recurrent_model_under_auto_matches_its_fixed_precision(cell: str, head: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.rnn = getattr(nn, cell)(8, 16, batch_first=True)

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.head = model.rnn, nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0])

    net, x = Head(), torch.randn(2, 5, 8)
    _plan([(net.head, (2, 5, 16), head)])
    _same(net, lambda step: net(x + step))


@pytest.mark.parametrize("head", ["fp32", "low", None])
def test_functional_model_under_auto_matches_its_fixed_precision(head: str | None) -> None:
    torch.manual_seed(0)
    model, x = Functional(head is not None), torch.randn(4, 16)
    if model.head is not None and head is not None:
        _plan([(model.head, (4, 16), head)])
    else:
        _load({})
    _same(model, lambda step: model(x + step))


class Converted(nn.Module):
    """A layer converted to bfloat16 (not planned: the O1 lists run its product, outside
    planned modules, so the program is checked), then two float32 layers."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(16, 16).bfloat16()
        self.big, self.small = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.small(self.big(self.pre(x)))


def test_the_fp32_choice_of_a_program_with_a_converted_layer_keeps_its_layers_switched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A whole root in float32 (autocast off) cannot run a bfloat16 layer on float32 inputs
    (the layer's products are outside planned modules, but its weights are not float32): the
    ``fp32`` choice switches the planned layers instead (their hooks cast the bfloat16
    tensor they get), and nothing fails in the check."""
    torch.manual_seed(0)
    model, x = Converted(), torch.randn(4, 16)
    h = torch.zeros(4, 16, dtype=torch.bfloat16)
    _given([(model.big, h, _WINS), (model.small, h, _LOSES)])
    clock = Clock(plan=5.0, low=5.0, fp32=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)  # no "cannot run again"
        *_, last = _steps(monkeypatch, clock, model, x)
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.verdict == "fp32" and last.dtype == torch.float32
