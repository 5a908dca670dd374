"""The models of ``bench_auto.py`` (issues 16 and 27; its docstring describes each): a
model by name and its inputs, and the training loss every mode uses."""

from __future__ import annotations

from typing import Any, Final

#: (big features, big batch, big layers, small features, small batch, small layers)
_MIXED: Final = {
    "mixed": (1024, 512, 4, 64, 16, 48),
    "heldout-mixed": (1536, 384, 3, 48, 8, 40),
    "heldout-small": (1536, 384, 0, 48, 8, 40),
    "heldout-wide": (1024, 256, 2, 96, 4, 64),
    "gpu-mixed": (4096, 4096, 4, 64, 16, 64),
}
#: (layers, d_model, heads, feed-forward, batch, tokens)
_TRANSFORMERS: Final = {"transformer": (4, 256, 4, 1024, 16, 64), "heldout-transformer": (3, 320, 5, 1280, 16, 64)}


def _mixed(sizes: tuple[int, ...], device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    big, big_batch, big_layers, small, small_batch, small_layers = sizes

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.ModuleList(nn.Linear(big, big) for _ in range(big_layers))
            self.small = nn.ModuleList(nn.Linear(small, small) for _ in range(small_layers))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            for i, layer in enumerate(self.big):
                x = layer(x) if i == len(self.big) - 1 else torch.relu(layer(x))
            for layer in self.small:
                y = y + torch.tanh(layer(y))
            return x, y

    data = (torch.rand(big_batch, big, device=device), torch.rand(small_batch, small, device=device))
    return Mixed().to(device), data


def _conv_mixed(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-conv``: a convolution part, a GEMM part and small residual layers."""
    import torch
    from torch import nn

    gemm, rest = _mixed((1024, 256, 2, 96, 4, 24), device)

    class ConvMixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.ModuleList(nn.Conv2d(32, 32, 3, padding=1) for _ in range(2))
            self.rest = gemm

        def forward(self, image: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            image = self.conv[1](torch.relu(self.conv[0](image)))
            return (image, *self.rest(x, y))

    data = (torch.rand(16, 32, 32, 32, device=device), *rest)
    return ConvMixed().to(device), data


def _flip(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-flip``: the same 4 x ``Linear(256)`` (GELU between) on a batch of 16 and on
    a batch of 512: one module, two shape classes whose decisions differ by the batch."""
    import torch
    from torch import nn

    class Flip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(256, 256) for _ in range(4))

        def forward(self, small: torch.Tensor, big: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            for layer in self.layers:
                small, big = nn.functional.gelu(layer(small)), nn.functional.gelu(layer(big))
            return small, big

    return Flip().to(device), (torch.rand(16, 256, device=device), torch.rand(512, 256, device=device))


def _block(d: int, ff: int, attention: int) -> Any:
    """A pre-norm residual block: LayerNorm, ``MultiheadAttention`` (``attention`` heads; 0:
    none), LayerNorm, ``Linear(d, ff)``, GELU, ``Linear(ff, d)``."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, attention, batch_first=True) if attention else None
            self.up, self.down = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.attn is not None:
                h = self.norm1(x)
                x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

    return Block()


#: (vocabulary, d, feed-forward, blocks, attention heads, batch, tokens)
_EMBEDDED: Final = {
    "heldout-embed-mlp": (16384, 384, 1536, 2, 0, 32, 64),
    "heldout-attn": (512, 192, 768, 2, 3, 8, 48),
    "heldout-tiny": (1000, 32, 64, 6, 2, 4, 8),
}


def _embedded(sizes: tuple[int, ...], device: str) -> tuple[Any, tuple[Any, ...]]:
    """An ``Embedding``, pre-norm blocks (:func:`_block`), a final LayerNorm and a head
    ``Linear(d, d)``; its inputs: token ids and the head's target."""
    import torch
    from torch import nn

    vocabulary, d, ff, blocks, heads, batch, tokens = sizes

    class Embedded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocabulary, d)
            self.blocks = nn.Sequential(*(_block(d, ff, heads) for _ in range(blocks)), nn.LayerNorm(d))
            self.head = nn.Linear(d, d)

        def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.head(self.blocks(self.embed(ids)))  # ``target``: the loss's

    ids = torch.randint(0, vocabulary, (batch, tokens), device=device)
    return Embedded().to(device), (ids, torch.rand(batch, tokens, d, device=device))


def build(name: str, device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    if name == "heldout-flip":
        return _flip(device)
    if name == "heldout-tie":  # 6 x Linear(224) on a batch of 64: low/fp32 near 1 with AMX
        return _mixed((224, 64, 6, 1, 1, 0), device)
    if name in _EMBEDDED:
        return _embedded(_EMBEDDED[name], device)
    if name in _MIXED:
        return _mixed(_MIXED[name], device)
    if name == "heldout-conv":
        return _conv_mixed(device)
    if name in _TRANSFORMERS:
        layers, d, heads, ff, batch, tokens = _TRANSFORMERS[name]
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=ff, dropout=0.1, batch_first=True)
        model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        return model.to(device), (torch.randn(batch, tokens, d, device=device),)
    if name == "seed":
        from ampcore._cli.experiment import SeedNet

        return SeedNet(2048).to(device), (torch.rand(512, 2048, device=device),)
    known = [*_MIXED, "heldout-conv", "heldout-flip", "heldout-tie", *_EMBEDDED, *_TRANSFORMERS, "seed"]
    raise SystemExit(f"unknown model {name!r}; valid: {', '.join(known)}")


def loss(out: Any, inputs: tuple[Any, ...]) -> Any:
    from torch import nn

    outs = out if isinstance(out, tuple) else (out,)
    targets = [i for i in inputs if i.is_floating_point()]  # token ids are no target
    return sum(nn.functional.mse_loss(o.float(), i) for o, i in zip(outs, targets, strict=True))
