"""Issue 27, thirteenth stop: an attribute changed on the same instance after its check.

A forward that picks its work from a plain attribute (a bool flag, a str mode, an
attribute of a block nested two levels down) is checked again for the new value at the
next call once the attribute changes on the same instance, and changed back, the first
value's program runs again (no recording, no check).  Attributes that are state, not
settings (a step number the loop or a pre-hook sets every call, a flag the forward raises
on some steps, a flag the forward resets), do not keep the root recording.

Timings are injected (fake clocks, :class:`test_auto_leftovers._Clock`): the tests count
recordings and measurements and check numerics, never the wall clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_leftovers import _RUNNING, _Clock, _Deep, _fixed, _step
from test_auto_leftovers import recordings as recordings  # noqa: F401, PLC0414 (fixture)
from test_auto_sweep3 import BF16
from test_auto_sweep5 import _process
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class _Twice(nn.Module):
    """A bool flag, ``False`` when checked, that makes the layer run a second time."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.head = nn.Linear(32, 32), nn.Linear(32, 8)
        self.twice = False

    def configure(self, large: bool) -> None:
        self.twice = large

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = "large" if self.twice else "small"
        h = torch.relu(self.fc(x))
        if self.twice:
            h = torch.relu(self.fc(h))
        return self.head(h)


class _Moded(nn.Module):
    """A str mode picking the path ("short": one layer, "long": four)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.head = nn.Linear(32, 32), nn.Linear(32, 8)
        self.mode = "short"

    def configure(self, large: bool) -> None:
        self.mode = "long" if large else "short"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = "large" if self.mode == "long" else "small"
        for _ in range(4 if self.mode == "long" else 1):
            x = torch.relu(self.fc(x))
        return self.head(x)


class _Repeated(nn.Module):
    """A block of the user's class whose ``repeat`` picks how often its layer runs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.repeat = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = "small" if self.repeat == 1 else "large"
        for _ in range(self.repeat):
            x = torch.relu(self.fc(x))
        return x


class _Nested(nn.Sequential):
    """torch's own containers holding the user's block two levels down."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__(nn.Sequential(nn.ModuleList([_Repeated()])[0]), nn.Linear(32, 8))

    def configure(self, large: bool) -> None:
        self[0][0].repeat = 5 if large else 1


_MODELS: dict[str, Callable[[], nn.Module]] = {
    "bool-flag-false-then-true": _Twice,
    "str-mode": _Moded,
    "nested-block-attribute": _Nested,
    "int-depth": lambda: _Deep(1),
}


@pytest.mark.parametrize("kind", list(_MODELS))
def test_a_changed_attribute_is_checked_and_changed_back_runs_its_first_program(
    kind: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """Settled on a float32 verdict (small), the attribute changed: the next call records
    and the one after is checked for the new value (low wins); changed back and forth
    twice more, each value's program runs again: no recording, no check."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _MODELS[kind]()
    for _ in range(4):
        out = _step(model)
    assert out.dtype == torch.float32
    model.configure(True)  # type: ignore[operator]
    clock.labels.clear()
    outs = [_step(model) for _ in range(4)]
    assert [o.dtype for o in outs] == [BF16] * 4, "the old float32 verdict ran on for the new value"
    assert clock.checks() == {"large"}
    torch.testing.assert_close(outs[-1], _fixed(model, "low"), rtol=0, atol=0)
    clock.labels.clear()
    recordings.clear()
    for large in (False, True, False, True, False):
        model.configure(large)  # type: ignore[operator]
        for _ in range(2):
            out = _step(model)
        torch.testing.assert_close(out, _fixed(model, "low" if large else "fp32"), rtol=0, atol=0)
    assert recordings == [], f"{len(recordings)} recordings for values whose programs are known"
    assert clock.labels == []


class _Stepped(_Deep):
    """A step number a pre-hook sets before every call, and a flag the loop sets."""

    def __init__(self) -> None:
        super().__init__(1)
        self.step = 0
        self.log_now = False
        self.register_forward_pre_hook(_count)


def _count(module: nn.Module, args: Any) -> None:
    module.step += 1  # type: ignore[operator]


