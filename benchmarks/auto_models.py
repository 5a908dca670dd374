"""The models of ``bench_auto.py`` (issues 16 and 27; its docstring describes each): a
model by name and its inputs, and the training loss every mode uses."""

from __future__ import annotations

from typing import Any, Final

from auto_models6 import SWEEP6
from auto_models7 import SWEEP7
from auto_models8 import SWEEP8
from auto_models9 import SWEEP9
from auto_models14 import SWEEP14
from auto_models15 import SWEEP15
from auto_models16 import HF16
from auto_models16_sweep import SWEEP16
from auto_models17_sweep import SWEEP17

#: the held-out models of the sixth to twelfth sweeps, the fourteenth stop, Hugging Face's (sixteenth)
_LATER: Final = {**SWEEP6, **SWEEP7, **SWEEP8, **SWEEP9, **SWEEP14, **SWEEP15, **SWEEP16, **SWEEP17, **HF16}

#: (big features, big batch, big layers, small features, small batch, small layers)
_MIXED: Final = {
    "mixed": (1024, 512, 4, 64, 16, 48),
    "heldout-mixed": (1536, 384, 3, 48, 8, 40),
    "heldout-small": (1536, 384, 0, 48, 8, 40),
    "heldout-wide": (1024, 256, 2, 96, 4, 64),
    "gpu-mixed": (4096, 4096, 4, 64, 16, 64),
    "heldout-mlp5": (2048, 256, 2, 32, 8, 56),
}
#: (layers, d_model, heads, feed-forward, batch, tokens)
_TRANSFORMERS: Final = {"transformer": (4, 256, 4, 1024, 16, 64), "heldout-transformer": (3, 320, 5, 1280, 16, 64)}
#: (layers, d_model, heads, feed-forward, batch, target tokens, memory tokens)
_DECODERS: Final = {"heldout-decoder": (2, 192, 6, 768, 8, 32, 48)}


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


def _resnet(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-resnet``: a small ResNet-style CNN on 8 x 3 x 32 x 32 images: a stem
    ``Conv2d(3, 16, 3)`` + ``BatchNorm2d`` + ReLU, two residual blocks (Conv + BN + ReLU +
    Conv + BN, added, ReLU) at 16 channels, max pooling, one block at 32 channels (stride 2,
    a 1 x 1 projection), global average pooling and a ``Linear(32, 10)`` head; its inputs:
    images and the head's target."""
    import torch
    from torch import nn

    def conv_bn(cin: int, cout: int, stride: int = 1, k: int = 3) -> Any:
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.a, self.b = conv_bn(cin, cout, stride), conv_bn(cout, cout)
            self.skip = conv_bn(cin, cout, stride, 1) if stride != 1 or cin != cout else nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.b(torch.relu(self.a(x))) + self.skip(x))

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                conv_bn(3, 16), nn.ReLU(), Block(16, 16, 1), Block(16, 16, 1), nn.MaxPool2d(2), Block(16, 32, 2)
            )
            self.head = nn.Linear(32, 10)

        def forward(self, image: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(image).mean((2, 3)))  # ``target``: the loss's

    return ResNet().to(device), (torch.rand(8, 3, 32, 32, device=device), torch.rand(8, 10, device=device))


