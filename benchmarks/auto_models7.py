"""The held-out models of issue 27's seventh sweep for ``bench_auto.py`` (its docstring
describes each): kinds and uses the earlier sweeps' benchmarks did not have."""

from __future__ import annotations

from typing import Any, Final


def replicate(module: Any) -> Any:
    """A replica of ``module`` as ``nn.DataParallel`` makes one every step
    (``Module._replicate_for_data_parallel``: shallow copies of every module sharing the
    parameters, here on the same device): new module objects, the same tensors."""
    copies: dict[int, Any] = {}
    for m in module.modules():
        copies[id(m)] = m._replicate_for_data_parallel()
    for m in module.modules():
        replica = copies[id(m)]
        replica._parameters = dict(m._parameters)  # the same parameters (gradients reach them)
        replica._modules = {name: None if c is None else copies[id(c)] for name, c in m._modules.items()}
    return copies[id(module)]


def _replica(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-replica``: a 2-layer ``nn.TransformerEncoder`` (d_model 128, 4 heads,
    feed-forward 512, no dropout) on 8 x 32 tokens, run as ``nn.DataParallel`` runs a
    model: a new replica of it (:func:`replicate`) every step."""
    import torch
    from torch import nn

    class Replicated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0, batch_first=True)
            self.inner = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def __call__(self, x: torch.Tensor, target: torch.Tensor) -> Any:  # not a module call: the replica is the root
            return replicate(self.inner)(x)

    x = torch.randn(8, 32, 128, device=device)
    return Replicated().to(device), (x, torch.randn(8, 32, 128, device=device))


def _moe(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-moe``: a mixture of experts: ``Linear(256, 8)`` router, top-2 of 8 experts
    (``Linear(256, 1024)``, GELU, ``Linear(1024, 256)``) called on the tokens routed to
    them (a number that changes every step: new inputs each step), ``index_add_`` back,
    a residual and a head, on 2048 tokens."""
    import torch
    from torch import nn

    class MoE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = nn.Linear(256, 8)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(8)
            )
            self.head = nn.Linear(256, 256)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            x = x + 0.1 * torch.randn_like(x)  # new routing every step
            weights, chosen = torch.softmax(self.router(x).float(), -1).topk(2, -1)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                rows, slot = (chosen == e).nonzero(as_tuple=True)
                if rows.numel():
                    y = expert(x[rows]) * weights[rows, slot, None]
                    out = out.index_add(0, rows, y.to(out.dtype))
            return self.head(x + out)

    return MoE().to(device), (torch.randn(2048, 256, device=device), torch.randn(2048, 256, device=device))


def _llama(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-llama``: a ``transformers.LlamaModel`` from a config (no download: 2
    layers, hidden 256, 8 heads, 2 key-value heads (grouped-query attention), SwiGLU 688,
    RMSNorm, rotary embeddings, ``scaled_dot_product_attention``) on 4 x 128 tokens; the
    last hidden state compared with a target."""
    import torch
    import transformers
    from torch import nn

    cfg = transformers.LlamaConfig(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llama = transformers.LlamaModel(cfg)

        def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.llama(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 8192, (4, 128), device=device)
    return Llama().to(device), (ids, torch.rand(4, 128, 256, device=device))


#: model name -> builder (the seventh sweep of issue 27)
SWEEP7: Final = {
    "heldout-replica": _replica,
    "heldout-moe": _moe,
    "heldout-llama": _llama,
}
