"""Issue 27, fourteenth stop: settings a forward reads beyond plain attributes.

A forward that picks its work from a field of a config object (``self.cfg.depth`` of a
dataclass, ``self.config.use_cache`` of a ``SimpleNamespace`` or of a
``transformers``-like ``PretrainedConfig``), a key of a dict (``self.opts["mode"]``), an
enum member or a list of ints (``self.dilations``), changed on the same instance between
steps, is checked again for the new value at the next call (before: not watched, the old
value's program ran on); changed back, the first value's program runs again.  Also: a
setting changed between a root's first and second call and kept is a setting, not a step
number; a flag flipped every step records nothing after its two values are known.

Timings are injected (fake clocks, :class:`test_auto_leftovers._Clock`): the tests count
recordings and measurements and check numerics, never the wall clock.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_leftovers import _RUNNING, _Clock, _Deep, _fixed, _step
from test_auto_leftovers import recordings as recordings  # noqa: F401, PLC0414 (fixture)
from test_auto_sameinst import _Twice
from test_auto_sweep3 import BF16
from test_auto_sweep5 import _process
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class _Depthed(nn.Module):
    """One layer applied ``self.depth()`` times: subclasses read the depth from elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.head = nn.Linear(32, 32), nn.Linear(32, 8)

    def depth(self) -> int:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        depth = self.depth()
        _RUNNING[0] = "small" if depth == 1 else "large"
        for _ in range(depth):
            x = torch.relu(self.fc(x))
        return self.head(x)


@dataclasses.dataclass
class _Cfg:
    depth: int = 1
    name: str = "cfg"


class _DataclassField(_Depthed):
    def __init__(self) -> None:
        super().__init__()
        self.cfg = _Cfg()

    def configure(self, large: bool) -> None:
        self.cfg.depth = 6 if large else 1

    def depth(self) -> int:
        return self.cfg.depth


class _NamespaceFlag(_Depthed):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(use_cache=False, hidden=32)

    def configure(self, large: bool) -> None:
        self.config.use_cache = large

    def depth(self) -> int:
        return 6 if self.config.use_cache else 1


class _PretrainedConfig:
    """A ``transformers``-like config: attributes set from keyword arguments, ``to_dict``."""

    def __init__(self, **kwargs: Any) -> None:
        self.output_attentions = False
        self.torch_dtype = None
        for key, value in kwargs.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PretrainedConfig) and self.__dict__ == other.__dict__


class _ConfigBlock(_Depthed):
    def __init__(self, config: _PretrainedConfig) -> None:
        super().__init__()
        self.config = config

    def depth(self) -> int:
        return self.config.num_layers  # type: ignore[no-any-return, attr-defined]


class _SharedConfig(nn.Sequential):
    """torch's containers holding a block whose config object the root shares."""

    def __init__(self) -> None:
        config = _PretrainedConfig(num_layers=1, use_cache=True, hidden_act="gelu")
        super().__init__(nn.Sequential(_ConfigBlock(config)))
        self.config = config

    def configure(self, large: bool) -> None:
        self.config.num_layers = 6 if large else 1  # type: ignore[attr-defined]


class _DictKey(_Depthed):
    def __init__(self) -> None:
        super().__init__()
        self.opts = {"mode": "short", "eps": 1e-5}

    def configure(self, large: bool) -> None:
        self.opts["mode"] = "long" if large else "short"

    def depth(self) -> int:
        return 6 if self.opts["mode"] == "long" else 1


class _Mode(enum.Enum):
    SHORT = "short"
    LONG = "long"


class _EnumMember(_Depthed):
    def __init__(self) -> None:
        super().__init__()
        self.mode = _Mode.SHORT

    def configure(self, large: bool) -> None:
        self.mode = _Mode.LONG if large else _Mode.SHORT

    def depth(self) -> int:
        return 6 if self.mode is _Mode.LONG else 1


class _ListInPlace(_Depthed):
    def __init__(self) -> None:
        super().__init__()
        self.dilations = [1]

    def configure(self, large: bool) -> None:
        self.dilations[0] = 6 if large else 1  # changed in place

    def depth(self) -> int:
        return self.dilations[0]