@pytest.mark.parametrize("flag", ["every-call", "every-third-call"])
def test_a_step_number_a_pre_hook_sets_and_a_per_step_flag_settle(
    flag: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """A counter a root pre-hook moves before every call and a flag the loop flips (every
    call, or every third): the root settles (no recording after its first steps, no check),
    and runs the float32 verdict."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _Stepped()
    period = 1 if flag == "every-call" else 3
    for step in range(16):
        model.log_now = (step // period) % 2 == 1
        if step == 10:
            recordings.clear()
            clock.labels.clear()
        out = _step(model)
    assert recordings == [], f"{len(recordings)} recordings in 6 settled steps"
    assert clock.labels == []
    torch.testing.assert_close(out, _fixed(model, "fp32"), rtol=0, atol=0)


class _Flaky(_Deep):
    """Raises on the steps it is told to (a data check), after its first layer ran."""

    def __init__(self) -> None:
        super().__init__(1)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            self.fc(x)
            raise ValueError("bad batch")
        return super().forward(x)


def test_a_flag_the_forward_raises_on_is_recorded_once(monkeypatch: pytest.MonkeyPatch, recordings: list[Any]) -> None:
    """A flag set on some steps of a settled root, on which the forward raises: its first
    raising step records, the later ones run the settled program (no recording)."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _Flaky()
    for step in range(14):
        model.fail = step in (5, 9, 11, 12)
        if step == 8:
            recordings.clear()
        with contextlib.suppress(ValueError):
            out = _step(model)
    assert recordings == [], f"{len(recordings)} recordings in settled steps"
    torch.testing.assert_close(out, _fixed(model, "fp32"), rtol=0, atol=0)


class _Armed(_Deep):
    """A flag the user sets and the forward resets (a one-off action on the next call)."""

    def __init__(self) -> None:
        super().__init__(1)
        self.armed = False
        self.fired = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            self.armed = False
            self.fired += 1
        return super().forward(x)


def test_a_flag_the_forward_resets_does_not_keep_the_root_recording(
    monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """Armed on some steps, reset by the forward: recorded once (the flag and the count are
    state from then on), the later armed steps run the settled program."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _Armed()
    for step in range(14):
        model.armed = step in (5, 9, 12)
        if step == 8:
            recordings.clear()
        out = _step(model)
    assert model.fired == 3
    assert recordings == [], f"{len(recordings)} recordings in settled steps"
    torch.testing.assert_close(out, _fixed(model, "fp32"), rtol=0, atol=0)


def test_roots_of_torch_classes_only_watch_no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A root of torch's classes only (a ``Dropout``'s ``p``, a ``Linear``'s sizes are
    hyper-parameters): its program's guard compares no settings (the settled path costs
    nothing more)."""
    from ampcore._auto import _store
    from ampcore._auto._settings import Settings

    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.0), nn.ReLU(), nn.Linear(32, 8))
    for _ in range(3):
        _step(model)
    programs = [p for p in _store._programs[model].values() if not isinstance(p, int)]
    assert programs and all(type(entry[2]) is not Settings for p in programs for entry in p.plain)
    own = _Deep(1)
    for _ in range(3):
        _step(own)
    programs = [p for p in _store._programs[own].values() if not isinstance(p, int)]
    assert any(type(entry[2]) is Settings and entry[2].names == ("depth",) for p in programs for entry in p.plain)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_made_while_its_root_is_recorded_keeps_no_key_of_ours(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A settled (marked) root recorded again (a new input shape) whose forward copies
    itself during that recording: the copy's strays (the root's mark in its with-kwargs
    pre-hook dict) go at its first call, also outside a region (before: the mark stayed on
    the copy for good; only a running program's root held a post-hook that drops them)."""
    from test_auto_left import _call, _Copies, _decide, _ours, _where
    from test_auto_sweep3 import _auto, _clean

    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    model = _Copies(how)
    _decide(model, lambda m, i, enter: _call(m, torch.randn(8, 16), enter), 1)
    for _ in range(3):  # recorded, settled, marked
        _call(model, torch.randn(8, 16), _auto)
    model.armed = True
    _call(model, torch.randn(4, 16), _auto)  # a new signature: recorded, copied in the forward
    clone = model.copies[-1]
    with torch.no_grad():
        clone(torch.randn(4, 16))  # outside a region
    assert _ours(clone) == [], ("a key of ours left on the copy", _where(clone))
    _clean(model, clone)


class _Extra(nn.Module):
    """A Conv1D-like layer (``x @ weight``) judged per flags (``twice``), whose flag ``extra``,
    added to the instance later, adds a second product."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) * 0.1)
        self.twice = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.weight
        return out @ self.weight if self.twice or getattr(self, "extra", False) else out


def test_a_flag_added_to_a_layer_judged_per_flags_after_its_first_look_is_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planned one-product layer of a class judged per flags, its root settled on float32;
    then a bool attribute it did not have is added (``layer.extra = True``: a second
    product): the next calls judge the layer again (two products: not planned, the O1
    lists, as torch.autocast) and the root's new check says low.  Before, the flags were
    those of the first look (an added one was not seen) and the settled program ran on."""
    from ampcore._auto import _shapes
    from ampcore._auto._shapes import MATMUL, planned_ops

    _shapes.forget_kind(_Extra)
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    _RUNNING[0] = "small"  # (the whole-call check: float32 wins)
    torch.manual_seed(0)
    layer = _Extra(32)
    model = nn.Sequential(layer, nn.Linear(32, 8))
    for _ in range(5):
        out = _step(model)
    assert planned_ops(layer) == MATMUL[1]
    assert out.dtype == torch.float32
    layer.extra = True
    _RUNNING[0] = "large"  # (a whole-call check now: low wins)
    outs = [_step(model) for _ in range(4)]
    assert planned_ops(layer) is None, "the added flag was not seen"
    assert outs[-1].dtype == BF16, "the settled program ran on for the added flag"
    torch.testing.assert_close(outs[-1], _fixed(model, "low"), rtol=0, atol=0)
    _shapes.forget_kind(_Extra)
