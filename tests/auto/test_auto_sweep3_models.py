"""Issue 27, third held-out sweep of ``level="auto"`` (continued from ``test_auto_sweep3.py``,
whose helpers it uses): a model changed between steps (``requires_grad`` toggled, a layer
frozen, ``eval()`` / ``train()``, a user hook on a layer, ``load_state_dict`` also with
``assign=True``, a layer converted, ``weight_norm``), roots whose forward returns a dict, a
dataclass, a list, ``None`` or a generator, and the sweep's cases with plans measured in
the first steps (a fake clock: no wall-clock threshold).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import (
    BF16,
    FP16,
    Convs,
    Enter,
    Inner,
    Step,
    Tokens,
    _backward,
    _mlp,
    _train,
    _wide,
    counting,
    run,
)
from torch import nn

import ampcore
from ampcore._auto import _hooks

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    return counting(monkeypatch)


# --- (6) a model changed between steps -----------------------------------------------------


def _changes(change: str) -> Callable[[nn.Module, int], None]:
    """What ``change`` does to the model before step ``i`` (the same on the copy)."""

    def apply(m: nn.Module, i: int) -> None:
        first = m[0]
        if change == "requires_grad":  # fine-tuning: the first layer unfrozen from step 2, again frozen at 4
            first.requires_grad_(i in (2, 3))
        elif change == "freeze":
            if i == 2:
                for p in m[2].parameters():
                    p.requires_grad_(False)
        elif change == "eval-train":
            m.train(i % 2 == 0)
        elif change == "user-hook":
            if i == 2:
                m.__dict__["_as3_hook"] = m[2].register_forward_hook(lambda mod, a, out: out * 0.5)
            elif i == 4 and "_as3_hook" in m.__dict__:  # (the plan's run made a copy per step)
                m.__dict__.pop("_as3_hook").remove()
        elif change == "load_state_dict":
            if i in (2, 4):
                torch.manual_seed(100 + i)
                m.load_state_dict(type(m)(*[type(layer)(*_sizes(layer)) for layer in m]).state_dict())
        elif change.startswith("load_state_dict-bf16"):  # assign=True takes the state's dtype: a layer in bf16
            layer = "0." if change.endswith("fp32-layer") else "2."  # (layer 0 is decided float32)
            if i == 2 and not m.__dict__.setdefault("_as3_assigned", False):  # once (new parameters)
                m.__dict__["_as3_assigned"] = True
                state = {k: v.to(BF16) if k.startswith(layer) else v for k, v in m.state_dict().items()}
                m.load_state_dict(state, assign=True)
        elif change == "weight_norm" and i == 2 and not nn.utils.parametrize.is_parametrized(m[0]):
            nn.utils.parametrizations.weight_norm(m[0])  # (the copy made for the plan: already done)
        elif change.startswith("half") and i == 2:  # converted in place
            m[0 if change.endswith("fp32-layer") else 2].to(BF16)

    return apply


def _sizes(layer: nn.Module) -> tuple[int, ...]:
    return (layer.in_features, layer.out_features) if isinstance(layer, nn.Linear) else ()


class Bf16Safe(nn.Sequential):
    """An MLP whose layers cast their input to their own weight's dtype (a model with a bf16
    layer the user converted)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            weight = getattr(layer, "weight", None)
            x = layer(x if weight is None else x.to(weight.dtype))
        return x


def _changing() -> nn.Sequential:
    return Bf16Safe(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 4))


def _changing_wide() -> nn.Sequential:
    return Bf16Safe(*_wide())


CHANGES = [
    "requires_grad",
    "freeze",
    "eval-train",
    "user-hook",
    "load_state_dict",
    "load_state_dict-bf16",
    "half-layer",
    "load_state_dict-bf16-fp32-layer",
    "half-fp32-layer",
    "weight_norm",
]


