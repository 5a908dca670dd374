"""Issue 27: the ops of an auto region between its roots (docs/auto.md, "Ops between roots").

A region's work outside its roots (a CLIP-like similarity ``y @ z.t()`` of two towers' outputs,
a loss computed in the region, a residual sum of two roots' outputs) ran with torch.autocast's
O1 lists even where every root of the region ran float32: without bf16 instructions that
product cost 3 x float32's (``heldout-clip@AVX512_CORE`` 1.29-1.30 x float32).  Now, after a
root call that ran float32 throughout (none before it in the region ran anything low),
autocast is off for the region's ops that follow, as in the float32 step, until the next root
call or a ``torch.autocast`` the user enters; after a root that ran anything low, the O1 lists
for the rest of the region (a mixed region keeps torch.autocast's dtypes).  Ops before the
first root call keep the O1 lists.  Recorded calls give what settled calls give.

Each case runs step by step against the harness's reference (``_auto_testing.fixed``, which
models the same rule) and asserts the dtypes the rule gives (which the reference alone would
not prove).  Timings are injected (plans loaded): no wall clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, _backward, _clean, run
from test_auto_sweep3 import recordings as recordings  # noqa: F401, PLC0414 (fixture)
from torch import nn

import ampcore
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

X = torch.randn(8, 16)


class Towers(nn.Module):
    """Two towers called as two roots (the pair itself is never called); ``low``: tower b
    ends in a ``Linear(32, 16)``, which the harness's rule decides low (a mixed region)."""

    def __init__(self, low: bool = False) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
        self.b = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16)) if low else nn.Sequential(nn.Linear(16, 16))
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.scale = nn.Parameter(torch.tensor(2.0))


def _steps(model: Callable[[], nn.Module], body: Callable[[Any, Any], Any], recordings: list[Any]) -> None:
    """``body(model, enter)`` step by step against the reference, then settled."""

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        out = body(m, enter)
        _backward(out)
        return out

    run(model, step, 4, recordings)


def _dtypes(body: Callable[[Any, Any], Any], model: nn.Module) -> list[torch.dtype]:
    """The dtypes of ``body``'s outputs under auto, at each of 4 steps (recorded, then settled)."""
    got = []
    for _ in range(4):
        with torch.no_grad():
            out = body(model, lambda dtype: ampcore.autocast("cpu", level="auto", dtype=dtype))
        _clean(model)
        got.append(tuple(t.dtype for t in out))
    return got


def _similarity(m: Any, enter: Enter) -> Any:
    with enter(BF16):
        y, z = m.a(X), m.b(X)
        logits = m.scale.exp() * F.normalize(y, dim=-1) @ F.normalize(z, dim=-1).t()
    return y, z, logits


def _loss(m: Any, enter: Enter) -> Any:
    with enter(BF16):
        y = m.a(X)
        loss = (y @ m.w).pow(2).mean()  # a loss computed in the region (a product of the O1 list)
    return y, loss


def _residual(m: Any, enter: Enter) -> Any:
    with enter(BF16):
        s = m.a(X) + m.b(X)
        out = F.linear(s, m.w)
    return s, out


def _cross_entropy(m: Any, enter: Enter) -> Any:
    target = torch.arange(8) % 8
    with enter(BF16):
        logits = m.a(X) @ m.b(X).t()
        loss = F.cross_entropy(logits.softmax(-1), target)
    return logits, loss


CASES = {"similarity": _similarity, "loss": _loss, "residual": _residual, "cross-entropy": _cross_entropy}


@pytest.mark.parametrize("body", CASES.values(), ids=CASES.keys())
def test_ops_after_roots_that_all_run_float32_run_float32(body: Any, recordings: list[Any]) -> None:
    _steps(Towers, body, recordings)
    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    for dtypes in _dtypes(body, model):  # recorded, then settled
        assert set(dtypes) == {torch.float32}


@pytest.mark.parametrize("body", [_similarity, _residual], ids=["similarity", "residual"])
def test_a_region_with_a_root_that_runs_low_keeps_the_o1_lists(body: Any, recordings: list[Any]) -> None:
    """Tower b has a layer decided low: the ops after it follow torch.autocast's lists."""
    _steps(lambda: Towers(low=True), body, recordings)
    torch.manual_seed(0)
    model = Towers(low=True)
    _decide_all(model)
    for dtypes in _dtypes(body, model):
        assert dtypes[-1] == BF16


def test_ops_between_a_float32_root_and_a_low_one_and_after_a_low_one() -> None:
    """Between a float32 root and a later low one: float32 (every root so far ran float32);
    after a low root, the O1 lists for the rest of the region, also after a float32 root."""
    torch.manual_seed(0)
    model = Towers(low=True)
    _decide_all(model)
    for _ in range(4):
        with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
            early = X @ model.w  # before any root: the O1 lists
            y = model.a(X)
            after_a = y @ model.w
            z = model.b(X)
            after_b = y @ z.t()
            model.a(X)
            again = y @ model.w
        _clean(model)
        assert (early.dtype, after_a.dtype, after_b.dtype, again.dtype) == (BF16, torch.float32, BF16, BF16)


