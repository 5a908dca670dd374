"""Issue 27, sixteenth stop: ``level="auto"`` on real Hugging Face models (tiny configs built
from ``transformers`` configs with random weights, no download).

Families: BERT (masked LM with labels), GPT-2 (causal LM; ``use_cache`` on and off, a
generate-like loop feeding ``past_key_values`` under ``torch.no_grad``), T5
(encoder-decoder with labels), ViT (image classification with labels), Llama (RoPE, RMSNorm,
grouped-query attention, SwiGLU).  Each case trains (forward, backward, an SGD step) in auto
regions and runs its steps with :func:`test_auto_sweep3.run`: under auto (a plan loaded: the
layers reading the hidden size float32, the others low, so the programs are mixed) equal to
the fixed precision the plan gives (:func:`_auto_testing.fixed`; outputs and their dtypes,
gradients, parameters), nothing of auto left after each step, and the same steps again
record nothing.  The dimensions: gradient checkpointing, ``eval()`` / ``train()`` toggled,
the ``"eager"`` and ``"sdpa"`` attention, ``output_attentions`` / ``output_hidden_states``
changed between steps, ``config.use_cache`` changed mid-run.

Every test skips without ``transformers``; the bug classes found here have their own test on
a hand-written model in ``test_auto_hf_mechanisms.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import test_auto_sweep3 as sweep3
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, counting, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

HIDDEN = 64
_NO_DROPOUT: dict[str, dict[str, float]] = {
    "bert": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "t5": {"dropout_rate": 0.0},
    "vit": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "llama": {"attention_dropout": 0.0},
}


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    return counting(monkeypatch)


@pytest.fixture(autouse=True)
def _mixed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan the cases load: a layer reading the hidden size (or an image) float32, the
    others low (mixed programs: attention and up-projections float32, down-projections low)."""

    def rule(module: nn.Module) -> str:
        reads = getattr(module, "in_features", 0) == HIDDEN or getattr(module, "in_channels", 0) == 3
        return "fp32" if reads else "low"

    monkeypatch.setattr(sweep3, "_rule", rule)


def _transformers() -> Any:
    return pytest.importorskip("transformers")


def build(family: str, attn: str = "sdpa", dropout: bool = False, **extra: Any) -> nn.Module:
    """A tiny model of ``family`` (2 layers, hidden :data:`HIDDEN`), seeded, in train mode."""
    tf = _transformers()
    common = {**({} if dropout else _NO_DROPOUT[family]), **extra}
    if family == "bert":
        cfg = tf.BertConfig(
            vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128, max_position_embeddings=32, **common,
        )  # fmt: skip
        cls = tf.BertForMaskedLM
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=64, n_positions=32, n_embd=HIDDEN, n_layer=2, n_head=2, **common)
        cls = tf.GPT2LMHeadModel
    elif family == "t5":
        cfg = tf.T5Config(
            vocab_size=64, d_model=HIDDEN, d_kv=16, d_ff=128, num_layers=2, num_heads=2,
            decoder_start_token_id=0, pad_token_id=0, **common,
        )  # fmt: skip
        cls = tf.T5ForConditionalGeneration
    elif family == "vit":
        cfg = tf.ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=HIDDEN, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=128, num_labels=5, **common,
        )  # fmt: skip
        cls = tf.ViTForImageClassification
    else:
        cfg = tf.LlamaConfig(
            vocab_size=64, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **common,
        )  # fmt: skip
        cls = tf.LlamaForCausalLM
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return cls(cfg).train()


FAMILIES = ["bert", "gpt2", "t5", "vit", "llama"]


