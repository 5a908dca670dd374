"""Issue 27 (twelfth stop): a settled region at a site of many roots marks only the roots it calls.

A region entered at a place in the code with many roots (an ensemble, a region each) used
to mark every root of the site at its entry (our key in the root's with-kwargs pre-hook
dict, so the sentinel gets the root's kwargs) and unmark them all at its exit, though it
calls one: about 45% of a settled region's Python at 20 roots.  From
:data:`._roots_state._MARK_CALLED` roots on, a second global pre-hook of ours (the
*marker*, :func:`._root_hooks.mark_called`, just before the sentinel) marks a root of the
site as it is called, and the exit unmarks only those.  Each case below must equal the
fixed choice and leave no hook or mark behind; the counting tests pin what a settled
region touches (counted, never timed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_site import _mlp, _roots_calls, _settled
from test_auto_site_roots import _ensemble, _Refusing, _same_as_fixed, _site
from test_auto_sweep import _clean, _flat, fixed_region
from torch import nn

import ampcore
from ampcore._auto import _root_hooks, _roots_state
from ampcore._auto._roots_state import _local

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

MANY = 8
_GLOBAL = nn.modules.module._global_forward_pre_hooks
assert _roots_state._MARK_CALLED <= MANY


class _Counting(dict[Any, Any]):
    """A with-kwargs pre-hook dict that counts the writes and removals of keys that are not
    torch's handle ids (ours)."""

    touched = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(key, int):
            type(self).touched += 1
            self.writes = getattr(self, "writes", 0) + 1
        super().__setitem__(key, value)

    def pop(self, key: Any, *default: Any) -> Any:
        if not isinstance(key, int) and key in self:
            type(self).touched += 1
        return super().pop(key, *default)


def _settle_all(models: list[nn.Module], x: torch.Tensor) -> None:
    """Every member settled at :func:`_site` (a region each) and known to :func:`_site_run`'s
    site (all in one region)."""
    with torch.no_grad():
        for _ in range(2):
            _site_run(lambda: [m(x) for m in models])
    marking = _local.site.marking
    assert marking == (len(models) >= _roots_state._MARK_CALLED)
    for _ in range(3):
        _same_as_fixed(models, x)
    assert all(_settled(m) for m in models)
    assert _local.site.marking == marking


def _same_in_one_region(models: list[nn.Module], run: Callable[[], Any], after: Callable[[], Any] = list) -> None:
    """``run()`` (calling ``models`` in whatever way) in an auto region at
    :func:`_site_run`'s site equals it under the fixed choice; once ``after()`` ran,
    nothing is left behind."""
    with torch.no_grad(), fixed_region():
        want = list(_flat(run()))
    after()
    with torch.no_grad():
        got = list(_flat(_site_run(run)))
    after()
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    _clean(*models)


def _site_run(run: Callable[[], Any]) -> Any:
    """The same place in the code as :func:`test_auto_site_roots._site` would be another
    site: these tests' regions of several calls are entered here."""
    with ampcore.autocast("cpu", level="auto"):
        return run()


# --- what a settled region touches, counted ------------------------------------------------


@pytest.mark.parametrize("n", [MANY, 20])
def test_a_settled_region_at_a_site_of_many_roots_touches_only_the_root_it_calls(n: int) -> None:
    x = torch.randn(8, 16)
    models = _ensemble(n)
    counting = [_Counting() for _ in models]
    for model, d in zip(models, counting, strict=True):
        model._forward_pre_hooks_with_kwargs = d  # type: ignore[assignment]
    _settle_all(models, x)
    assert _local.site.marking
    _Counting.touched = 0
    for d in counting:
        d.writes = 0
    with torch.no_grad(), _roots_calls() as calls:
        for model in models:
            _site(model, x)
    assert _Counting.touched == 2 * n  # one mark and one unmark per region, of its own root
    assert [d.writes for d in counting] == [1] * n
    assert calls["_sentinel"] == n and calls["_root_post"] == n and calls["_record"] == 0 and calls["_find"] == 0
    _clean(*models)


def test_a_site_of_few_roots_runs_no_marker() -> None:
    """Below the threshold a region marks its site's roots at entry, as before: the global
    pre-hook dict holds the sentinel alone (no second hook call per root call)."""
    x = torch.randn(8, 16)
    models = _ensemble(_roots_state._MARK_CALLED - 1)
    _settle_all(models, x)
    seen: list[list[Any]] = []
    with torch.no_grad():
        _site(models[0], x, lambda: seen.append(list(_GLOBAL.values())))
    assert not _local.site.marking
    assert [getattr(h, "__name__", None) for h in seen[0]] == ["_sentinel"]
    _clean(*models)


