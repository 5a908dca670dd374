"""Issue 27, sixteenth stop: what a root's own forward pre-hooks see and do, against the reference.

Two roots (``Towers``: ``a`` runs float32 throughout, then ``b``) in one block; ``b`` has a
forward pre-hook of its own that makes a product (a LoRA merge's ``B @ A``, a spectral
norm's power step).  The harness's reference (``_auto_testing.fixed``: torch.autocast with
each planned call in its plan's precision) decides a planned layer before its own hooks
(so a bare ``Linear`` root decided float32 has them run with autocast off), and counts a
low-precision product a root's own hook makes as that root running low (the O1 lists for
the ops after it).  Each hook kind (plain, ``with_kwargs=True``, ``prepend=True``) on a
bare planned root and on a container root, 4 steps (recorded, then settled): what the hook sees (autocast, the
product's dtype) and the dtype of the similarity after ``b`` equal the reference's.

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

import ampcore

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _plain(module: nn.Module, hook: Callable[..., Any]) -> Any:
    return module.register_forward_pre_hook(lambda m, args: hook(args))


def _with_kwargs(module: nn.Module, hook: Callable[..., Any]) -> Any:
    return module.register_forward_pre_hook(lambda m, args, kwargs: hook(args), with_kwargs=True)


def _prepended(module: nn.Module, hook: Callable[..., Any]) -> Any:
    module.register_forward_pre_hook(lambda m, args: None)  # (one of the user's, before it)
    return module.register_forward_pre_hook(lambda m, args: hook(args), prepend=True)


_KINDS: dict[str, Callable[[nn.Module, Callable[..., Any]], Any]] = {
    "plain": _plain,
    "with-kwargs": _with_kwargs,
    "prepend": _prepended,
}


def _global_in_region(module: nn.Module, hook: Callable[..., Any]) -> Any:
    """A global pre-hook for ``module`` registered inside each block, after ampcore's
    sentinel (returns a function that registers it: see :func:`_run`)."""

    def registered(m: nn.Module, args: tuple[Any, ...]) -> None:
        if m is module:
            hook(args)

    return lambda: nn.modules.module.register_module_forward_pre_hook(registered)


def _run(kind: str, planned: bool, reference: bool) -> list[tuple[bool, torch.dtype, torch.dtype]]:
    """Per step: what ``b``'s own pre-hook (registered by ``kind``) sees (autocast on, the
    dtype of a product it makes) after the float32 root ``a``, and the dtype of the
    similarity after ``b`` (``planned``: ``b`` is a bare ``Linear``, else a container)."""
    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    b = model.b[0] if planned else model.b
    seen: list[Any] = []

    def hook(args: tuple[Any, ...]) -> None:
        seen.append((torch.is_autocast_enabled("cpu"), (args[0] @ model.w).dtype))

    inside = _global_in_region(b, hook) if kind == "global-in-region" else None
    if inside is None:
        _KINDS[kind](b, hook)
    got = []
    for _ in range(4):
        with torch.no_grad(), fixed(BF16) if reference else ampcore.autocast("cpu", level="auto", dtype=BF16):
            handle = None if inside is None else inside()
            try:
                y, z = model.a(X), b(X)
                similarity = y @ z.t()
            finally:
                if handle is not None:
                    handle.remove()
        got.append((*seen.pop(), similarity.dtype))
    return got


@pytest.mark.parametrize("planned", [True, False], ids=["bare-planned-root", "container-root"])
@pytest.mark.parametrize("kind", list(_KINDS))
def test_a_roots_own_pre_hook_sees_and_counts_as_the_reference(kind: str, planned: bool) -> None:
    assert _run(kind, planned, reference=False) == _run(kind, planned, reference=True)


@pytest.mark.parametrize("planned", [True, False], ids=["bare-planned-root", "container-root"])
def test_a_global_pre_hook_registered_inside_the_region_sees_what_the_reference_gives(planned: bool) -> None:
    """A global pre-hook registered inside each block (after ampcore's sentinel), acting on
    ``b``.  Before (seventeenth stop): a bare planned root decided float32 had it see the O1
    state from its second call (the reference: off), and a container root's first call had
    it see autocast off (the reference: on): the sentinel, taken out while a root ran, went
    back last, so from then on such a hook ran before it.  Now it keeps its place
    (``test_auto_between_globals.py``: the held-out kinds)."""
    assert _run("global-in-region", planned, reference=False) == _run("global-in-region", planned, reference=True)


def test_a_float32_bare_roots_hook_that_merges_a_low_rank_update_merges_it_in_float32() -> None:
    """A LoRA-merge-like pre-hook on a bare ``Linear`` root decided float32 (the weight
    becomes ``base + B @ A`` before each call): the merged weight is the float32 sum, as in
    the reference, at every step (before: from the second call ``B @ A`` ran in bfloat16)."""
    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    layer = model.b[0]
    base = layer.weight.detach().clone()
    lora_b, lora_a = torch.randn(16, 4) / 3, torch.randn(4, 16) / 3

    def merge(module: nn.Module, args: tuple[Any, ...]) -> None:
        module.weight.data = base + lora_b @ lora_a

    layer.register_forward_pre_hook(merge)
    expected = base + lora_b @ lora_a
    for _ in range(4):
        with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
            model.a(X)
            out = layer(X)
        torch.testing.assert_close(layer.weight, expected, rtol=0, atol=0)
        assert out.dtype == torch.float32


def _gather(module: nn.Module, args: tuple[Any, ...]) -> None:
    """An FSDP2/ZeRO-3-like gather: the parameters copied into place (no product)."""
    for p in module.parameters():
        p.data = p.data.clone()


def test_a_gather_hook_leaves_a_float32_root_float32_after_it() -> None:
    """A hook that moves or gathers parameters makes no low-precision tensor: the ops after
    a float32 root stay float32 from its settled calls on (as the reference)."""
    got = []
    for reference in (False, True):
        torch.manual_seed(0)
        model = Towers()
        _decide_all(model)
        model.b.register_forward_pre_hook(_gather)
        dtypes = []
        for _ in range(4):
            with torch.no_grad(), fixed(BF16) if reference else ampcore.autocast("cpu", level="auto", dtype=BF16):
                y, z = model.a(X), model.b(X)
                dtypes.append((y @ z.t()).dtype)
        got.append(dtypes[1:])
    assert got[0] == got[1] == [torch.float32] * 3


def test_a_hook_raising_in_the_probed_call_leaves_no_mode_and_is_probed_later() -> None:
    """The root's own hook raises at the call that probes it: no mode is left on, our hooks
    are gone, and a later call probes it (the ops after it then as the reference)."""
    from ampcore._auto import _hook_probe

    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    calls = [0]

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("boom")
        (args[0] @ model.w).sum()

    model.b.register_forward_pre_hook(hook)
    dtypes = []
    for _ in range(5):
        with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
            y = model.a(X)
            try:
                z = model.b(X)
            except RuntimeError:
                assert not torch._C._is_torch_function_mode_enabled()
                assert _hook_probe._local.active is None
                continue
            dtypes.append((y @ z.t()).dtype)
    assert not torch._C._is_torch_function_mode_enabled()
    assert _hook_probe.low_hooks(model.b)
    assert dtypes[-1] == BF16  # (the reference: its hook's product counts as running low)
    assert all(type(k).__name__ != "_ProbeKey" for k in model.b._forward_pre_hooks)


def test_a_copy_of_a_root_awaiting_its_probe_drops_our_hooks() -> None:
    """A deep copy of a root made between its first call and its probe (an EMA copy) holds
    stale keys: called outside any region, it drops them and runs as a plain module."""
    import copy

    torch.manual_seed(0)
    model = Towers()
    _decide_all(model)
    model.b.register_forward_pre_hook(lambda m, args: None)
    with torch.no_grad(), ampcore.autocast("cpu", level="auto", dtype=BF16):
        model.a(X), model.b(X)
    twin = copy.deepcopy(model.b)
    out = twin(X)
    assert out.dtype == torch.float32
    names = {type(k).__name__ for d in (twin._forward_pre_hooks, twin._forward_hooks) for k in d}
    assert not names & {"_ProbeKey", "Stale"}
    assert not torch._C._is_torch_function_mode_enabled()
