"""Issue 27, seventeenth stop: what a global forward hook of the user's sees, against the reference.

The reference (``_auto_testing.fixed``: torch.autocast with each planned call in its plan's
precision) registers its own global hooks when a block is entered, so a global hook of the
user's registered before the block runs before the decision's hook and one registered inside
it (before or after the block's first root call) runs after it.  Auto's sentinel holds the
reference's place: it goes back to its place in torch's global dict after each root call
(before: last, so a hook registered in the region ran before it from the second root call on
and saw the state between roots), and a root called while a hook registered in the region
follows the sentinel takes the sentinel as its last own pre-hook as well (the global one sets
the state, the root's runs its program on the arguments the hook gives), at that place in the
code from then on.

Two roots in one block (``Towers``: ``a`` runs float32 throughout, then ``b``: a bare planned
``Linear`` decided float32, a container decided float32, or a mixed container); a global
pre-hook or forward hook (plain, ``with_kwargs=True``, ``always_call=True``) acting on ``b``,
registered before the blocks, inside each block before its first root call, between the two
roots, or once inside the first block and kept: at each of 4 steps (recorded, then settled)
what it sees (autocast on, the dtype of a product it makes) and the dtype of the similarity
after ``b`` equal the reference's; nothing of ampcore is left in torch's global dicts.

Timings are injected (plans loaded): no wall clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, fixed  # noqa: F401 (fixture)
from test_auto_between import Towers, X, _decide_all
from test_auto_sweep3 import BF16
from torch import nn
from torch.nn.modules import module as torch_module

import ampcore
from ampcore._auto import _roots

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

_Hook = Callable[[nn.Module], Any]


def _kinds(target: Callable[[], nn.Module], hook: Callable[[], None]) -> dict[str, _Hook]:
    """Registrations of a global hook that calls ``hook`` when ``target()`` is called."""

    def pre(m: nn.Module, args: tuple[Any, ...], kwargs: Any = None) -> None:
        if m is target():
            hook()

    def post(m: nn.Module, *rest: Any) -> None:
        if m is target():
            hook()

    return {
        "pre": lambda _: torch_module.register_module_forward_pre_hook(pre),
        "post": lambda _: torch_module.register_module_forward_hook(post),
        "post-kwargs": lambda _: torch_module.register_module_forward_hook(post, with_kwargs=True),
        "post-always": lambda _: torch_module.register_module_forward_hook(post, always_call=True),
    }


_WHEN = ["before-blocks", "in-each-block", "between-roots", "once-in-first-block"]
_ROOTS = ["bare-planned", "container", "mixed-container"]


def _run(kind: str, when: str, root: str, reference: bool) -> list[tuple[bool, torch.dtype, torch.dtype]]:
    """Per step: what the global hook registered ``when`` sees at ``root`` (autocast on, the
    dtype of a product it makes) and the dtype of the similarity after ``b``."""
    torch.manual_seed(0)
    model = Towers(low=root == "mixed-container")
    _decide_all(model)
    b = model.b[0] if root == "bare-planned" else model.b
    seen: list[Any] = []

    def hook() -> None:
        seen.append((torch.is_autocast_enabled("cpu"), (X @ model.w).dtype))

    register = _kinds(lambda: b, hook)[kind]
    handles = [register(b)] if when == "before-blocks" else []
    got = []
    try:
        for step in range(4):
            with torch.no_grad(), fixed(BF16) if reference else ampcore.autocast("cpu", level="auto", dtype=BF16):
                inside = when == "in-each-block" or (when == "once-in-first-block" and step == 0)
                if inside:
                    handles.append(register(b))
                y = model.a(X)
                if when == "between-roots":
                    handles.append(register(b))
                z = b(X)
                similarity = y @ z.t()
                if when in ("in-each-block", "between-roots"):
                    handles.pop().remove()
            got.append((*seen.pop(), similarity.dtype))
            assert not seen
    finally:
        for handle in handles:
            handle.remove()
    assert not any(
        getattr(h, "__module__", "").startswith("ampcore") for h in torch_module._global_forward_pre_hooks.values()
    )
    assert not any(
        getattr(h, "__module__", "").startswith("ampcore") for h in torch_module._global_forward_hooks.values()
    )
    return got


@pytest.mark.parametrize("root", _ROOTS)
@pytest.mark.parametrize("when", _WHEN)
@pytest.mark.parametrize("kind", ["pre", "post", "post-kwargs", "post-always"])
def test_a_global_hook_sees_what_the_reference_gives(kind: str, when: str, root: str) -> None:
    assert _run(kind, when, root, reference=False) == _run(kind, when, root, reference=True)


def test_a_global_pre_hook_registered_in_each_block_leaves_settled_steps_to_programs() -> None:
    """With a global pre-hook registered inside each block (after the sentinel), the roots'
    calls from the third step on run their programs: no recording, no call by call."""
    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    recorded: list[nn.Module] = []
    real = _roots._record

    def counted(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        recorded.append(module)
        return real(module, *args, **kwargs)

    seen: list[bool] = []

    def hook(m: nn.Module, args: tuple[Any, ...]) -> None:
        if m is model.b:
            seen.append(torch.is_autocast_enabled("cpu"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_roots, "_record", counted)
        for step in range(6):
            with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
                handle = torch_module.register_module_forward_pre_hook(hook)
                try:
                    model.a(X)
                    model.b(X)
                finally:
                    handle.remove()
            if step == 2:
                recorded.clear()
    assert recorded == []
    assert seen == [True] * 6  # a container root: the region's state again before it, as the reference


class _Raising(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("a bad batch")
        return self.lin(x)  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["pre", "post", "post-always"])
def test_a_root_that_raises_among_hooks_registered_in_the_region_leaves_nothing_behind(kind: str) -> None:
    """A settled root that raises while global hooks registered in the region follow the
    sentinel (its place held, its post-hook in torch's global dict): nothing of ampcore is
    left in torch's global dicts, and the next steps run as before."""
    torch.manual_seed(0)
    model = _Raising()
    calls: list[nn.Module] = []
    register = _kinds(lambda: model, lambda: calls.append(model))[kind]
    for step in range(6):
        model.fail = step == 4
        with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
            handle = register(model)
            try:
                model(X)
            except RuntimeError:
                assert step == 4
            finally:
                handle.remove()
        for hooks in (torch_module._global_forward_pre_hooks, torch_module._global_forward_hooks):
            assert hooks == {}, step
        assert not model._forward_hooks and not model._forward_pre_hooks
    assert len(calls) == (6 if kind == "pre" else 5)  # (torch's always-called hooks after a raise: no result)
