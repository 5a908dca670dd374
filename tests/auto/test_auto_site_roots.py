"""Issue 27 (eleventh stop): a place in the code with many roots (an ensemble, a region each).

Each region entered at a settled site marks every root the site knows (our key in the root's
with-kwargs pre-hook dict, so the sentinel gets its kwargs, or the sentinel as the last
pre-hook of a root with pre-hooks of its own) and unmarks them at its exit.  Roots with
pre-hooks of their own (before the regions, or registered inside one) and a root whose dict
refuses our key (marked through torch's public registration) must each still equal the
fixed choice, with nothing left behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_site import _decide, _mlp, _settled
from test_auto_sweep import _clean, _flat, fixed_region
from torch import nn

import ampcore
from ampcore._auto._roots_state import _local

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _site(model: nn.Module, x: torch.Tensor, inside: Callable[[], Any] | None = None) -> Any:
    """The one place in the code every auto region of these tests is entered at (``inside``:
    called in the region before the model)."""
    with ampcore.autocast("cpu", level="auto"):
        if inside is not None:
            inside()
        return model(x)


def _ensemble(n: int) -> list[nn.Sequential]:
    models = [_mlp() for _ in range(n)]
    _decide(models[0], 8, "fp32")  # (the same classes for every member)
    return models


def _same_as_fixed(models: list[nn.Module], x: torch.Tensor) -> None:
    """Each member called at the site equals the fixed choice; nothing of auto left."""
    for model in models:
        with torch.no_grad(), fixed_region():
            want = list(_flat(model(x)))
        with torch.no_grad():
            got = list(_flat(_site(model, x)))
        assert [t.dtype for t in got] == [t.dtype for t in want]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


class _Refusing(dict[Any, Any]):
    """A with-kwargs pre-hook dict that takes torch's handle ids only."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(key, int):
            raise TypeError("hook ids only")
        super().__setitem__(key, value)


def test_roots_with_pre_hooks_of_their_own_at_a_site_of_many_roots() -> None:
    """One member has a pre-hook before the regions (marked root by root, the sentinel after
    its hook), another gets one inside a region (unmarked root by root): each still equals the
    fixed choice and nothing is left behind once the hooks are removed."""
    x = torch.randn(8, 16)
    models = _ensemble(5)
    calls: list[int] = []
    own = models[1].register_forward_pre_hook(lambda m, a: calls.append(1))
    for _ in range(3):
        _same_as_fixed(models, x)
    assert all(_settled(m) for m in models)
    late: list[Any] = []

    def register_inside(m: nn.Module, a: tuple[Any, ...]) -> None:
        if not late:
            late.append(models[3].register_forward_pre_hook(lambda m, a: calls.append(3)))

    inside = models[2].register_forward_pre_hook(register_inside)
    with torch.no_grad(), ampcore.autocast("cpu", level="auto"):
        for model in models:
            model(x)
    assert late and calls.count(3) == 1
    for _ in range(2):
        _same_as_fixed(models, x)
    for handle in (own, inside, late[0]):
        handle.remove()
    _clean(*models)
    _same_as_fixed(models, x)
    _clean(*models)


def test_a_root_without_torchs_hook_dicts_at_a_site_of_many_roots() -> None:
    """A root whose with-kwargs dict refuses our key (TypeError) is marked through torch's
    public registration, the others root by root; nothing is left behind."""

    x = torch.randn(8, 16)
    models = _ensemble(4)
    for _ in range(2):
        _same_as_fixed(models, x)
    models[2]._forward_pre_hooks_with_kwargs = _Refusing()  # type: ignore[assignment]
    for _ in range(2):
        _same_as_fixed(models, x)
    seen: list[Any] = []

    def look() -> None:
        key = _local.sentinel_key
        seen.append((set(_local.public), [m for m in models if key in m._forward_pre_hooks_with_kwargs]))

    with torch.no_grad():
        _site(models[0], x, look)
    public, marked = seen[0]
    assert public == {id(models[2])}
    assert marked == [m for i, m in enumerate(models) if i != 2]
    _clean(*models)
