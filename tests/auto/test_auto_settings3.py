"""Issue 27, fifteenth stop: settings changed before a program's first look.

A setting changed between a root's first and second call is *re-baselined* (its value at
the change becomes the program's) and the next look decides (``_auto/_early.py``): still
at that value, a setting (recorded for it); back at the recorded value, a flag (each value
its own program); a third value, a step number (held).  These tests count the recordings a
step counter costs (it must settle as before), give a flag flipped within a step (a
``no_sync``-like context, ``use_cache`` toggled between two calls of one step) one verdict
per value, and try the settings the fourteenth stop left unwatched.

Timings are injected (fake clocks, :class:`test_auto_leftovers._Clock`): the tests count
recordings and measurements and check numerics, never the wall clock.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_leftovers import _Clock, _Counting, _Deep, _fixed, _step
from test_auto_leftovers import recordings as recordings  # noqa: F401, PLC0414 (fixture)
from test_auto_sameinst import _Stepped
from test_auto_settings2 import _ConfigBlock, _Depthed, _Dropped, _PretrainedConfig, changed_and_back
from test_auto_sweep5 import _process
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


# --- (1) step counters still settle, at the recordings they cost before ------------------


def _loop_step(model: nn.Module, step: int) -> None:
    model.step = step


def _loop_steps_and_flag(model: nn.Module, step: int) -> None:
    model.log_now = step % 2 == 1


_COUNTERS: dict[str, Any] = {
    # (the model, what the loop does before each step, the recordings the first 12 steps
    # cost: as on the base, where a change before the first look was held at once)
    "loop-sets-step-number": (lambda: _Counting(1), _loop_step, 2),
    "pre-hook-counter-and-flag": (_Stepped, _loop_steps_and_flag, 1),
    "forward-counter": (lambda: _Counting(1), lambda m, s: None, 2),
}


@pytest.mark.parametrize("kind", list(_COUNTERS))
def test_a_step_counter_costs_the_recordings_it_cost_before_and_settles(
    kind: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """A step number the loop or a pre-hook sets before every call (or a counter the
    forward moves): re-baselined at its first change, held at the next look (a third
    value); no more recordings than when it was held at once, none after the first steps,
    the float32 verdict's numerics."""
    make, before, expected = _COUNTERS[kind]
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = make()
    for step in range(24):
        before(model, step)
        if step == 12:
            assert len(recordings) == expected, f"{len(recordings)} recordings in the first 12 steps"
            recordings.clear()
            clock.labels.clear()
        out = _step(model)
    assert recordings == [], f"{len(recordings)} recordings in 12 settled steps"
    assert clock.labels == []
    torch.testing.assert_close(out, _fixed(model, "fp32"), rtol=0, atol=0)


# --- (2) a flag flipped within a step: one verdict per value -------------------------------


class _NoSync(_Deep):
    """A ``no_sync``-like context that also picks the work (``depth``): the micro-steps of
    an accumulation run the small configuration, the step's last call the large one."""

    def __init__(self) -> None:
        super().__init__(1)
        self.sync = False

    def configure(self, large: bool) -> None:
        self.sync = large
        self.depth = 6 if large else 1


#: per step, the flag's values in its calls: a ``no_sync``-like accumulation (off in the
#: micro-steps, on in the step's last call), ``use_cache`` toggled between two calls
_WITHIN: dict[str, list[bool]] = {
    "two-calls-off-on": [False, True],
    "two-calls-on-off": [True, False],
    "accumulate-4": [False, False, False, True],
    "on-then-3-off": [True, False, False, False],
}