def _depthwise(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-depthwise``: MobileNet-style blocks on 4 x 32 x 32 x 32: a depthwise
    ``Conv2d(32, 32, 3, groups=32)`` + BN + ReLU6, a pointwise ``Conv2d(32, 64, 1)`` + BN, a
    grouped ``Conv2d(64, 64, 3, groups=4)`` + BN + ReLU6, a pointwise ``Conv2d(64, 32, 1)``
    back, residual; twice."""
    import torch
    from torch import nn

    def block() -> Any:
        return nn.Sequential(
            nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU6(),
            nn.Conv2d(32, 64, 1, bias=False),
            nn.BatchNorm2d(64),
            nn.Conv2d(64, 64, 3, padding=1, groups=4, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU6(),
            nn.Conv2d(64, 32, 1),
        )

    class Depthwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(block() for _ in range(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = x + b(x)
            return x

    return Depthwise().to(device), (torch.rand(4, 32, 32, 32, device=device),)


def _conv1d(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-conv1d``: ``Conv1d`` over sequences (batch 16, 64 channels, 256 steps): a
    ``Conv1d(64, 128, 5)``, GELU, a dilated ``Conv1d(128, 128, 3, dilation=2)``, GELU, a
    ``Conv1d(128, 64, 1)`` back, residual."""
    import torch
    from torch import nn

    class Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv1d(64, 128, 5, padding=2)
            self.b = nn.Conv1d(128, 128, 3, padding=2, dilation=2)
            self.c = nn.Conv1d(128, 64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gelu = nn.functional.gelu
            return x + self.c(gelu(self.b(gelu(self.a(x)))))

    return Seq().to(device), (torch.rand(16, 64, 256, device=device),)


def _recurrent(cell: str, device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-lstm`` / ``heldout-gru``: a 2-layer ``nn.LSTM`` / ``nn.GRU`` (64 -> 128, batch
    first) over 16 x 32 steps and a ``Linear(128, 64)`` head per step (recurrent modules are
    not a planned kind: what auto does with them)."""
    import torch
    from torch import nn

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = getattr(nn, cell)(64, 128, num_layers=2, batch_first=True)
            self.head = nn.Linear(128, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0])

    return Recurrent().to(device), (torch.rand(16, 32, 64, device=device),)


def _functional(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-functional``: weights as plain parameters, used by
    ``torch.nn.functional.linear`` and ``torch.matmul`` in ``forward`` (ops outside planned
    modules), 3 blocks on a batch of 64 x 256 features, plus one ``nn.Linear(256)``."""
    import torch
    from torch import nn

    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.ParameterList(nn.Parameter(torch.randn(256, 256) / 16) for _ in range(3))
            self.b = nn.ParameterList(nn.Parameter(torch.zeros(256)) for _ in range(3))
            self.v = nn.ParameterList(nn.Parameter(torch.randn(256, 256) / 16) for _ in range(3))
            self.out = nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for w, b, v in zip(self.w, self.b, self.v, strict=True):
                x = x + torch.matmul(torch.tanh(nn.functional.linear(x, w, b)), v)
            return self.out(x)

    return Functional().to(device), (torch.rand(64, 256, device=device),)


def _vit(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-vit``: a ViT-style patch embedding (``Conv2d(3, 128, 8, stride=8)`` on 8 x 3
    x 64 x 64 images: 64 patches), a learned position embedding, 2 pre-norm encoder blocks
    (:func:`_block`: 4 heads, feed-forward 512), LayerNorm, mean over patches, a
    ``Linear(128, 10)`` head."""
    import torch
    from torch import nn

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, 128, 8, stride=8)
            self.pos = nn.Parameter(torch.zeros(1, 64, 128))
            self.blocks = nn.Sequential(*(_block(128, 512, 4) for _ in range(2)), nn.LayerNorm(128))
            self.head = nn.Linear(128, 10)

        def forward(self, image: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            x = self.patch(image).flatten(2).transpose(1, 2) + self.pos
            return self.head(self.blocks(x).mean(1))

    return ViT().to(device), (torch.rand(8, 3, 64, 64, device=device), torch.rand(8, 10, device=device))


def _split(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-split``: big layers at a tiny batch and small layers at a big one: 2 x
    ``Linear(1536)`` on a batch of 2 (9 MB of weights each, memory-bound: casting them
    costs more than bf16 saves) and 2 x ``Linear(192)`` on a batch of 2048 (compute-bound)."""
    import torch
    from torch import nn

    class Split(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.big = nn.ModuleList(nn.Linear(1536, 1536) for _ in range(2))
            self.small = nn.ModuleList(nn.Linear(192, 192) for _ in range(2))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = self.big[1](torch.relu(self.big[0](x)))
            y = self.small[1](torch.relu(self.small[0](y)))
            return x, y

    return Split().to(device), (torch.rand(2, 1536, device=device), torch.rand(2048, 192, device=device))


#: model name -> builder of the held-out kinds (issue 27, helper autoshapes)
_KINDS: Final = {
    "heldout-resnet": _resnet,
    "heldout-depthwise": _depthwise,
    "heldout-conv1d": _conv1d,
    "heldout-lstm": lambda device: _recurrent("LSTM", device),
    "heldout-gru": lambda device: _recurrent("GRU", device),
    "heldout-functional": _functional,
    "heldout-vit": _vit,
    "heldout-split": _split,
}


def _decoder(sizes: tuple[int, ...], device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-decoder``: an ``nn.TransformerDecoder`` (self- and cross-attention) over a memory."""
    import torch
    from torch import nn

    layers, d, heads, ff, batch, tokens, memory_tokens = sizes

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerDecoderLayer(d, heads, dim_feedforward=ff, dropout=0.1, batch_first=True)
            self.decoder = nn.TransformerDecoder(layer, layers)

        def forward(self, memory: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.decoder(target, memory)  # the target last: the loss compares the output with it

    data = (torch.randn(batch, memory_tokens, d, device=device), torch.randn(batch, tokens, d, device=device))
    return Decoder().to(device), data


def build(name: str, device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    if name == "heldout-flip":
        return _flip(device)
    if name in _KINDS:
        return _KINDS[name](device)
    if name in _LATER:
        return _LATER[name](device)
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
    if name in _DECODERS:
        return _decoder(_DECODERS[name], device)
    if name == "seed":
        from ampcore._cli.experiment import SeedNet

        return SeedNet(2048).to(device), (torch.rand(512, 2048, device=device),)
    known = [*_MIXED, "heldout-conv", "heldout-flip", "heldout-tie", *_EMBEDDED, *_KINDS, *_LATER, *_TRANSFORMERS]
    known += [*_DECODERS, "seed"]
    raise SystemExit(f"unknown model {name!r}; valid: {', '.join(known)}")


def loss(out: Any, inputs: tuple[Any, ...]) -> Any:
    from torch import nn

    outs = out if isinstance(out, tuple) else (out,)
    targets = [i for i in inputs if i.is_floating_point()]  # token ids are no target
    targets = targets[len(targets) - len(outs) :]  # the last ones (an image is an input, not a target)
    return sum(nn.functional.mse_loss(o.float(), i) for o, i in zip(outs, targets, strict=True))
