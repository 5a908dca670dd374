"""Issue 27, fifteenth stop: the leftovers of "Ops between roots" (docs/auto.md).

* A disabled ``ampcore.autocast(enabled=False)`` nested between roots, after a root that ran
  float32 throughout: the first entry of such a region in a process (and every entry while a
  torch function mode runs) goes through ``torch.autocast``, whose wrapper (``_entered``) put
  the auto region's state back first, so the region's exit restored the O1 lists: the ops
  after it ran in low precision on the first step (the float32 step's, and the reference's,
  float32 from the second).  Now ampcore's own entry leaves the state as it is: torch saves
  and restores the float32 state, as an enabled nested region (which sets the flags
  directly) always did.

Each case runs step by step against the harness's reference (``_auto_testing.fixed``).
Timings are injected (plans loaded): no wall clock.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_between import Towers, X, _decide_all, _dtypes, _steps
from test_auto_sweep3 import BF16, Enter
from test_auto_sweep3 import recordings as recordings  # noqa: F401, PLC0414 (fixture)

import ampcore
from ampcore._policy import entry, torch_state

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _disabled_between(m: Any, enter: Enter) -> Any:
    with enter(BF16):
        y, z = m.a(X), m.b(X)
        with ampcore.autocast("cpu", enabled=False):
            inside = y @ z.t()
        after = y @ z.t()
    return y, z, inside, after


@pytest.mark.parametrize("through", [True, False], ids=["through-torch-autocast", "flags-set-directly"])
def test_a_disabled_region_between_float32_roots_leaves_the_ops_after_it_float32(
    through: bool, recordings: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    if through:  # every entry as a process's first: through torch.autocast
        monkeypatch.setattr(torch_state, "_ACCEPTED", set())
        monkeypatch.setattr(entry, "accepted", lambda *a: None)
    _steps(Towers, _disabled_between, recordings)
    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    for dtypes in _dtypes(_disabled_between, model):  # recorded, then settled
        assert set(dtypes) == {torch.float32}


def test_a_disabled_region_after_a_low_root_keeps_the_o1_lists_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a root that ran low the region's state is on: the disabled region restores it."""
    monkeypatch.setattr(torch_state, "_ACCEPTED", set())
    monkeypatch.setattr(entry, "accepted", lambda *a: None)
    torch.manual_seed(0)
    model = Towers(low=True)
    _decide_all(model)
    for dtypes in _dtypes(_disabled_after_low, model):
        assert dtypes[2:] == (torch.float32, BF16)


def _disabled_after_low(m: Any, enter: Enter) -> Any:
    with enter(BF16):
        y, z = m.a(X), m.b(X)
        with ampcore.autocast("cpu", enabled=False):
            inside = y @ y.t()
        after = y @ z.t()
    return y, z, inside, after
