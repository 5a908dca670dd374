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


def _disabled_between(m: Any, enter: Enter, after_low: bool = False) -> Any:
    """Two roots, a disabled ampcore region, the similarity after it (``after_low``: b ran
    low, so the product inside the disabled region takes a's output only)."""
    with enter(BF16):
        y, z = m.a(X), m.b(X)
        with ampcore.autocast("cpu", enabled=False):
            inside = y @ (y if after_low else z).t()
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
    assert {t for dtypes in _auto_dtypes(_disabled_between, low=False) for t in dtypes} == {torch.float32}


def _auto_dtypes(body: Any, low: bool) -> list[tuple[torch.dtype, ...]]:
    """``body``'s output dtypes under auto at 4 steps, the harness's rule's plan loaded."""
    torch.manual_seed(0)
    model = Towers(low=low)
    _decide_all(model)
    return _dtypes(body, model)


def test_a_disabled_region_after_a_low_root_keeps_the_o1_lists_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a root that ran low the region's state is on: the disabled region restores it."""
    monkeypatch.setattr(torch_state, "_ACCEPTED", set())
    monkeypatch.setattr(entry, "accepted", lambda *a: None)
    for dtypes in _auto_dtypes(lambda m, enter: _disabled_between(m, enter, after_low=True), low=True):
        assert dtypes[2:] == (torch.float32, BF16)


# --- what a root's own pre-hooks see (docs/auto.md, "Ops between roots"; more kinds of hooks:
# test_auto_between_hooks.py) -----------------------------------------------------------------


def _hooked_run(root_is_planned: bool, reference: bool) -> list[tuple[bool, torch.dtype, torch.dtype]]:
    """Per step: what ``b``'s own pre-hook sees (autocast on, the dtype of a product it makes)
    after the float32 root ``a``, and the dtype of the similarity after ``b``."""
    from _auto_testing import fixed
    from torch import nn

    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    b = model.b[0] if root_is_planned else model.b
    seen: list[Any] = []
    b.register_forward_pre_hook(
        lambda m, args: seen.append((torch.is_autocast_enabled("cpu"), (args[0] @ model.w).dtype))
    )
    got = []
    for _ in range(4):
        with torch.no_grad(), fixed(BF16) if reference else ampcore.autocast("cpu", level="auto", dtype=BF16):
            y, z = model.a(X), b(X)
            similarity = y @ z.t()
        got.append((*seen.pop(), similarity.dtype))
    assert isinstance(b, nn.Module)
    return got


def test_a_planned_roots_own_pre_hook_sees_what_the_reference_gives() -> None:
    """A bare ``Linear`` called as a root, decided float32, with a pre-hook of its own: the
    reference decides it before its own hooks (autocast off there).  Auto's program starts
    after them (the sentinel is its last pre-hook: it takes the signature of what they
    return): the global sentinel switches autocast off for them where the plan decides the
    layer float32 for its arguments (before the sixteenth stop: its hooks saw the O1 state
    from its second call, and its first call, applied call by call, left the O1 lists after
    it)."""
    assert _hooked_run(True, reference=False) == _hooked_run(True, reference=True)


def test_low_work_in_a_roots_own_pre_hook_counts_as_the_root_running_low() -> None:
    """A root's own pre-hook that makes a low-precision product (it sees the region's O1
    state, as in the reference): the reference counts it as the root running low (O1 after
    it).  Auto's program starts after the hook: the root's own hooks are probed once, at its
    second call (``_auto/_hook_probe.py``), and a recording counts their low work (before
    the sixteenth stop: its settled calls left the ops after it float32)."""
    assert _hooked_run(False, reference=False) == _hooked_run(False, reference=True)
