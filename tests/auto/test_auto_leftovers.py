"""Issue 27, twelfth stop: the correctness gaps the last stops noticed and left alone.

* a forward that picks its work from an attribute (``for _ in range(self.depth)``, ``if
  self.use_gate:``, a float scale, an attribute of an inner block): two instances of one
  class with the same layers and inputs but other attribute values get their own
  whole-call check (before: one key, the first one's verdict ran the other), and an
  attribute changed on the same instance after its check takes effect at the next call
  (recorded and checked again); an attribute the forward itself changes (a counter), or
  one the user sets every step, does not keep the root recording;
* a per-instance flag of a class judged per flags (``_shapes.VARIES``) flipped after its
  first look is judged again at the next call (before: read once per module object);
* a float32 verdict with ``torch.utils.checkpoint`` and bfloat16 root inputs or a layer of
  bfloat16 weights, and a fixed ``low`` verdict on a layer first met on another path: each
  runs exactly one fixed choice.

Timings are injected (fake clocks): the tests count measurements and check decisions and
numerics, never the wall clock.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_left import _Flagged
from test_auto_left import _unjudged as _unjudged  # noqa: F401, PLC0414 (fixture)
from test_auto_sweep3 import BF16
from test_auto_sweep5 import _process
from torch import nn
from torch.utils.checkpoint import checkpoint

import ampcore

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

X = torch.randn(8, 32)

#: the configuration of the model whose forward ran last ("small" or "large"): the fake
#: clock's whole-call timings depend on it
_RUNNING: list[str] = [""]


class _Clock:
    """Every class: low wins 4 to 1 (all-low programs, checked against float32).  Whole
    calls: float32 wins on a "small" configuration (1 against 3), loses on a "large" one."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        if not label.startswith("root"):
            self.labels.append(label)
            return {"fp32": 4.0, "low": 1.0}.get(label, 0.01)
        self.labels.append(f"{label}:{_RUNNING[0]}")
        fp32 = label == "root-fp32"
        return (1.0 if fp32 else 3.0) if _RUNNING[0] == "small" else (3.0 if fp32 else 1.0)

    def checks(self) -> set[str]:
        """The configurations whole-call checks timed."""
        return {label.split(":")[1] for label in self.labels if label.startswith("root")}


# --- (1) a forward that picks its work from an attribute ------------------------------------


class _Deep(nn.Module):
    """One layer applied ``depth`` times (an int attribute)."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.head = nn.Linear(32, 32), nn.Linear(32, 8)
        self.depth = depth

    def configure(self, large: bool) -> None:
        self.depth = 6 if large else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = "small" if self.depth == 1 else "large"
        for _ in range(self.depth):
            x = torch.relu(self.fc(x))
        return self.head(x)


class _Gated(nn.Module):
    """A gate layer on the path a bool attribute picks."""

    def __init__(self, use_gate: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.gate, self.head = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        self.use_gate = use_gate

    def configure(self, large: bool) -> None:
        self.use_gate = large

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = "large" if self.use_gate else "small"
        h = torch.relu(self.fc(x))
        if self.use_gate:
            h = h * torch.sigmoid(self.gate(h))
        return self.head(h)


class _Scaled(nn.Module):
    """A residual branch scaled by a float attribute (0.0: the branch is skipped)."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.branch, self.head = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        self.alpha = alpha

    def configure(self, large: bool) -> None:
        self.alpha = 0.5 if large else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = "large" if self.alpha else "small"
        h = torch.relu(self.fc(x))
        if self.alpha:
            h = h + self.alpha * self.branch(h)
        return self.head(h)


class _Block(nn.Module):
    """An inner block whose own attribute picks how often its layer runs."""

    def __init__(self, repeat: int) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.repeat = repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = "small" if self.repeat == 1 else "large"
        for _ in range(self.repeat):
            x = torch.relu(self.fc(x))
        return x


class _Outer(nn.Sequential):
    """A root of torch's own class holding the block (the attribute is not the root's)."""

    def __init__(self, repeat: int) -> None:
        torch.manual_seed(0)
        super().__init__(_Block(repeat), nn.Linear(32, 8))

    def configure(self, large: bool) -> None:
        self[0].repeat = 6 if large else 1


_MODELS: dict[str, Callable[[bool], nn.Module]] = {
    "int-depth": lambda large: _Deep(6 if large else 1),
    "bool-gate": lambda large: _Gated(large),
    "float-scale": lambda large: _Scaled(0.5 if large else 0.0),
    "inner-block-attribute": lambda large: _Outer(6 if large else 1),
}


