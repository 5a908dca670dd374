"""Issue 27: applying a settled plan costs (nearly) nothing per module call.

A root call (the model called directly in an outermost ``level="auto"`` region) is recorded
once with the global hooks; later calls with the same input signature run its *program*:
no global hook, no per-call check for modules that follow the default (float32 or low,
chosen to hook the fewest), instance hooks only on the modules switched to the other
precision.  Decisions come from plans given to ``ampcore.load_plan`` (no timing).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from torch import nn

import ampcore
from ampcore._auto import _hooks, _program, _store
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class Net(nn.Module):
    """``big`` layers (a ReLU after each, unless not ``relu``), then residual ``small`` ones;
    ``matmul``: a functional matmul at the end."""

    def __init__(self, big: int = 1, small: int = 3, matmul: bool = False, relu: bool = True) -> None:
        super().__init__()
        self.relu = relu
        self.big = nn.ModuleList(nn.Linear(32, 32) for _ in range(big))
        self.small = nn.ModuleList(nn.Linear(8, 8) for _ in range(small))
        self.w = nn.Parameter(torch.randn(8, 8)) if matmul else None
        self.seen: dict[str, torch.dtype] = {}  # the output dtype of each layer's last call

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for i, layer in enumerate(self.big):
            x = layer(x)
            self.seen[f"big.{i}"] = x.dtype
            x = torch.relu(x) if self.relu else x
        for i, layer in enumerate(self.small):
            h = layer(y)
            self.seen[f"small.{i}"] = h.dtype
            y = y + torch.tanh(h)
        if self.w is not None:
            y = y @ self.w
            self.seen["matmul"] = y.dtype
        return x, y

    def small_dtypes(self) -> set[torch.dtype]:
        return {d for k, d in self.seen.items() if k.startswith("small")}


def _load(**decisions: str) -> None:
    ampcore.load_plan(
        {
            "format": 2,
            "fingerprint": ampcore.auto_plan("cpu").fingerprint,
            "entries": {k: {"decision": d} for k, d in decisions.items()},
        }
    )


def _plan(net: Net, x: torch.Tensor, y: torch.Tensor, big: str, small: str) -> None:
    with torch.enable_grad():
        keys = {}
        if len(net.big):
            keys[shape_class(net.big[0], (x,), "cpu")] = big
            keys[shape_class(net.big[0], (x.bfloat16(),), "cpu")] = big
        keys[shape_class(net.small[0], (y,), "cpu")] = small
    _load(**{k: v for k, v in keys.items() if k is not None})


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    pre = _hooks._pre
    monkeypatch.setattr(_hooks, "_pre", lambda *a: calls.append(type(a[0]).__name__) or pre(*a))
    return calls


def _programs(net: nn.Module) -> list[_program.Program]:
    return [p for p in _store._programs.get(net, {}).values() if isinstance(p, _program.Program)]


def _step(net: nn.Module, *args: Any, **kwargs: Any) -> Any:
    with ampcore.autocast("cpu", level="auto"):
        return net(*args, **kwargs)


def test_a_settled_root_of_float32_modules_runs_no_hook_and_exactly_as_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    net, x, y = Net(big=0, small=5), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    with torch.no_grad():
        _step(net, x, y)  # another signature (grad mode), recorded first
    first = _step(net, x, y)  # recorded with the global hooks
    calls = _counting(monkeypatch)
    for _ in range(3):
        out = _step(net, x, y)
    assert calls == []  # no global hook ran for any module
    program = _store._programs[net][_program.signature((x, y), {})]
    assert isinstance(program, _program.Program) and len(_programs(net)) == 2
    assert program.default_fp32 and program.switched == ()
    assert torch.equal(out[1], net(x, y)[1]) and torch.equal(first[1], out[1])
    assert not net.small[0]._forward_pre_hooks and not net._forward_pre_hooks and not _hooks.installed()


def test_only_the_modules_whose_decision_differs_from_the_default_are_hooked(monkeypatch: pytest.MonkeyPatch) -> None:
    net, x, y = Net(big=1, small=3, relu=False), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    first = _step(net, x, y)
    (program,) = _programs(net)
    assert program.default_fp32 and [r() for r in program.switched] == [net.big[0]]
    calls = _counting(monkeypatch)
    out_x, _ = _step(net, x, y)
    assert calls == []
    # the big layer ran in bfloat16 and its output stays bfloat16, as on the recorded call
    assert net.seen["big.0"] == torch.bfloat16 == first[0].dtype and net.small_dtypes() == {torch.float32}
    big = net.big[0]
    assert torch.equal(out_x, nn.functional.linear(x.bfloat16(), big.weight.bfloat16(), big.bias.bfloat16()))


def test_a_low_default_hooks_the_float32_modules() -> None:
    net, x, y = Net(big=3, small=1), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    _step(net, x, y)
    _step(net, x, y)
    (program,) = _programs(net)
    assert not program.default_fp32 and [r() for r in program.switched] == [net.small[0]]
    assert net.seen["big.2"] == torch.bfloat16 and net.small_dtypes() == {torch.float32}


def test_a_low_precision_op_outside_planned_modules_keeps_the_low_default() -> None:
    net, x, y = Net(big=0, small=4, matmul=True), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    for _ in range(3):
        _step(net, x, y)
        assert net.seen["matmul"] == torch.bfloat16  # the functional matmul follows the O1 lists
        assert net.small_dtypes() == {torch.float32}
    (program,) = _programs(net)
    assert not program.default_fp32 and len(program.switched) == 4


def test_a_new_input_signature_is_recorded_and_both_programs_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    net, x, y, wide = Net(big=0, small=2), torch.randn(4, 32), torch.randn(4, 8), torch.randn(64, 8)
    with torch.enable_grad():
        _load(
            **{
                shape_class(net.small[0], (y,), "cpu") or "": "fp32",
                shape_class(net.small[0], (wide,), "cpu") or "": "low",
            }
        )
    for _ in range(2):
        _step(net, x, y)
        assert net.small_dtypes() == {torch.float32}
    calls = _counting(monkeypatch)
    _step(net, x, wide)  # recorded: the global hooks ran
    assert calls and net.small_dtypes() == {torch.bfloat16}
    calls.clear()
    _step(net, x, wide)
    assert net.small_dtypes() == {torch.bfloat16}
    _step(net, x, y)
    assert net.small_dtypes() == {torch.float32}
    assert calls == [] and len(_programs(net)) == 2


def test_keyword_tensors_are_part_of_the_guard() -> None:
    class Kw(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.small = nn.Linear(8, 8)

        def forward(self, *, y: torch.Tensor) -> torch.Tensor:
            return self.small(y)

    net, y, wide = Kw(), torch.randn(4, 8), torch.randn(128, 8)
    with torch.enable_grad():
        _load(**{shape_class(net.small, (y,), "cpu"): "fp32", shape_class(net.small, (wide,), "cpu"): "low"})
    for _ in range(2):
        assert _step(net, y=y).dtype == torch.float32
        assert _step(net, y=wide).dtype == torch.bfloat16
    assert len(_programs(net)) == 2


def test_a_changed_plan_is_followed_at_the_next_call() -> None:
    net, x, y = Net(big=0, small=2), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    for _ in range(2):
        _step(net, x, y)
        assert net.small_dtypes() == {torch.float32}
    _plan(net, x, y, big="low", small="low")  # load_plan: a new plan object
    _step(net, x, y)
    assert net.small_dtypes() == {torch.bfloat16}
    plan = ampcore.auto_plan("cpu")
    with torch.enable_grad():
        plan.set(shape_class(net.small[0], (y,), "cpu") or "", _costs_fp32())  # a new measurement
    _step(net, x, y)
    assert net.small_dtypes() == {torch.float32}


def _costs_fp32() -> Any:
    from ampcore._auto import Costs

    return Costs(fp32_ms=1.0, low_ms=4.0, cast_ms=0.5)


def test_another_model_called_where_a_settled_region_is_entered_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    nets, x, y = [Net(big=0, small=2) for _ in range(3)], torch.randn(4, 32), torch.randn(4, 8)
    _plan(nets[0], x, y, big="low", small="fp32")

    def run_all() -> None:
        for net in nets:  # one place in the code, three models
            with ampcore.autocast("cpu", level="auto"):
                net(x, y)
            assert net.small_dtypes() == {torch.float32}

    for _ in range(3):
        run_all()
    assert all(len(_programs(net)) == 1 for net in nets)
    calls = _counting(monkeypatch)
    run_all()
    assert calls == []


def test_an_exception_in_a_root_leaves_no_hook_and_autocast_as_it_was() -> None:
    class Boom(Net):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            super().forward(x, y)
            raise KeyboardInterrupt  # skips torch's always-call hooks

    net, x, y = Boom(big=0, small=2), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    for _ in range(3):
        with pytest.raises(KeyboardInterrupt), ampcore.autocast("cpu", level="auto"):
            net(x, y)
        assert not _hooks.installed() and _program.local.run is None and _program.local.rec is None
        assert not torch.is_autocast_enabled("cpu")
        assert not torch.nn.modules.module._global_forward_pre_hooks and not net._forward_hooks


def test_the_switched_modules_carry_hooks_only_during_their_root_call() -> None:
    """The instance hooks of a program go into the modules' hook dicts for the root call and
    out again after it, also when the call raises (no handle objects to leak)."""
    seen: list[int] = []

    class Watched(Net):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            layers = [*self.big, *self.small]
            seen.append(sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in layers))
            if self._boom:  # (private: not a setting the program's guard watches)
                raise KeyboardInterrupt  # skips torch's always-call hooks
            return super().forward(x, y)

    net, x, y = Watched(big=1, small=2, relu=False), torch.randn(4, 32), torch.randn(4, 8)
    net._boom = False
    _plan(net, x, y, big="low", small="fp32")
    for _ in range(3):
        _step(net, x, y)
    net._boom = True
    with pytest.raises(KeyboardInterrupt):
        _step(net, x, y)  # the same place in the code: the root's program runs
    assert seen[-2:] == [2, 2]  # two hooks on the one switched module (the low one) while the program runs
    for module in net.modules():
        assert not (module._forward_pre_hooks or module._forward_hooks or module._forward_hooks_always_called)
    assert not torch.is_autocast_enabled("cpu") and _program.local.run is None


def test_a_region_nested_inside_a_float32_default_root_runs_its_own_lists() -> None:
    class Inner(Net):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = super().forward(x, y)
            with ampcore.autocast("cpu", level="O1"):
                z = self.small[0](y)
            self.after = torch.is_autocast_enabled("cpu")
            return x, z

    net, x, y = Inner(big=0, small=2), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    for _ in range(3):
        assert _step(net, x, y)[1].dtype == torch.bfloat16
    assert _programs(net)[0].default_fp32
    assert net.after is False  # the root's float32 default again after the nested region


def test_a_low_output_reaching_an_op_outside_planned_modules_keeps_the_low_default() -> None:
    net, x, y = Net(big=1, small=3), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    for _ in range(2):
        _step(net, x, y)
        # the ReLU after the big layer runs under autocast on its bfloat16 output, as recorded
        assert net.seen["big.0"] == torch.bfloat16 and net.small_dtypes() == {torch.float32}
    (program,) = _programs(net)
    assert not program.default_fp32 and [r() for r in program.switched] == list(net.small)


def test_a_planned_root_switched_from_the_default_runs_in_its_own_precision() -> None:
    linear, x = nn.Linear(8, 8), torch.randn(4, 8).bfloat16()  # low inputs: the default stays low
    with torch.enable_grad():
        _load(**{shape_class(linear, (x,), "cpu") or "": "fp32"})
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            assert linear(x).dtype == torch.float32
    (program,) = _programs(linear)
    assert not program.default_fp32 and [r() for r in program.switched] == [linear]
