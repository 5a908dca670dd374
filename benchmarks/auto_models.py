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


def build(name: str, device: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

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
    raise SystemExit(f"unknown model {name!r}; valid: {', '.join([*_MIXED, 'heldout-conv', *_TRANSFORMERS, 'seed'])}")


def loss(out: Any, inputs: tuple[Any, ...]) -> Any:
    from torch import nn

    outs = out if isinstance(out, tuple) else (out,)
    return sum(nn.functional.mse_loss(o.float(), i) for o, i in zip(outs, inputs, strict=True))