class _ListAppended(_Depthed):
    def __init__(self) -> None:
        super().__init__()
        self.dilations = [1]

    def configure(self, large: bool) -> None:
        del self.dilations[1:]
        if large:
            self.dilations.extend([1] * 5)

    def depth(self) -> int:
        return len(self.dilations)


class _ConfigReplaced(_Depthed):
    def __init__(self) -> None:
        super().__init__()
        self.cfg = _Cfg()

    def configure(self, large: bool) -> None:
        self.cfg = _Cfg(depth=6 if large else 1)  # a new object, equal fields but depth

    def depth(self) -> int:
        return self.cfg.depth


_MODELS: dict[str, Callable[[], nn.Module]] = {
    "dataclass-field": _DataclassField,
    "namespace-flag": _NamespaceFlag,
    "pretrained-config-shared-nested": _SharedConfig,
    "dict-key": _DictKey,
    "enum-member": _EnumMember,
    "list-changed-in-place": _ListInPlace,
    "list-appended": _ListAppended,
    "config-replaced": _ConfigReplaced,
}


@pytest.mark.parametrize("kind", list(_MODELS))
def test_a_changed_config_field_is_checked_and_changed_back_runs_its_first_program(
    kind: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    changed_and_back(_MODELS[kind], monkeypatch, recordings)


def changed_and_back(make: Callable[[], nn.Module], monkeypatch: pytest.MonkeyPatch, recordings: list[Any]) -> None:
    """Settled on a float32 verdict (small), the config field changed: the calls after it
    run low (its check for the new value: low wins), numerics of torch.autocast; changed
    back and forth, each value's program runs again: no recording, no check."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = make()
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


_CHANGED_EARLY: dict[str, Callable[[], nn.Module]] = {
    "int-depth": lambda: _Deep(1),
    "bool-flag": _Twice,
    "dataclass-field": _DataclassField,
    "dict-key": _DictKey,
}


@pytest.mark.parametrize("kind", list(_CHANGED_EARLY))
def test_a_setting_changed_after_the_first_call_and_kept_is_checked_for_its_value(
    kind: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """One call (recorded, the plan knowing its layers) with the small value, then the
    setting changed for good before the second call: the later calls run the new value's verdict (low, numerics of
    torch.autocast), and changed back and forth each value's program runs unrecorded.
    Before the fifteenth stop, the change was taken for a step number (held): the program
    recorded for the small value ran on for the large one (now re-baselined, decided at the
    next look: ``_auto/_early.py``)."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    _RUNNING[0] = "small"
    warm = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))  # the plan knows the layers
    for _ in range(4):
        _step(warm)
    model = _CHANGED_EARLY[kind]()
    _step(model)  # recorded (no measurement)
    model.configure(True)  # type: ignore[operator]
    outs = [_step(model) for _ in range(6)]
    assert outs[-1].dtype == BF16, "the small value's program ran on for the large one"
    torch.testing.assert_close(outs[-1], _fixed(model, "low"), rtol=0, atol=0)
    for large in (False, True, False):
        model.configure(large)  # type: ignore[operator]
        for _ in range(4):
            out = _step(model)
        torch.testing.assert_close(out, _fixed(model, "low" if large else "fp32"), rtol=0, atol=0)
    recordings.clear()
    clock.labels.clear()
    for large in (True, False, True):
        model.configure(large)  # type: ignore[operator]
        out = _step(model)
        torch.testing.assert_close(out, _fixed(model, "low" if large else "fp32"), rtol=0, atol=0)
    assert recordings == [], f"{len(recordings)} recordings for values whose programs are known"
    assert clock.labels == []


