"""Hugging Face models for ``bench_auto.py`` (issue 27, sixteenth stop): ``transformers``
models built from configs (random weights, no download), each trained on its own loss
(labels given; the model's loss is the step's output, compared with 0 by ``bench_auto``'s MSE,
so the step trains on the loss squared).  Empty where ``transformers`` is not installed:
the names are then unknown to ``bench_auto.py``.

* ``hf-bert``: ``BertForMaskedLM``, 2 layers, hidden 256, 4 heads, feed-forward 1024, on
  4 x 32 tokens, 15% of them labelled;
* ``hf-gpt2``: ``GPT2LMHeadModel``, 2 layers, hidden 256, 4 heads, on 4 x 32 tokens;
* ``hf-t5``: ``T5ForConditionalGeneration``, 1 + 1 layers, d_model 256, d_ff 1024, 4 heads,
  4 x 32 source and 4 x 16 target tokens;
* ``hf-vit``: ``ViTForImageClassification``, 2 layers, hidden 192, 3 heads, 8 x 8 patches of
  4 x 3 x 32 x 32 images, 10 classes;
* ``hf-llama``: ``LlamaForCausalLM``, 2 layers, hidden 256, 8 heads, 2 key-value heads,
  SwiGLU 688, RMSNorm, rotary, on 4 x 32 tokens.

Dropout off (every mode's copy computes the same function).  Vocabularies 1024.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Final

_VOCAB: Final = 1024


def _wrapped(model: Any, names: tuple[str, ...]) -> Any:
    """``model`` called with the keyword arguments ``names`` (the step's tensors, in order,
    before the float target), returning its loss."""
    from torch import nn

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            return self.model(**dict(zip(names, args[: len(names)], strict=True))).loss

    return Loss()


def _tokens(device: str, length: int = 32) -> Any:
    import torch

    return torch.randint(0, _VOCAB, (4, length), device=device)


def _bert(device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=_VOCAB, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    ids = _tokens(device)
    labels = torch.where(torch.rand(ids.shape, device=device) < 0.15, ids, -100)
    model = _wrapped(transformers.BertForMaskedLM(cfg), ("input_ids", "labels"))
    return model.to(device), (ids, labels, torch.zeros((), device=device))


def _gpt2(device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=_VOCAB, n_positions=64, n_embd=256, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0,
    )  # fmt: skip
    ids = _tokens(device)
    model = _wrapped(transformers.GPT2LMHeadModel(cfg), ("input_ids", "labels"))
    return model.to(device), (ids, ids.clone(), torch.zeros((), device=device))


def _t5(device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    import transformers

    cfg = transformers.T5Config(
        vocab_size=_VOCAB, d_model=256, d_kv=64, d_ff=1024, num_layers=1, num_heads=4, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = _wrapped(transformers.T5ForConditionalGeneration(cfg), ("input_ids", "labels"))
    return model.to(device), (_tokens(device), _tokens(device, 16), torch.zeros((), device=device))


def _vit(device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    import transformers

    cfg = transformers.ViTConfig(
        image_size=32, patch_size=4, hidden_size=192, num_hidden_layers=2, num_attention_heads=3,
        intermediate_size=768, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    images, labels = torch.randn(4, 3, 32, 32, device=device), torch.randint(0, 10, (4,), device=device)
    model = _wrapped(transformers.ViTForImageClassification(cfg), ("pixel_values", "labels"))
    return model.to(device), (images, labels, torch.zeros((), device=device))


def _llama(device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=_VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    ids = _tokens(device)
    model = _wrapped(transformers.LlamaForCausalLM(cfg), ("input_ids", "labels"))
    return model.to(device), (ids, ids.clone(), torch.zeros((), device=device))


#: model name -> builder (issue 27, sixteenth stop); empty without ``transformers``
HF16: Final = (
    {"hf-bert": _bert, "hf-gpt2": _gpt2, "hf-t5": _t5, "hf-vit": _vit, "hf-llama": _llama}
    if importlib.util.find_spec("transformers") is not None
    else {}
)