def test_autocast_as_the_user_sees_it_between_roots() -> None:
    """``torch.is_autocast_enabled()`` reads False after a float32 root; a ``torch.autocast``
    entered there is the user's (and the region's state is back after it); an ampcore region
    nested there has its own lists; the region's exit puts torch's state back."""
    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    for _ in range(3):
        with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
            assert torch.is_autocast_enabled("cpu")
            y = model.a(X)
            assert not torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == BF16
            with ampcore.autocast("cpu", dtype=BF16):  # nested: its own (O1) lists
                assert (y @ model.w).dtype == BF16
            assert not torch.is_autocast_enabled("cpu")
            with ampcore.autocast("cpu", enabled=False):  # a torch.autocast inside it: that region's state after
                with torch.autocast("cpu", dtype=BF16):
                    assert (y @ model.w).dtype == BF16
                assert not torch.is_autocast_enabled("cpu")  # (not the auto region's state)
            model.a(X)  # (a disabled ampcore region may enter through torch.autocast: the region's state after it)
            assert not torch.is_autocast_enabled("cpu")
            with torch.autocast("cpu", dtype=BF16):
                assert (y @ model.w).dtype == BF16
            assert torch.is_autocast_enabled("cpu")  # the region's state after it
            assert (y @ model.w).dtype == BF16
            z = model.b(X)
            with torch.autocast("cpu", enabled=False):  # a root the user runs in float32 there
                assert model.a(X).dtype == torch.float32
            assert (y @ z.t()).dtype == BF16  # (the user's torch.autocast put the region's state back)
            model.a(X)
            assert (y @ z.t()).dtype == torch.float32
        _clean(model)
        assert not torch.is_autocast_enabled("cpu")


def test_an_exception_after_a_float32_root_leaves_nothing_behind() -> None:
    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    for _ in range(3):
        with pytest.raises(ValueError, match="between"), ampcore.autocast("cpu", level="auto", dtype=BF16):
            model.a(X)
            raise ValueError("between")
        _clean(model)
    with ampcore.autocast("cpu", level="auto", dtype=BF16):
        assert torch.is_autocast_enabled("cpu")
        assert (X @ model.w).dtype == BF16
    _clean(model)


def test_a_root_with_no_planned_module_keeps_the_ops_after_it_float32() -> None:
    """A loss module called in the region is a root too: float32 work only, so the ops after
    it stay float32; a root whose own forward runs a product of the O1 list does not (unless
    the whole-call check runs that root in float32: then the ops after it are float32 too)."""

    class Product(nn.Module):
        def forward(self, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return y @ w

    torch.manual_seed(0)
    model, mse, product = Towers(), nn.MSELoss(), Product()
    _decide_all(model)
    for _ in range(4):
        with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
            y = model.a(X)
            loss = mse(y, X)
            after_loss = y @ model.w
            inside = product(y, model.w)
            after_product = y @ model.w
        _clean(model, mse, product)
        assert (loss.dtype, after_loss.dtype) == (torch.float32, torch.float32)
        assert inside.dtype == after_product.dtype


def test_backward_outside_the_region_is_as_the_float32_step() -> None:
    torch.manual_seed(0)
    model = Towers()
    reference = Towers()
    reference.load_state_dict(model.state_dict())
    _decide_all(model)
    for _ in range(3):
        model.zero_grad()
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            _, _, logits = _similarity(model, lambda d: _Null())
        logits.sum().backward()
        _clean(model)
    reference.zero_grad()
    _, _, want = _similarity(reference, lambda d: _Null())
    want.sum().backward()
    torch.testing.assert_close(logits, want, rtol=0, atol=0)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _decide_all(model: nn.Module) -> None:
    """The harness's rule (``test_auto_sweep3._rule``: a Linear with 16 inputs float32, the
    others low) for the layers of ``model`` on ``X``'s batch."""
    entries: dict[str, Any] = {}
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for layer in (m for m in model.modules() if isinstance(m, nn.Linear)):
                for dtype in (torch.float32, BF16):
                    key = shape_class(layer, (torch.zeros(8, layer.in_features, dtype=dtype),), "cpu")
                    if key is not None:
                        entries[key] = {"decision": "fp32" if layer.in_features == 16 else "low"}
    fingerprint = ampcore.auto_plan("cpu", BF16).fingerprint
    ampcore.load_plan({"format": 2, "fingerprint": fingerprint, "entries": entries})


def test_a_torch_autocast_inside_a_nested_region_between_roots_leaves_the_next_root_its_program() -> None:
    """A ``torch.autocast`` entered inside an ampcore region nested between roots is that
    region's business: the auto region's next root still finds the region's state (before the
    check, the state left off after the float32 root was forgotten there, and a root decided
    low ran in float32)."""
    torch.manual_seed(0)
    model = Towers(low=True)
    _decide_all(model)
    for _ in range(3):
        with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
            model.a(X)
            with ampcore.autocast("cpu", dtype=BF16), torch.autocast("cpu", dtype=BF16):
                pass
            assert model.b(X).dtype == BF16  # its last layer decided low
        _clean(model)
