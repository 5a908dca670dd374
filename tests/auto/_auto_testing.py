"""Shared fixture of the level-auto tests: a private plan cache, and no plans or roots
carried from one test to the next; a tiny Hugging Face encoder for the sweeps."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

import ampcore
from ampcore._auto import _hooks, _roots
from ampcore._auto._cache import forget_plans
from ampcore._auto._guard import in_checkpoint
from ampcore._auto._shapes import planned_ops, shape_class
from ampcore._policy.torch_state import enter_torch_autocast


@pytest.fixture
def auto_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A plan cache under ``tmp_path``, plans and roots forgotten before and after, ampcore's
    warnings (measurement notes) silenced, and the adapter's load not asked (the machine's
    load must not decide what a test sees: tests that need a load set ``_hooks.load_of``)."""
    monkeypatch.setenv("AMPCORE_AUTO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_hooks, "load_of", lambda region: None)
    forget_plans()
    _roots.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ampcore.AmpcoreWarning)
        yield
    forget_plans()
    _roots.forget()


def tiny_bert(**config: Any) -> Any:
    """A 2-layer ``transformers.BertModel`` (hidden 32, vocabulary 100), seeded; ``config``
    adds to its ``BertConfig``.  Skips where transformers is not installed."""
    import torch

    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        **config,
    )
    torch.manual_seed(0)
    return transformers.BertModel(cfg)


def counting(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The roots of the recordings made from now on (those with their dispatch mode: the ones
    that may give programs)."""
    made: list[Any] = []
    real = _roots.Recording

    def counted(*args: Any) -> Any:
        rec = real(*args)
        if rec.mode is not None:
            made.append(rec.root)
        return rec

    monkeypatch.setattr(_roots, "Recording", counted)
    return made


class _Outside(TorchFunctionMode):
    """Notes a low-precision tensor made by an op outside planned modules inside a root call."""

    def __init__(self, seen: Callable[[], bool], low: list[bool]) -> None:
        super().__init__()
        self.seen, self.low = seen, low

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.seen() and any(isinstance(t, torch.Tensor) and t.dtype in _LOW for t in tree_leaves(out)):
            self.low[0] = True
        return out


_LOW = (torch.bfloat16, torch.float16)


@contextlib.contextmanager
def fixed(dtype: torch.dtype) -> Iterator[None]:
    """torch.autocast in ``dtype`` with each planned call in its plan's precision (float32:
    autocast off, low inputs cast to float32), where autocast is on and no ampcore region but
    an auto one is active (a region the forward enters: its own rules).

    A planned call inside ``torch.utils.checkpoint`` follows the autocast state (its
    recompute does; ``_guard.in_checkpoint``).

    The ops between roots (modules called directly in the block) run as auto runs them
    (docs/auto.md, "Ops between roots"): after a root call that ran all in float32 (float32
    inputs, every planned call decided float32 with autocast on, no op outside planned
    modules made a low-precision tensor) while no root before it in the block ran anything
    low, autocast is off until the next root call; after a root that ran anything low, the
    O1 lists for the rest of the block.  A ``torch.autocast`` entered between roots while
    autocast is off so puts the block's state back first (auto's ``_entered`` wrapper): inside
    it its own flags, after it the O1 lists until the next root (issue 27, fifteenth stop:
    before, the reference left autocast off after it, where auto runs the O1 lists); not the
    entry a nested ``ampcore.autocast`` makes itself (``enter_torch_autocast``: it keeps the
    state, as auto's wrapper does)."""
    plan = ampcore.auto_plan("cpu", dtype)
    state: list[bool] = []
    depth, low, between = [0], [False], [None]  # between: None, True (off after a root), False (one ran low)
    judged = [False]  # the root call in progress runs with the block's autocast on

    def pre(module: nn.Module, args: tuple[Any, ...]) -> Any:
        if depth[0] == 0:  # a root call
            if between[0] is True:
                torch.set_autocast_enabled("cpu", True)
                between[0] = None
            judged[0] = torch.is_autocast_enabled("cpu") and ampcore.active_region() is None
            low[0] = any(isinstance(t, torch.Tensor) and t.dtype in _LOW for t in tree_leaves(args))
        depth[0] += 1
        if planned_ops(module) is None:
            return None
        enabled = torch.is_autocast_enabled("cpu")
        state.append(enabled)
        inner = ampcore.active_region()
        if in_checkpoint():  # its recompute runs with the checkpoint's autocast state, no hooks: so does auto
            low[0] = low[0] or enabled
            return None
        if not enabled or (inner is not None and inner.level != "auto"):
            low[0] = True  # (not the region's state: auto keeps the O1 lists around the root)
            return None
        key = shape_class(module, args, "cpu")
        weights32 = all(p.dtype == torch.float32 for p in module.parameters(recurse=False))
        if key is not None and weights32 and plan.decision(key) == "fp32":
            torch.set_autocast_enabled("cpu", False)
            return tuple(
                a.float() if isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16) else a
                for a in args
            )
        low[0] = True
        return None

    def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if planned_ops(module) is not None:
            torch.set_autocast_enabled("cpu", state.pop())
        depth[0] -= 1
        if depth[0] == 0 and judged[0]:
            judged[0] = False
            if not low[0] and between[0] is not False:
                torch.set_autocast_enabled("cpu", False)
                between[0] = True
            else:
                between[0] = False

    cls = torch.amp.autocast_mode.autocast
    torch_enter = cls.__enter__

    def enter(self: Any) -> Any:
        ours = sys._getframe(1).f_code is enter_torch_autocast.__code__  # a nested ampcore region's entry
        if between[0] is True and depth[0] == 0 and ampcore.active_region() is None and not ours:
            torch.set_autocast_enabled("cpu", True)
            between[0] = None
        return torch_enter(self)

    handles = [
        nn.modules.module.register_module_forward_pre_hook(pre),
        nn.modules.module.register_module_forward_hook(post, always_call=True),
    ]
    try:
        with torch.autocast("cpu", dtype=dtype), _Outside(lambda: depth[0] > 0 and not state, low):
            cls.__enter__ = enter
            try:
                yield
            finally:
                cls.__enter__ = torch_enter
    finally:
        for handle in handles:
            handle.remove()