def test_the_marker_runs_once_per_root_call_and_goes_off_with_the_sentinel() -> None:
    """During a root call that runs its program the global dict is empty (the modules inside
    take torch's hook-free path); between root calls the marker is just before the sentinel."""

    class Looking(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = _mlp()
            self.seen: list[int] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.append(len(_GLOBAL))
            out: torch.Tensor = self.body(x)
            return out

    x = torch.randn(8, 16)
    looking = Looking()
    models: list[nn.Module] = [*_ensemble(MANY - 1), looking]
    _settle_all(models, x)
    between: list[list[str]] = []
    looking.seen.clear()

    def run() -> Any:
        between.append([h.__name__ for h in _GLOBAL.values()])
        out = looking(x), models[0](x), looking(x)
        between.append([h.__name__ for h in _GLOBAL.values()])
        return out

    with torch.no_grad(), _roots_calls() as calls:
        _site_run(run)
    assert looking.seen == [0, 0]
    assert between == [["mark_called", "_sentinel"]] * 2
    assert calls["_sentinel"] == 3 and calls["_record"] == 0 and calls["_find"] == 0
    _clean(*models)


# --- behaviour with the marker: each equal to the fixed choice, nothing left ---------------


def test_a_root_called_twice_and_two_roots_in_one_region() -> None:
    x = torch.randn(8, 16)
    models = _ensemble(MANY)
    _settle_all(models, x)
    _same_in_one_region(models, lambda: (models[1](x), models[1](x + 1)))
    _same_in_one_region(models, lambda: (models[2](x), models[5](x), models[2](x)))
    with torch.no_grad(), _roots_calls() as calls:
        _site_run(lambda: (models[1](x), models[1](x), models[3](x)))
    assert calls["_sentinel"] == 3 and calls["_record"] == 0
    _clean(*models)


def test_a_root_called_from_another_thread_during_a_region() -> None:
    """The other thread (no region of its own) runs the marker and the sentinel (global
    hooks): they mark nothing there and its calls run as plain float32, also of a root the
    region marked."""
    x = torch.randn(8, 16)
    models = _ensemble(MANY)
    _settle_all(models, x)
    got: list[Any] = []

    def other() -> None:
        with torch.no_grad():
            got.extend((models[4](x), models[5](x)))

    def run() -> Any:
        out = models[4](x)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert _root_hooks.mark_called(models[6], (x,)) is None  # (in this thread: marked)
        return out, models[5](x), models[6](x)

    _same_in_one_region(models, run)
    with torch.no_grad():
        for model, out in zip((models[4], models[5]) * 2, got, strict=True):
            torch.testing.assert_close(out, model(x), rtol=0, atol=0)
            assert out.dtype == torch.float32
    assert not any(m._forward_pre_hooks_with_kwargs for m in models)


def test_threads_with_regions_at_sites_of_many_roots() -> None:
    x = torch.randn(8, 16)
    models = _ensemble(MANY)
    _settle_all(models, x)
    with torch.no_grad():
        want = [m(x) for m in models]
    errors: list[BaseException] = []

    def worker(order: list[nn.Module]) -> None:
        try:
            for _ in range(5):
                for model in order:
                    with torch.no_grad(), ampcore.autocast("cpu", level="auto"):
                        out = model(x)
                    torch.testing.assert_close(out, want[models.index(model)], rtol=0, atol=0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(o,)) for o in (models, models[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _clean(*models)


@pytest.mark.parametrize("remove", [True, False])
def test_a_users_global_hook_added_inside_a_region(remove: bool) -> None:
    """Registered after the sentinel: that call is applied call by call and the sentinel
    keeps its place, the marker just before it, the user's hook after them (as the
    reference's hooks, registered at the block's entry: seventeenth stop; before, the
    sentinel went last again); removed inside the region or after it."""
    x = torch.randn(8, 16)
    models = _ensemble(MANY)
    _settle_all(models, x)
    calls: list[str] = []
    order: list[list[str]] = []
    handles: list[Any] = []

    def run() -> Any:
        out = [models[0](x)]
        handle = nn.modules.module.register_module_forward_pre_hook(lambda m, a: calls.append(type(m).__name__))
        out += [models[1](x), models[2](x)]
        order.append([getattr(h, "__name__", "user") for h in _GLOBAL.values()])
        if remove:
            handle.remove()
        else:
            handles.append(handle)
        out.append(models[1](x))
        return out

    def after() -> None:
        while handles:
            handles.pop().remove()

    _same_in_one_region(models, run, after)
    assert order[-1] == ["mark_called", "_sentinel", "<lambda>"]
    assert calls
    _same_as_fixed(models, x)
    _clean(*models)


def test_a_region_that_raises_leaves_nothing_behind() -> None:
    x = torch.randn(8, 16)
    models = _ensemble(MANY)
    _settle_all(models, x)

    def between() -> None:
        models[0](x), models[1](x)
        raise ValueError("between roots")

    def fail(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        raise ValueError("in the forward")

    with pytest.raises(ValueError, match="between roots"), torch.no_grad():
        _site_run(between)
    _clean(*models)
    handle = models[3][4].register_forward_hook(fail)
    with pytest.raises(ValueError, match="in the forward"), torch.no_grad():
        _site_run(lambda: (models[2](x), models[3](x)))
    handle.remove()
    _clean(*models)
    _same_in_one_region(models, lambda: [m(x) for m in models])
    _same_as_fixed(models, x)
    _clean(*models)


def test_nested_regions_at_two_sites() -> None:
    """A region entered inside one at a site of many roots (another site: the inner one uses
    the global hooks, the roots it calls get their marks from the marker, harmlessly)."""
    x = torch.randn(8, 16)
    models = _ensemble(MANY)
    _settle_all(models, x)

    def inner() -> Any:
        with ampcore.autocast("cpu", level="auto"):
            return models[3](x), models[4](x)

    _same_in_one_region(models, lambda: (models[0](x), inner(), models[3](x), models[1](x)))
    _same_as_fixed(models, x)
    _clean(*models)


def test_a_site_that_grows_from_few_to_many_roots() -> None:
    x = torch.randn(8, 16)
    models = _ensemble(MANY + 2)
    few = models[: _roots_state._MARK_CALLED - 1]
    _settle_all(few, x)
    assert not _local.site.marking
    for k in range(len(few) + 1, len(models) + 1):
        _same_as_fixed(models[:k], x)
    assert _local.site.marking
    _settle_all(models, x)
    with torch.no_grad(), _roots_calls() as calls:
        for model in models:
            _site(model, x)
    assert calls["_record"] == 0 and calls["_find"] == 0
    _clean(*models)


def test_a_root_that_gets_a_pre_hook_between_regions_is_marked_at_entry_from_then_on() -> None:
    """The marker runs before a root's own pre-hooks but too late to put the sentinel after
    them for that call (torch took the module's hooks before the global ones ran): that call
    runs call by call, and the site marks the root at entry from then on."""
    x = torch.randn(8, 16)
    models = _ensemble(MANY + 1)
    _settle_all(models, x)
    seen: list[Any] = []
    own = models[2].register_forward_pre_hook(lambda m, a: seen.append(a[0].dtype))
    for _ in range(3):
        _same_as_fixed(models, x)
    assert id(models[2]) not in _local.site.called and models[2] in [r() for r in _local.site.early]
    with torch.no_grad(), _roots_calls() as calls:
        _site(models[2], x)
    assert calls["_record"] == 0 and calls["_find"] == 0 and seen[-1] == torch.float32
    own.remove()
    _clean(*models)
    _same_as_fixed(models, x)
    _clean(*models)


def test_a_root_whose_dict_refuses_our_key_at_a_site_of_many_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker cannot mark it: the sentinel meets it as a new root once (public
    registration), then the site hooks it at entry."""

    x = torch.randn(8, 16)
    models = _ensemble(MANY + 1)
    _settle_all(models, x)
    models[3]._forward_pre_hooks_with_kwargs = _Refusing()  # type: ignore[assignment]
    for _ in range(3):
        _same_as_fixed(models, x)
    assert _local.site.marking and models[3] in [r() for r in _local.site.early]
    updates: list[Any] = []
    update = _roots_state._Site.update
    monkeypatch.setattr(_roots_state._Site, "update", lambda *a: updates.append(a) or update(*a))
    with torch.no_grad(), _roots_calls() as calls:
        for _ in range(2):
            _site(models[3], x)
    assert calls["_record"] == 0 and updates == []  # (the site learns nothing new per region)
    _clean(*models)


def test_the_marker_ignores_modules_that_are_not_the_sites_roots_and_other_threads() -> None:
    x = torch.randn(8, 16)
    models = _ensemble(MANY)
    _settle_all(models, x)
    head = nn.Linear(8, 4)
    assert _root_hooks.mark_called(models[0], (x,)) is None  # outside a region: nothing
    with torch.no_grad():
        _site_run(lambda: _root_hooks.mark_called(head, (x,)))
    assert not head._forward_pre_hooks_with_kwargs
    _clean(*models, head)
