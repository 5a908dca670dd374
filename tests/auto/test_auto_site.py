"""Issue 27 (tenth stop): a settled ``level="auto"`` site, what it does per step and what it
still notices.

A *site* is a place in the user's code where ``ampcore.autocast(level="auto")`` regions are
entered (a training or inference loop); once its roots run float32-default programs that
switch no module, each region made there only sets torch's autocast state, puts the
sentinel in and out, and switches autocast off for the root's forward.  That path must stay
a guard: whatever makes auto behave differently must still be noticed before any op of the
call runs.  Each hazard below happens *after* the site settled (checked), and the step must
then equal the plan's fixed choice (:func:`test_auto_sweep.fixed_region`, computed without
auto): outputs with their dtypes, gradients, no exception, nothing left behind.

* a new signature (another batch size whose classes the plan runs in low precision; an
  input of another dtype);
* a new root called at the site;
* a layer converted to bfloat16 in place;
* a plan change (``ampcore.load_plan``);
* a ``torch.autocast`` the forward enters by state of its own;
* ops outside the roots (they keep torch.autocast's O1 dtypes, also when a step starts
  running one only after the site settled).

What a settled region does is counted in Python calls and hook invocations, never timed.
"""

from __future__ import annotations

import gc
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep import LOW, _clean, _flat, _load, fixed_region
from torch import nn

import ampcore
from ampcore._auto import _hooks, _roots
from ampcore._auto._roots_state import _local
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

#: Python calls a settled region of one root adds to a step over ``torch.autocast`` made per
#: step: the construction (``__new__``, ``__init__``, the plugins' generation, the memo's key,
#: the budget check), ``__enter__`` and ``__exit__`` (each with torch's state and auto's
#: part), the sentinel with the signature and the tree check, the post-hook, torch's hook
#: path for the root (``inner``, ``is_compiling``) and the step's own function: 23 before
#: the tenth stop (the budget check through ``_roots.check``, ``is_compiling`` in
#: ``__new__``, the positional form's key in a second function, the plugins' ``loaded``
#: property)
SETTLED_CALLS = 20


def _mlp(width: int = 16) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 8))


def _decide(model: nn.Module, batch: int, decision: str, width: int = 16, also: dict[str, str] | None = None) -> None:
    """The plan: ``decision`` for every ``nn.Linear`` of ``model`` on a batch of ``batch``
    (both input dtypes, both grad modes), on top of ``also``."""
    decisions = dict(also or {})
    for grad in (True, False):
        h = torch.zeros(batch, width)
        with torch.set_grad_enabled(grad):
            for layer in (m for m in model.modules() if isinstance(m, nn.Linear)):
                for dtype in (torch.float32, LOW):
                    decisions[shape_class(layer, (h.to(dtype),), "cpu") or ""] = decision
                h = torch.zeros(batch, layer.out_features)
    _load(decisions)
    if also is not None:
        also.update(decisions)


def _site(run: Callable[[], Any]) -> Any:
    """The one place in the code every auto region of these tests is entered at."""
    with ampcore.autocast("cpu", level="auto"):
        return run()


def _settled(root: nn.Module) -> bool:
    """Whether ``root`` runs, at the site, a float32-default program that switches no module
    (the cheap path)."""
    last = _local.last.get(id(root))
    if last is None or last.run is None:
        return False
    site_roots = {id(r()) for r in _local.site.roots} if _local.site is not None else set()
    return last.program.default_fp32 and last.run.simple and id(root) in site_roots