def _step(model: nn.Module, x: torch.Tensor = X) -> torch.Tensor:
    """One training step of ``model`` under auto (no optimizer): its output."""
    with ampcore.autocast("cpu", level="auto"):
        out = model(x)
    out.float().sum().backward()
    return out


def _fixed(model: nn.Module, verdict: str, x: torch.Tensor = X) -> torch.Tensor:
    """The output of ``model`` under a fixed choice: float32, or torch.autocast (``low``)."""
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16, enabled=verdict == "low"):
        return model(x)


def _verdicts() -> list[str]:
    return sorted(check.verdict for check in ampcore.auto_plan("cpu").roots.values())


@pytest.mark.parametrize("kind", list(_MODELS))
def test_two_instances_whose_attributes_pick_other_work_get_their_own_whole_call_check(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same layers, the same inputs, another attribute value: two checks (before: the
    key of a check held the layers and inputs only, so the large instance ran the small
    one's float32 verdict, in the same process and from the cache in the next)."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)  # a new process
    small = _MODELS[kind](False)
    for _ in range(4):
        out = _step(small)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _fixed(small, "fp32"), rtol=0, atol=0)
    assert clock.checks() == {"small"}
    for fresh in (False, True):  # in the same process, then in the next (its cache)
        if fresh:
            _process(monkeypatch, clock, nn.Identity(), n=0)
        clock.labels.clear()
        large = _MODELS[kind](True)
        outs = [_step(large) for _ in range(5)]
        assert [o.dtype for o in outs] == [BF16] * 5, "the large instance ran the small one's float32 verdict"
        assert ("large" in clock.checks()) != fresh  # checked once, then cached
        torch.testing.assert_close(outs[-1], _fixed(large, "low"), rtol=0, atol=0)
    assert _verdicts() == ["fp32", "low"]


@pytest.mark.parametrize("kind", list(_MODELS))
def test_an_attribute_changed_after_the_check_takes_effect_at_the_next_call(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same instance, its attribute changed once its float32 verdict settled: the next
    calls are checked for the new value, and changed back, the first value's verdict
    applies again without a new check (before the thirteenth stop, a strict xfail: the old
    float32 verdict ran on for the new value)."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _MODELS[kind](False)
    for _ in range(4):
        out = _step(model)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _fixed(model, "fp32"), rtol=0, atol=0)
    model.configure(True)  # type: ignore[operator]
    clock.labels.clear()
    outs = [_step(model) for _ in range(4)]
    assert [o.dtype for o in outs] == [BF16] * 4, "the old float32 verdict ran on for the new attribute value"
    assert clock.checks() == {"large"}
    torch.testing.assert_close(outs[-1], _fixed(model, "low"), rtol=0, atol=0)
    model.configure(False)  # type: ignore[operator]
    clock.labels.clear()
    outs = [_step(model) for _ in range(3)]
    assert outs[-1].dtype == torch.float32
    assert clock.checks() == set()  # its check is known
    torch.testing.assert_close(outs[-1], _fixed(model, "fp32"), rtol=0, atol=0)


class _Counting(_Deep):
    """A forward that counts its calls in an attribute (state, not a setting)."""

    def __init__(self, depth: int) -> None:
        super().__init__(depth)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


@pytest.mark.parametrize("who", ["forward", "user"])
def test_an_attribute_that_changes_every_call_does_not_keep_the_root_recording(
    who: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """A counter the forward increments, or a step number the training loop sets before
    every call (``model.step = i``): the root settles (records nothing after its first
    steps), and runs one fixed choice."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _Counting(1)
    for step in range(12):
        if who == "user":
            model.step = step
        if step == 8:
            recordings.clear()
            clock.labels.clear()
        out = _step(model)
    assert recordings == [], f"{len(recordings)} recordings in 4 settled steps"
    assert clock.labels == []
    torch.testing.assert_close(out, _fixed(model, "fp32"), rtol=0, atol=0)


def test_a_counter_the_forward_moves_is_not_part_of_the_check_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """An attribute the forward changes is state, not a setting: left out of the whole-call
    check's key, so the next process (its model's counter elsewhere) finds the cached check."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _Counting(1)
    for _ in range(4):
        _step(model)
    assert clock.checks() == {"small"}
    _process(monkeypatch, clock, nn.Identity(), n=0)  # the next process: the cache
    clock.labels.clear()
    other = _Counting(1)
    other.calls = 100
    for _ in range(4):
        out = _step(other)
    assert clock.checks() == set(), "the counter's value made another key: checked again"
    torch.testing.assert_close(out, _fixed(other, "fp32"), rtol=0, atol=0)


# --- (2) a per-instance flag flipped after its first look -----------------------------------


@pytest.mark.usefixtures("_unjudged")
def test_a_flag_flipped_after_the_first_look_is_judged_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-product layer (planned, decided float32, its root settled) whose flag then adds
    a second product: the next call judges it again (two products: not planned, the O1
    lists, as torch.autocast runs it).  Before, its flags were read once per module object:
    it stayed planned under the one-product shape class, and the settled program ran it in
    float32."""
    from ampcore._auto._shapes import MATMUL, planned_ops, shape_class

    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    _RUNNING[0] = "small"  # (the whole-call check: float32 wins)
    layer = _Flagged(32, twice=False)
    model = nn.Sequential(layer, nn.Linear(32, 8))
    ampcore.auto_plan("cpu")
    for _ in range(5):
        out = _step(model)
    assert planned_ops(layer) == MATMUL[1]
    assert out.dtype == torch.float32
    layer.twice = True
    _RUNNING[0] = "large"  # (a whole-call check now: low wins)
    outs = [_step(model) for _ in range(4)]
    assert planned_ops(layer) is None, "the flipped flag was not judged again"
    with torch.autocast("cpu", dtype=BF16):
        assert shape_class(layer, (X,), "cpu") is None
    assert outs[-1].dtype == BF16, "the settled program ran on for the flipped flag"
    torch.testing.assert_close(outs[-1], _fixed(model, "low"), rtol=0, atol=0)
    layer.twice = False  # back: its first judgement holds (no watch)
    assert planned_ops(layer) == MATMUL[1]
    with torch.autocast("cpu", dtype=BF16):
        assert (shape_class(layer, (X,), "cpu") or "").startswith("_Flagged(weight=32x32, twice=False)")


# --- (3) fixed verdicts and torch.utils.checkpoint; a fixed low verdict on another path ---------


class _Checkpointed(nn.Module):
    """Two Linears inside ``torch.utils.checkpoint``, a head outside (``bf16_head``: its
    weights in bfloat16)."""

    def __init__(self, reentrant: bool, bf16_head: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        if bf16_head:
            self.c.to(BF16)
        self.reentrant = reentrant

    def inner(self, t: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(torch.relu(self.a(t))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(checkpoint(self.inner, x, use_reentrant=self.reentrant))


class _LabelClock(_Clock):
    """Fixed figures per label (classes and whole calls alike), 1.0 where not given."""

    def __init__(self, ms: dict[str, float]) -> None:
        super().__init__()
        self.ms = ms

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(label if not label.startswith("root") else f"{label}:-")
        return self.ms.get(label, 1.0)


def _train_and_compare(
    model: nn.Module, reference: nn.Module, x: torch.Tensor, verdict: str, steps: int = 6, settled: int = 3
) -> None:
    """``steps`` steps under auto; from step ``settled`` on, its output and gradients equal
    (bit for bit) those of ``reference`` under the fixed choice ``verdict``."""
    for step in range(steps):
        model.zero_grad()
        with ampcore.autocast("cpu", level="auto"):
            out = model(x)
        out.float().sum().backward()
        if step < settled:
            continue
        reference.zero_grad()
        with torch.autocast("cpu", dtype=BF16, enabled=verdict == "low"):
            want = reference(x)
        want.float().sum().backward()
        torch.testing.assert_close(out, want, rtol=0, atol=0, msg=f"step {step}: not the {verdict} choice")
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=f"step {step}: gradients")


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("case", ["bf16-inputs", "bf16-weights"])
def test_a_checkpointed_root_that_cannot_run_float32_exactly_runs_one_fixed_choice(
    case: str, reentrant: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned calls inside a checkpoint follow its autocast state; with bfloat16 root
    inputs or a layer of bfloat16 weights, float32 cannot be had by switching autocast off
    for the whole root, so a float32 verdict ran the layers outside the checkpoint in
    float32 and those inside in bfloat16 (neither fixed choice).  Float32 is no choice for
    such a root: it runs torch.autocast's (its all-low program)."""
    _process(monkeypatch, _Clock(), nn.Identity(), n=0)
    _RUNNING[0] = "small"  # whole calls: float32 would win
    model = _Checkpointed(reentrant, bf16_head=case == "bf16-weights")
    reference = copy.deepcopy(model)
    x = torch.randn(8, 32, requires_grad=True)
    _train_and_compare(model, reference, x.to(BF16) if case == "bf16-inputs" else x, "low")
    assert "fp32" not in _verdicts()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_float32_verdict_on_a_checkpointed_root_whose_outside_layers_chose_float32(
    reentrant: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every planned call outside the checkpoint decided float32, those inside follow its
    autocast state (low): the program is not the float32 choice, though every planned module
    of it is switched to float32.  Before, it was checked as if it were (against the O1
    lists alone) and a float32 verdict ran it as recorded (bfloat16 inside the checkpoint);
    now it is checked as a mixed program and a float32 verdict runs the float32 step."""
    clock = _LabelClock({"fp32": 1.0, "low": 2.0, "root-low": 3.0})
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _Checkpointed(reentrant)
    reference = copy.deepcopy(model)
    _train_and_compare(model, reference, torch.randn(8, 32, requires_grad=True), "fp32")
    assert _verdicts() == ["fp32"]


class _Branch(nn.Module):
    """A layer on a path the first steps do not take (a private attribute picks it: not a
    setting the guard watches, so the program recorded for the first path runs on)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.extra = nn.Linear(32, 32), nn.Linear(32, 8), nn.Linear(32, 32)
        self._use_extra = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.b(self.extra(h) if self._use_extra else h)


def test_a_low_verdict_runs_a_float32_decided_layer_on_another_path_low(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixed program (``a`` decided float32, ``b`` low) whose whole-call check said ``low``:
    a layer of ``a``'s class first called on a path the recording did not take (a private
    attribute changed on the same instance: the program's guard meets it) runs as
    torch.autocast does, not in its class's float32."""
    from ampcore._auto._shapes import shape_class

    with torch.enable_grad():
        key = shape_class(nn.Linear(32, 32), (X,), "cpu")
    assert key is not None
    clock = _LabelClock({"fp32": 4.0, "low": 1.0, "root-low": 1.0, "root-plan": 3.0, "root-fp32": 3.0})
    _process(monkeypatch, clock, nn.Identity(), n=0, fp32=(key,))
    model = _Branch()
    reference = copy.deepcopy(model)
    _train_and_compare(model, reference, X, "low", steps=4, settled=2)
    model._use_extra = reference._use_extra = True
    _train_and_compare(model, reference, X, "low", steps=5, settled=0)
    assert ampcore.auto_plan("cpu").decision(key) == "fp32"
    assert set(_verdicts()) == {"low"}


# --- (4) a layer a region applied call by call for its life calls directly ------------------


@pytest.mark.parametrize("own", ["weights", "input"])
def test_a_layer_a_call_by_call_region_calls_directly_is_planned_after_its_own_hooks(own: str) -> None:
    """A ``level="auto"`` region nested in another ampcore region applies the plan call by
    call for its whole life; a layer it calls directly (no parent call defers it) whose own
    pre-hook puts bfloat16 weights in place (FSDP2's ``param_dtype``) or casts its input was
    planned on what it had before that hook: decided float32, it ran with autocast off on
    bfloat16 weights or inputs (``mat1 and mat2 must have the same dtype``).  Its first call
    now runs as torch.autocast, the later ones of the region are planned after its hooks."""
    from test_auto_left import _casts_input, _half_weights, _plan_for
    from test_auto_sweep3 import _auto, _clean, _equal, _wide, fixed

    torch.manual_seed(0)
    model = _wide()
    layer = model[2]
    (_half_weights if own == "weights" else _casts_input)(layer)
    _plan_for(model)
    torch.manual_seed(0)
    reference = _wide()[2]
    if own == "weights":
        reference.to(BF16)
    x = torch.randn(8, 16)
    with torch.no_grad():
        with ampcore.autocast("cpu", dtype=BF16), _auto(BF16):
            got = [layer(x) for _ in range(3)]
        with torch.autocast("cpu", dtype=BF16):
            first = reference(x if own == "weights" else x.to(BF16))
        with fixed(BF16):
            want = reference(x if own == "weights" else x.to(BF16))
    _equal(got[0], first, "the first call: as torch.autocast")
    for i, out in enumerate(got[1:], 1):
        _equal(out, want, f"call {i}: planned after its own hooks")
    _clean(model)


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