def _batch(family: str, i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(100 + i)
    if family == "vit":
        return {
            "pixel_values": torch.randn(2, 3, 16, 16, generator=g),
            "labels": torch.randint(0, 5, (2,), generator=g),
        }
    ids = torch.randint(1, 64, (2, 8), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    if family == "t5":
        batch["labels"] = torch.randint(1, 64, (2, 5), generator=g)
    if family == "bert":
        batch["labels"] = torch.where(torch.rand(2, 8, generator=g) < 0.3, ids, -100)
    return batch


_OPTS: dict[int, torch.optim.Optimizer] = {}


def _train_step(family: str, **kw: Any) -> Callable[[nn.Module, int, Enter], Any]:
    """One training step (forward with labels in the region, backward, an SGD step); ``kw``
    maps a call argument to a function of the step number giving its value."""

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        opt = _OPTS.setdefault(id(model), torch.optim.SGD(model.parameters(), lr=0.1))
        args = {k: f(i) for k, f in kw.items()}
        with enter(BF16):
            out = model(**_batch(family, i), **args)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        extra = [t for name in ("attentions", "hidden_states") for t in (getattr(out, name, None) or ())]
        return out.loss, out.logits, *extra

    return step


@pytest.fixture(autouse=True)
def _fresh_optimizers() -> Any:
    yield
    _OPTS.clear()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_training_step(family: str, attn: str, recordings: list[Any]) -> None:
    run(lambda: build(family, attn), _train_step(family), 3, recordings)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_training_step_with_gradient_checkpointing(family: str, recordings: list[Any]) -> None:
    def make() -> nn.Module:
        model = build(family)
        model.gradient_checkpointing_enable()
        return model

    run(make, _train_step(family), 3, recordings)


@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_asked_for_changed_between_steps(family: str, recordings: list[Any]) -> None:
    """``output_attentions`` / ``output_hidden_states`` on at steps 1 and 3 only (eager: the
    attention weights exist)."""
    flags = {"output_attentions": lambda i: i % 2 == 1, "output_hidden_states": lambda i: i in (1, 2)}
    run(lambda: build(family, "eager"), _train_step(family, **flags), 4, recordings)


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_and_train_toggled(family: str, recordings: list[Any]) -> None:
    """Odd steps evaluate (``eval()``, ``torch.no_grad``), even ones train; dropout on (the
    same seed on both sides)."""
    train = _train_step(family)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        if i % 2 == 0:
            model.train()
            return train(model, i, enter)
        model.eval()
        with torch.no_grad(), enter(BF16):
            out = model(**_batch(family, i))
        return out.loss, out.logits

    run(lambda: build(family, dropout=True), step, 4, recordings)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("cache", [True, False])
def test_a_causal_lm_with_use_cache(family: str, cache: bool, recordings: list[Any]) -> None:
    run(lambda: build(family, use_cache=cache), _train_step(family, use_cache=lambda i: cache), 3, recordings)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_use_cache_changed_in_the_config_mid_run(family: str, recordings: list[Any]) -> None:
    train = _train_step(family)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        model.config.use_cache = i < 2
        return train(model, i, enter)

    run(lambda: build(family), step, 4, recordings)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_generate_like_loop_with_past_key_values(family: str, recordings: list[Any]) -> None:
    """Under ``torch.no_grad``: a prompt, then 4 tokens fed one at a time with the cache the
    previous call returned (greedy), in one region."""

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        model.eval()
        ids = _batch(family, i)["input_ids"][:, :5]
        logits = []
        with torch.no_grad(), enter(BF16):
            out = model(input_ids=ids, use_cache=True)
            for _ in range(4):
                logits.append(out.logits[:, -1])
                token = out.logits[:, -1:].float().argmax(-1)
                out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
        return logits

    run(lambda: build(family), step, 3, recordings)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_training_step_measured(family: str, recordings: list[Any], measuring: Any) -> None:
    """The classes decided low measured in the first step (the fake clock), the whole-call
    check run: the mixed program wins it."""
    run(lambda: build(family), _train_step(family), 3, recordings, measured=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_attention_implementation_switched_mid_run(family: str, recordings: list[Any]) -> None:
    train = _train_step(family)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        model.set_attn_implementation("eager" if i in (1, 2) else "sdpa")
        return train(model, i, enter)

    run(lambda: build(family), step, 4, recordings)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_switched_mid_run(family: str, recordings: list[Any]) -> None:
    train = _train_step(family)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        if i == 1:
            model.gradient_checkpointing_enable()
        if i == 3:
            model.gradient_checkpointing_disable()
        return train(model, i, enter)

    run(lambda: build(family), step, 4, recordings)


@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_asked_for_in_the_config_mid_run(family: str, recordings: list[Any]) -> None:
    """The config's ``output_hidden_states`` / ``output_attentions`` set between steps, in a
    cycle of 4 (off, hidden states, both, off): one program per combination of values; the
    rules for settings changed between steps (docs/auto.md) take up to 5 recordings in the
    first 3 cycles to settle on them (two flags changing at different steps), none after."""
    train = _train_step(family)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        model.config.output_hidden_states = i % 4 in (1, 2)
        model.config.output_attentions = i % 4 == 2
        return train(model, i, enter)

    run(lambda: build(family, "eager"), step, 12, recordings, settled=4)
