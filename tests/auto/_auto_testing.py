"""Shared fixture of the level-auto tests: a private plan cache, and no plans or roots
carried from one test to the next; a tiny Hugging Face encoder for the sweeps."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ampcore
from ampcore._auto import _hooks, _roots
from ampcore._auto._cache import forget_plans


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