@pytest.mark.parametrize("make", [_changing, _changing_wide], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("change", CHANGES)
def test_a_model_changed_between_steps(make: Any, change: str, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    apply = _changes(change)

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        apply(m, i)
        return _train(m, x, enter)

    run(make, step, 6, recordings)


# --- (7) what a root's forward returns ------------------------------------------------------


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: list[torch.Tensor]
    extra: Any = None


class Returns(nn.Module):
    """The MLP's layers, returning ``kind``: a dict, a dataclass, a list, None (the result
    kept on the module) or a generator of the layers' outputs."""

    def __init__(self, kind: str, wide: bool = False) -> None:
        super().__init__()
        self.kind, self.layers = kind, (_wide() if wide else _mlp())
        self.kept: Any = None

    def _each(self, x: torch.Tensor) -> Iterator[torch.Tensor]:
        for layer in self.layers:
            x = layer(x)
            yield x

    def forward(self, x: torch.Tensor) -> Any:
        if self.kind.startswith("generator"):
            return self._each(x)
        hidden = list(self._each(x))
        if self.kind == "dict":
            return {"logits": hidden[-1], "hidden": hidden[:-1], "none": None}
        if self.kind == "dataclass":
            return Output(hidden[-1], hidden[:-1])
        if self.kind == "list":
            return hidden
        self.kept = hidden[-1]
        return None


@pytest.mark.parametrize("wide", [False, True], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("kind", ["dict", "dataclass", "list", "none", "generator", "generator-outside"])
def test_what_the_root_returns(kind: str, wide: bool, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m(x)
            if kind == "generator":
                out = list(out)  # consumed inside the region
            elif kind == "none":
                out = m.kept
        if kind == "generator-outside":
            out = list(out)  # the layers run after the region, without autocast
        _backward(out)
        return out

    run(lambda: Returns(kind, wide), step, 3, recordings)


# --- measured: the same dimensions where the plan is measured in the first steps ----------


class _Clock:
    """A device clock: a measured class's low precision wins (1 ms against 4), and a mixed
    program wins its whole-call check (plan 1 ms, low 2, fp32 3): the program runs."""

    def __init__(self) -> None:
        self.ms = {"fp32": 4.0, "low": 1.0, "root-plan": 1.0, "root-low": 2.0, "root-fp32": 3.0}
        self.labels: list[str] = []

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(label)
        return self.ms.get(label, 0.01) * (1.0 + 0.01 * (len(self.labels) % 3))


@pytest.fixture
def measuring(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """Measurements allowed (a budget, the fake clock, nothing spent)."""
    clock = _Clock()
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "60")
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    for name, value in (("spent_s", 0.0), ("warned", False), ("clocks", {})):
        monkeypatch.setattr(_hooks._process, name, value)
    return clock


def _measured_cases() -> dict[str, tuple[Callable[[], nn.Module], Step, torch.dtype]]:
    x, ids, mask = torch.randn(8, 16), torch.randint(0, 50, (4, 6)), torch.rand(4, 6) > 0.3
    image = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    batches = [torch.randn(8, 16), torch.randn(0, 16), torch.randn(8, 16)]

    def grad_input(m: nn.Module, i: int, enter: Enter) -> Any:
        xi = torch.randn(8, 16, generator=torch.Generator().manual_seed(i), requires_grad=True)
        return _train(m, xi, enter, FP16), xi.grad

    scalers: dict[int, tuple[Any, Any]] = {}

    def scaled(m: nn.Module, i: int, enter: Enter) -> Any:  # fp16, the optimizer step in the region
        if id(m) not in scalers:
            scaler = ampcore.GradScaler("cpu", dtype=FP16, init_scale=256.0, growth_interval=2)
            scalers[id(m)] = (torch.optim.SGD(m.parameters(), lr=0.1), scaler)
        opt, scaler = scalers[id(m)]
        with enter(FP16):
            out = m(x)
            scaler.scale(out.float().pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        return out

    return {
        "fp16": (_mlp, lambda m, i, enter: _train(m, x, enter, FP16), FP16),
        "grad-scaler-fp16": (_mlp, scaled, FP16),
        "tokens": (Tokens, lambda m, i, enter: _train(m, ids, enter, mask=mask), BF16),
        "bf16-input": (_mlp, lambda m, i, enter: _train(m, x.to(BF16), enter), BF16),
        "grad-input-fp16": (_mlp, grad_input, FP16),
        "channels_last": (Convs, lambda m, i, enter: _train(m, image, enter), BF16),
        "zero-batch": (_mlp, lambda m, i, enter: _train(m, batches[i % 3], enter), BF16),
        "torch-off-inside": (lambda: Inner("torch-off"), lambda m, i, enter: _train(m, x, enter), BF16),
        "auto-inside": (lambda: Inner("auto"), lambda m, i, enter: _train(m, x, enter), BF16),
        "dict-output": (lambda: Returns("dict"), lambda m, i, enter: _train(m, x, enter), BF16),
    }


@pytest.mark.parametrize("case", list(_measured_cases()))
def test_measured_cases_match_the_fixed_precision(case: str, measuring: _Clock, recordings: list[Any]) -> None:
    """The first steps measure the classes decided low and check the mixed program as a
    whole: outputs, gradients and parameters still equal the fixed precision, and, once
    every signature ran after the last measurement, the settled steps record nothing."""
    make, step, dtype = _measured_cases()[case]
    run(make, step, 6, recordings, (dtype,), measured=True)  # (a program made before a measurement records again)
    assert ("low" in measuring.labels) != (case == "torch-off-inside"), (
        measuring.labels
    )  # (its low layers: autocast off)