@pytest.mark.parametrize("pattern", list(_WITHIN))
@pytest.mark.parametrize("make", [_NoSync, _Dropped], ids=["no-sync-depth", "use-cache-layer"])
def test_a_flag_flipped_within_a_step_runs_one_verdict_per_value(
    make: Any, pattern: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """A flag flipped within every step from the first one (``pattern``): after the first
    steps nothing is recorded or checked, and each value runs its own verdict (off:
    float32, on: low), numerics of that fixed choice (before, with two calls a step: held
    at its first change, one verdict for both values)."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = make()
    for step in range(10):
        if step == 6:
            recordings.clear()
            clock.labels.clear()
        for large in _WITHIN[pattern]:
            model.configure(large)
            out = _step(model)
            if step >= 6:
                torch.testing.assert_close(out, _fixed(model, "low" if large else "fp32"), rtol=0, atol=0)
    assert recordings == [], f"{len(recordings)} recordings in 4 settled steps"
    assert clock.labels == []


# --- (3) the settings the fourteenth stop left unwatched -------------------------------------


class _NestedField(_Depthed):
    """``self.cfg.attn.heads``: a field two levels down (changed in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(attn=SimpleNamespace(heads=1, dropout=0.0), name="n")

    def configure(self, large: bool) -> None:
        self.cfg.attn.heads = 6 if large else 1

    def depth(self) -> int:
        return self.cfg.attn.heads  # type: ignore[no-any-return]


class _NestedDict(_Depthed):
    """``self.opts["attn"]["heads"]``: a dict of options in a dict of options."""

    def __init__(self) -> None:
        super().__init__()
        self.opts = {"attn": {"heads": 1}, "eps": 1e-5}

    def configure(self, large: bool) -> None:
        self.opts["attn"]["heads"] = 6 if large else 1  # type: ignore[index]

    def depth(self) -> int:
        return self.opts["attn"]["heads"]  # type: ignore[index, no-any-return]


class _InnerReplaced(_NestedField):
    def configure(self, large: bool) -> None:
        self.cfg.attn = SimpleNamespace(heads=6 if large else 1, dropout=0.0)


class _OuterReplaced(_NestedField):
    def configure(self, large: bool) -> None:
        self.cfg = SimpleNamespace(attn=SimpleNamespace(heads=6 if large else 1, dropout=0.0), name="n")


class _SharedOneReplaced(nn.Module):
    """Three blocks sharing one config object; the last one given another object (a
    deeper one), then the shared one back."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = _PretrainedConfig(num_layers=1, use_cache=True)
        self.blocks = nn.ModuleList([_ConfigBlock(self.shared) for _ in range(3)])
        for block in self.blocks[:2]:
            block.head = nn.Linear(32, 32)

    def configure(self, large: bool) -> None:
        self.blocks[2].config = _PretrainedConfig(num_layers=6, use_cache=True) if large else self.shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class _Property(_Depthed):
    """A config whose field is a property over a private attribute (``cfg.heads``)."""

    class Cfg:
        def __init__(self) -> None:
            self._heads = 1

        @property
        def heads(self) -> int:
            return self._heads

    def __init__(self) -> None:
        super().__init__()
        self.cfg = self.Cfg()

    def configure(self, large: bool) -> None:
        self.cfg._heads = 6 if large else 1

    def depth(self) -> int:
        return self.cfg.heads


class _GetattrBacked(_Depthed):
    """A config answering ``__getattr__`` from a private dict (``cfg.heads``)."""

    class Cfg:
        def __init__(self, **values: Any) -> None:
            self._values = values

        def __getattr__(self, name: str) -> Any:
            try:
                return self.__dict__["_values"][name]
            except KeyError:
                raise AttributeError(name) from None

    def __init__(self) -> None:
        super().__init__()
        self.cfg = self.Cfg(heads=1, dropout=0.0)

    def configure(self, large: bool) -> None:
        self.cfg._values["heads"] = 6 if large else 1

    def depth(self) -> int:
        return self.cfg.heads  # type: ignore[no-any-return]


class _Slotted(_Depthed):
    """A config class with ``__slots__`` (no ``__dict__``)."""

    class Cfg:
        __slots__ = ("dropout", "heads")

        def __init__(self) -> None:
            self.heads, self.dropout = 1, 0.0

    def __init__(self) -> None:
        super().__init__()
        self.cfg = self.Cfg()

    def configure(self, large: bool) -> None:
        self.cfg.heads = 6 if large else 1

    def depth(self) -> int:
        return self.cfg.heads


class _Wide(_Depthed):
    """A config of 80 fields; the forward reads the 70th."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(**{f"f{i:02d}": 0 for i in range(80)})
        self.cfg.f70 = 1

    def configure(self, large: bool) -> None:
        self.cfg.f70 = 6 if large else 1

    def depth(self) -> int:
        return self.cfg.f70  # type: ignore[no-any-return]


_LEFT: dict[str, Any] = {
    "nested-field": _NestedField,
    "nested-dict": _NestedDict,
    "nested-inner-replaced": _InnerReplaced,
    "nested-outer-replaced": _OuterReplaced,
    "shared-config-one-holder-given-another": _SharedOneReplaced,
    "property-over-private-field": _Property,
    "getattr-over-private-dict": _GetattrBacked,
}
#: not watched before the sixteenth stop (test_auto_settings4 tries more): a ``__slots__``
#: config (no ``__dict__``), a config's fields past the 64th
_LEFT_UNWATCHED: dict[str, Any] = {"slots-config": _Slotted, "field-past-the-64th": _Wide}


@pytest.mark.parametrize("kind", [*_LEFT, *_LEFT_UNWATCHED])
def test_a_setting_the_fourteenth_stop_did_not_watch_is_checked_and_changed_back(
    kind: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """As test_auto_settings2's config cases: settled float32 (small), the setting changed:
    checked for it (low), changed back and forth: each value's program, no recording."""
    changed_and_back({**_LEFT, **_LEFT_UNWATCHED}[kind], monkeypatch, recordings)