def _compare(model: nn.Module, run: Callable[[], Any]) -> None:
    """``run()`` at the auto site equals the fixed choice: outputs, dtypes, gradients; no
    exception where the fixed choice has none; nothing of auto left behind."""
    model.zero_grad(set_to_none=True)
    with fixed_region():
        want = list(_flat(run()))
    if any(t.requires_grad for t in want):
        sum(t.float().sum() for t in want if t.requires_grad).backward()
    want_grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    got = list(_flat(_site(run)))
    _clean(model)
    if any(t.requires_grad for t in got):
        sum(t.float().sum() for t in got if t.requires_grad).backward()
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    for p, w in zip(model.parameters(), want_grads, strict=True):
        assert (p.grad is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(p.grad, w, rtol=0, atol=0)


def _settle(model: nn.Module, run: Callable[[], Any], root: nn.Module | None = None) -> None:
    for _ in range(3):
        _compare(model, run)
    assert _settled(root if root is not None else model)


# --- the hazards, each after the site settled ---------------------------------------------


@pytest.mark.parametrize("grad", [True, False])
def test_a_new_batch_size_the_plan_lacks_runs_with_the_o1_lists(grad: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its classes undecided and nothing measured (a budget of 0): torch.autocast's lists,
    low precision, where a float32 default would run float32."""
    monkeypatch.setenv(_hooks.BUDGET_ENV, "0")
    model = _mlp()
    _decide(model, 8, "fp32")
    small, large = torch.randn(8, 16), torch.randn(32, 16)
    with torch.set_grad_enabled(grad):
        _settle(model, lambda: model(small))
        _compare(model, lambda: model(large))
        _compare(model, lambda: model(small))  # and back
        assert _site(lambda: model(large)).dtype == LOW
        with _roots_calls() as calls:
            _site(lambda: model(large))
    assert calls["_record"] == 0  # the large batch settled as well (its own program)


def test_an_input_of_another_dtype_is_noticed_before_any_op() -> None:
    """A float32 default given bfloat16 inputs would raise ``mat1 and mat2 must have the
    same dtype``; the guard sees the dtype in the signature."""
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    _settle(model, lambda: model(x))
    _compare(model, lambda: model(x.to(LOW)))
    _compare(model, lambda: model(x))


def test_an_input_on_another_device_is_part_of_the_signature() -> None:
    """Another device of the region's type would be another program: the guard keeps the
    device (here ``meta``, which no program covers: the call goes the full path)."""
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    _settle(model, lambda: model(x))
    sig = _local.last[id(model)].sig
    with torch.set_grad_enabled(True):
        assert _roots.signature((x.to("meta"),), {}, model) != sig
        assert _roots.signature((x,), {}, model) == sig


def test_a_new_root_at_a_settled_site_gets_the_plan() -> None:
    model, head = _mlp(), nn.Linear(8, 4)
    plan: dict[str, str] = {}
    _decide(model, 8, "fp32", also=plan)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            plan[shape_class(head, (torch.zeros(8, 8),), "cpu") or ""] = "low"
    _load(plan)
    x = torch.randn(8, 16)
    _settle(model, lambda: model(x))
    both = nn.Sequential(model, head)  # for the gradients' comparison only
    _compare(both, lambda: head(model(x)))
    _compare(both, lambda: head(model(x)))
    _clean(head)


def test_a_layer_converted_in_place_runs_with_the_o1_lists() -> None:
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    _settle(model, lambda: model(x))
    model[2].bfloat16()  # keeps the Parameter objects: only their dtype tells
    _compare(model, lambda: model(x))
    model[2].float()
    _compare(model, lambda: model(x))
    assert _settled(model)


def test_a_plan_change_after_the_site_settled_applies_at_the_next_call() -> None:
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    _settle(model, lambda: model(x))
    _decide(model, 8, "low")
    _compare(model, lambda: model(x))
    with torch.no_grad():
        assert _site(lambda: model(x)).dtype == LOW


class _Switching(nn.Module):
    """Its last layer inside ``torch.autocast(enabled=False)`` while ``off`` is set (state the
    signature cannot see)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.last = _mlp(), nn.Linear(8, 8)
        self.off = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.body(x)
        with torch.autocast("cpu", enabled=not self.off):
            out: torch.Tensor = self.last(h.float())
        return out


def test_a_torch_autocast_the_forward_enters_later_keeps_its_state() -> None:
    model = _Switching()
    plan: dict[str, str] = {}
    _decide(model.body, 8, "fp32", also=plan)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            plan[shape_class(model.last, (torch.zeros(8, 8),), "cpu") or ""] = "low"
    _load(plan)
    x = torch.randn(8, 16)
    for _ in range(3):
        _compare(model, lambda: model(x))
    model.off = True
    _compare(model, lambda: model(x))
    model.off = False
    _compare(model, lambda: model(x))


def test_ops_outside_the_roots_follow_the_roots_also_when_they_start_late() -> None:
    """Ops in the region after a root that runs float32 throughout run float32, as in the
    float32 step (docs/auto.md, "Ops between roots"; until the fourteenth stop of issue 27
    they kept the O1 lists: ``model(x) @ w`` in bfloat16); before the root call, the O1
    lists.  A product that starts late (after the site settled) follows the same rule, on
    its first call as on later ones."""
    model = _mlp()
    _decide(model, 8, "fp32")
    x, w = torch.randn(8, 16), torch.randn(8, 8, requires_grad=True)
    _settle(model, lambda: model(x))
    _compare(model, lambda: model(x) @ w)  # as the reference (_auto_testing.fixed)
    with torch.no_grad():
        assert _site(lambda: model(x) @ w).dtype == torch.float32
        assert _site(lambda: (x @ x.t(), model(x))[0]).dtype == LOW  # before the root: torch.autocast's
        assert _site(lambda: model(x)).dtype == torch.float32


def test_an_exception_in_a_settled_root_leaves_nothing_behind() -> None:
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    _settle(model, lambda: model(x))

    def fail(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        raise ValueError("in the forward")

    handle = model[4].register_forward_hook(fail)
    with pytest.raises(ValueError, match="in the forward"):
        _site(lambda: model(x))
    handle.remove()
    _clean(model)
    _compare(model, lambda: model(x))


# --- what a settled region does, counted ---------------------------------------------------


class _roots_calls:
    """Counts the calls of :mod:`._roots`' and :mod:`._hooks`' hook functions (by code object,
    with ``sys.setprofile``) while active: ``calls[name]``."""

    def __enter__(self) -> Counter[str]:
        codes = {
            f.__code__: name
            for name, f in (
                ("_sentinel", _roots._sentinel),
                ("_root_post", _roots._root_post),
                ("_record", _roots._record),
                ("_find", _roots._find),
                ("_pre", _hooks._pre),
                ("_post", _hooks._post),
            )
        }
        self.calls: Counter[str] = Counter()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code in codes:
                self.calls[codes[frame.f_code]] += 1

        sys.setprofile(profile)
        return self.calls

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(None)


def _python_calls(run: Callable[[], Any]) -> Counter[str]:
    """The Python functions ``run()`` calls (by file and name), with ``sys.setprofile``."""
    calls: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1

    gc.collect()  # earlier tests' garbage: its weakref callbacks are not the region's calls
    gc.disable()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls


@pytest.mark.parametrize("grad", [True, False])
def test_a_settled_region_runs_its_sentinel_once_and_no_global_hook(grad: bool) -> None:
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    with torch.set_grad_enabled(grad):
        _settle(model, lambda: model(x))
        with _roots_calls() as calls:
            for _ in range(5):
                _site(lambda: model(x))
    assert calls == Counter({"_sentinel": 5, "_root_post": 5}), calls
    _clean(model)


def test_a_settled_region_adds_few_python_calls_to_torch_autocast() -> None:
    model = _mlp()
    _decide(model, 8, "fp32")
    x = torch.randn(8, 16)
    with torch.no_grad():
        _settle(model, lambda: model(x))

        def auto() -> None:
            with ampcore.autocast("cpu", level="auto"):
                model(x)

        def plain() -> None:
            with torch.autocast("cpu", enabled=False):
                model(x)

        auto(), auto(), plain()
        got, base = _python_calls(auto), _python_calls(plain)
    extra = got - base
    assert sum(extra.values()) <= SETTLED_CALLS, sorted(extra.items())
    assert _settled(model)