@pytest.mark.parametrize("kind", ["int-depth", "namespace-flag"])
def test_a_second_instance_running_the_first_ones_program_sees_its_own_setting_change(
    kind: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """A second instance of a settled root's class, same settings (it runs the first one's
    program, as a copy does), then its setting changed: it is checked for the new value
    (low), changed back it runs float32; the first instance keeps its float32 verdict.
    Before, the program it took watched no setting: the float32 verdict ran on for good."""
    make = {"int-depth": lambda: _Deep(1), "namespace-flag": _NamespaceFlag}[kind]
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    first = make()
    for _ in range(4):
        _step(first)
    second = make()
    assert _step(second).dtype == torch.float32
    second.configure(True)  # type: ignore[operator]
    outs = [_step(second) for _ in range(4)]
    assert outs[-1].dtype == BF16, "the first instance's float32 verdict ran on for the new value"
    torch.testing.assert_close(outs[-1], _fixed(second, "low"), rtol=0, atol=0)
    second.configure(False)  # type: ignore[operator]
    torch.testing.assert_close(_step(second), _fixed(second, "fp32"), rtol=0, atol=0)
    torch.testing.assert_close(_step(first), _fixed(first, "fp32"), rtol=0, atol=0)


class _Dropped(nn.Module):
    """Dropout on (``p``) or off by a flag the loop flips (``use_dropout``); ``use_cache``-like
    flag picking a second layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.extra, self.head = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        self.use_cache = False

    def configure(self, large: bool) -> None:
        self.use_cache = large

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = "large" if self.use_cache else "small"
        x = torch.relu(self.fc(x))
        if self.use_cache:
            for _ in range(5):
                x = torch.relu(self.extra(x))
        return self.head(x)


@pytest.mark.parametrize("kind", ["use-cache-flag", "int-depth", "dataclass-field"])
def test_a_setting_flipped_every_step_from_the_start_records_nothing_once_both_values_ran(
    kind: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """A flag flipped at every step from the first one (``model.use_cache = i % 2 == 0``):
    after its first steps nothing is recorded or measured, and each value runs its own
    verdict (small: float32, large: low), numerics of that fixed choice (before the
    fifteenth stop: held at its first change, one verdict for both values)."""
    make = {"use-cache-flag": _Dropped, "int-depth": lambda: _Deep(1), "dataclass-field": _DataclassField}[kind]
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = make()
    for i in range(24):
        if i == 16:
            recordings.clear()
            clock.labels.clear()
        large = i % 2 == 0
        model.configure(large)  # type: ignore[operator]
        out = _step(model)
        if i >= 16:
            torch.testing.assert_close(out, _fixed(model, "low" if large else "fp32"), rtol=0, atol=0)
    assert recordings == [], f"{len(recordings)} recordings in 8 steps flipping between two known values"
    assert clock.labels == []


class _Counting(_Depthed):
    """A config object whose field the forward moves every call (state, not a setting)."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(depth=1, calls=0)

    def depth(self) -> int:
        self.cfg.calls += 1
        return self.cfg.depth  # type: ignore[no-any-return]


def test_a_config_field_the_forward_moves_is_state_and_the_root_settles(
    monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """A counter kept in a config object, moved by the forward: held (not watched), the
    root settles: no recording after its first steps."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _Counting()
    for step in range(10):
        if step == 6:
            recordings.clear()
        out = _step(model)
    assert recordings == [], f"{len(recordings)} recordings in settled steps"
    torch.testing.assert_close(out, _fixed(model, "fp32"), rtol=0, atol=0)


def test_a_config_object_many_blocks_hold_is_watched_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve blocks holding one config object (a ``transformers`` layout): its fields are
    watched once in the program's guard, not once a block."""
    from ampcore._auto import _store
    from ampcore._auto._setting_values import Settings

    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    config = _PretrainedConfig(num_layers=1, use_cache=True, hidden_act="gelu")
    model = nn.Sequential(*[_ConfigBlock(config) for _ in range(12)], nn.Linear(32, 8))
    for block in model[:12]:
        block.head = nn.Linear(32, 32)
    for _ in range(3):
        _step(model)
    programs = [p for p in _store._programs[model].values() if not isinstance(p, int)]
    watched = [entry[2] for p in programs for entry in p.plain if type(entry[2]) is Settings]
    assert watched
    labels = [label for label in watched[-1].labels if label.startswith("config.")]
    assert sorted(labels) == sorted(f"config.{k}" for k in config.__dict__ if not k.startswith("_"))
