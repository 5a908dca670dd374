"""Shared fixture of the level-auto tests: a private plan cache, and no plans or roots
carried from one test to the next; a tiny Hugging Face encoder for the sweeps."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampcore
from ampcore._auto import _hooks, _roots
from ampcore._auto._cache import forget_plans
from ampcore._auto._shapes import planned_ops, shape_class


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


@contextlib.contextmanager
def fixed(dtype: torch.dtype) -> Iterator[None]:
    """torch.autocast in ``dtype`` with each planned call in its plan's precision (float32:
    autocast off, low inputs cast to float32), where autocast is on and no ampcore region but
    an auto one is active (a region the forward enters: its own rules)."""
    plan = ampcore.auto_plan("cpu", dtype)
    state: list[bool] = []

    def pre(module: nn.Module, args: tuple[Any, ...]) -> Any:
        if planned_ops(module) is None:
            return None
        enabled = torch.is_autocast_enabled("cpu")
        state.append(enabled)
        inner = ampcore.active_region()
        if not enabled or (inner is not None and inner.level != "auto"):
            return None
        key = shape_class(module, args, "cpu")
        weights32 = all(p.dtype == torch.float32 for p in module.parameters(recurse=False))
        if key is not None and weights32 and plan.decision(key) == "fp32":
            torch.set_autocast_enabled("cpu", False)
            return tuple(
                a.float() if isinstance(a, torch.Tensor) and a.dtype in (torch.bfloat16, torch.float16) else a
                for a in args
            )
        return None

    def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if planned_ops(module) is not None:
            torch.set_autocast_enabled("cpu", state.pop())

    handles = [
        nn.modules.module.register_module_forward_pre_hook(pre),
        nn.modules.module.register_module_forward_hook(post),
    ]
    try:
        with torch.autocast("cpu", dtype=dtype):
            yield
    finally:
        for handle in handles:
            handle.remove()
