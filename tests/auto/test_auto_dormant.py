"""Issue 27 (fifteenth stop): a site that ran float32 throughout for a long time still notices
each hazard at its first call.

A *dormant* region was weighed for such a site (docs/auto.md, "What is left per step").  It
would enter as cheaply as ``torch.autocast(enabled=False)``, with no global pre-hook, and run
the guarded path only every Nth step.  It was not built: without the global pre-hook a module
called directly that is not a known root runs unseen, and a paced check notices the other
hazards only after steps whose dtypes differ.  These tests pin that.  The site is settled,
then runs :data:`QUIET` more steps with nothing new, which is what a pacing design would wait
for.  Then each hazard comes once, and that first step must equal the plan's fixed choice
(:func:`test_auto_sweep.fixed_region`): outputs with their dtypes, gradients, no exception.
The next step must equal it again.

* a new root after the float32 root, whose plan is low (dormant: float32, the state the
  float32 root left);
* a new root before the first root, whose plan is float32 (dormant: the O1 lists);
* a layer of the root converted to bfloat16 in place (same Parameter objects);
* a batch size whose classes are low (the layers' own guards see it);
* an input of another dtype (the signature sees it);
* a ``torch.autocast`` the user enters between roots, and an op after it (the O1 lists).

Each was checked to fail where its guard is taken out: new roots unseen (the first two), the
tree check skipped, the signature's comparison skipped, ``torch.autocast`` not watched.
"""

from __future__ import annotations

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_site import _compare, _decide, _mlp, _settle, _settled, _site
from test_auto_sweep import _clean, _load
from torch import nn

from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

#: settled steps with nothing new before the hazard (what a paced design would count)
QUIET = 40


def _quiet(model: nn.Module, x: torch.Tensor, simple: bool = True) -> None:
    """Settle ``model`` at the site on ``x``, then :data:`QUIET` steps with nothing new
    (``simple``: its program is the cheap one, a float32 default guarding no layer)."""
    if simple:
        _settle(model, lambda: model(x))
    for _ in range(QUIET):
        _site(lambda: model(x)).float().sum().backward()
        model.zero_grad(set_to_none=True)
    assert _settled(model) or not simple
    assert _site(lambda: model(x)).dtype == torch.float32


def _plan_with(model: nn.Module, extra: nn.Linear, extra_in: int, decision: str) -> None:
    """``model``'s Linear layers float32 on a batch of 8; ``extra`` decides ``decision``."""
    plan: dict[str, str] = {}
    _decide(model, 8, "fp32", also=plan)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for dtype in (torch.float32, torch.bfloat16):
                plan[shape_class(extra, (torch.zeros(8, extra_in, dtype=dtype),), "cpu") or ""] = decision
    _load(plan)


def test_a_new_low_root_after_a_long_quiet_float32_run_runs_low() -> None:
    model, head = _mlp(), nn.Linear(8, 4)
    _plan_with(model, head, 8, "low")
    x = torch.randn(8, 16)
    _quiet(model, x)
    both = nn.Sequential(model, head)  # for the gradients' comparison only
    for _ in range(2):
        _compare(both, lambda: head(model(x)))
    assert _site(lambda: head(model(x))).dtype == torch.bfloat16
    _clean(head)


def test_a_new_float32_root_before_the_first_root_runs_float32() -> None:
    model, stem = _mlp(), nn.Linear(16, 16)
    _plan_with(model, stem, 16, "fp32")
    x = torch.randn(8, 16)
    _quiet(model, x)
    both = nn.Sequential(stem, model)
    for _ in range(2):
        _compare(both, lambda: model(stem(x)))
    with torch.no_grad():
        assert _site(lambda: stem(x)).dtype == torch.float32  # (the O1 lists would give bfloat16)
    _clean(stem)


def test_a_layer_converted_in_place_after_a_long_quiet_run() -> None:
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    _quiet(model, x)
    model[2].bfloat16()  # the same Parameter objects: only their dtype tells
    for _ in range(2):
        _compare(model, lambda: model(x))
    model[2].float()
    _compare(model, lambda: model(x))


def test_a_low_batch_size_after_a_long_quiet_run() -> None:
    model = _mlp()
    plan: dict[str, str] = {}
    _decide(model, 8, "fp32", also=plan)
    _decide(model, 64, "low", also=plan)
    _load(plan)
    x, large = torch.randn(8, 16), torch.randn(64, 16)
    _quiet(model, x, simple=False)  # (its layers decide by shape: guarded, not the cheap path)
    for _ in range(2):
        _compare(model, lambda: model(large))
    assert _site(lambda: model(large)).dtype == torch.bfloat16
    _compare(model, lambda: model(x))


def test_an_input_of_another_dtype_after_a_long_quiet_run() -> None:
    """A float32 default given bfloat16 inputs would raise ``mat1 and mat2 must have the same
    dtype``: the signature, taken at every call, sees it."""
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    _quiet(model, x)
    for _ in range(2):
        _compare(model, lambda: model(x.bfloat16()))
    _compare(model, lambda: model(x))


def test_a_torch_autocast_between_roots_after_a_long_quiet_run() -> None:
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    _quiet(model, x)

    def step() -> torch.Tensor:
        y = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = y @ y.t()  # the user's own region between roots: its dtype
        w = y @ y.t()  # after it: the O1 lists until the next float32 root (docs/auto.md)
        out: torch.Tensor = model(x) + z.float().sum() + w.float().sum()
        return out

    for _ in range(2):
        _compare(model, step)
