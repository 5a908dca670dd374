"""The held-out models of issue 27's tenth sweep for ``bench_auto.py`` (its docstring
describes each): kinds the earlier sweeps' benchmarks did not have."""

from __future__ import annotations

import math
from typing import Any, Final


def _switch(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-switch``: a Switch mixture of experts: a ``Linear(256, 8)`` router, top-1
    with a capacity of 160 tokens per expert (the rest passed through), dispatched by
    ``scatter`` into an 8 x 160 x 256 buffer, the experts one ``(8, 256, 1024)`` and one
    ``(8, 1024, 256)`` parameter run by ``torch.bmm``, combined by ``gather``; two such
    layers and a ``Linear(256, 256)`` head on 1024 tokens."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Switch(nn.Module):
        def __init__(self, d: int = 256, experts: int = 8, capacity: int = 160) -> None:
            super().__init__()
            self.router = nn.Linear(d, experts)
            self.w1 = nn.Parameter(torch.randn(experts, d, 4 * d) / math.sqrt(d))
            self.w2 = nn.Parameter(torch.randn(experts, 4 * d, d) / math.sqrt(4 * d))
            self.capacity = capacity

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e, c = self.w1.shape[0], self.capacity
            gate, expert = torch.softmax(self.router(x).float(), -1).max(-1)
            onehot = F.one_hot(expert, e)
            slot = (onehot.cumsum(0) * onehot).sum(-1) - 1
            kept = slot < c
            index = (expert * c + slot.clamp(max=c - 1))[kept][:, None].expand(-1, x.shape[1])
            buf = x.new_zeros(e * c, x.shape[1]).scatter(0, index, x[kept]).view(e, c, -1)
            h = torch.bmm(F.gelu(torch.bmm(buf, self.w1.to(buf.dtype))), self.w2.to(buf.dtype)).flatten(0, 1)
            y = x.clone()
            y[kept] = (torch.gather(h, 0, index) * gate[kept, None].to(h.dtype)).to(x.dtype)
            return y

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Switch() for _ in range(2))
            self.head = nn.Linear(256, 256)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = x + layer(x)
            return self.head(x)

    x = torch.randn(1024, 256, device=device)
    return Net().to(device), (x, torch.randn(1024, 256, device=device))


def _selective(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-selective``: a Mamba-like selective scan: ``Linear(128, 512)`` in, a causal
    depthwise ``Conv1d(256, 256, 4)``, input-dependent step sizes and B / C
    (``Linear(256, 33)``, ``Linear(1, 256)``, ``softplus``), a float32 recurrence over 32
    steps of state 16, a gated ``Linear(256, 128)`` out; two layers on 8 x 32 x 128."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Layer(nn.Module):
        def __init__(self, d: int = 128, inner: int = 256, state: int = 16) -> None:
            super().__init__()
            self.inp = nn.Linear(d, 2 * inner)
            self.conv = nn.Conv1d(inner, inner, 4, groups=inner, padding=3)
            self.xproj, self.dt = nn.Linear(inner, 2 * state + 1), nn.Linear(1, inner)
            self.a_log = nn.Parameter(torch.log(torch.arange(1, state + 1).float()).repeat(inner, 1))
            self.out = nn.Linear(inner, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t, n = x.shape[1], self.a_log.shape[1]
            u, z = self.inp(x).chunk(2, -1)
            u = F.silu(self.conv(u.transpose(1, 2))[..., :t].transpose(1, 2))
            dt_in, b, c = self.xproj(u).split([1, n, n], -1)
            dt, a = F.softplus(self.dt(dt_in)).float(), -self.a_log.exp()
            h = u.new_zeros(u.shape[0], u.shape[2], n, dtype=torch.float32)
            ys = []
            for s in range(t):
                step = dt[:, s, :, None]
                h = torch.exp(step * a) * h + step * b[:, s, None, :].float() * u[:, s, :, None]
                ys.append((h * c[:, s, None, :].float()).sum(-1))
            return x + self.out((torch.stack(ys, 1) * F.silu(z.float())).to(z.dtype))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(Layer(), Layer())

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.layers(x)

    x = torch.randn(8, 32, 128, device=device)
    return Net().to(device), (x, torch.randn(8, 32, 128, device=device))


def _warp(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-warp``: a spatial transformer: a localisation net (two strided 3 x 3
    convolutions, ``Linear(512, 6)``) predicts the affine map ``F.affine_grid`` +
    ``F.grid_sample`` resample 16 x 3 x 64 x 64 images by, then four 3 x 3 convolutions
    (32 to 64 channels) and a ``Linear(64, 64)`` head."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class STN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.loc = nn.Sequential(
                nn.Conv2d(3, 16, 3, stride=4, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=4, padding=1),
                nn.ReLU(), nn.Flatten(), nn.Linear(512, 6),
            )  # fmt: skip
            nn.init.zeros_(self.loc[5].weight)
            with torch.no_grad():
                self.loc[5].bias.copy_(torch.tensor([1.0, 0.1, 0.0, -0.1, 1.0, 0.0]))
            self.body = nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
            )  # fmt: skip
            self.head = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            theta = self.loc(x).float().view(-1, 2, 3)
            grid = F.affine_grid(theta, list(x.shape), align_corners=False).to(x.dtype)
            return self.head(self.body(F.grid_sample(x, grid, align_corners=False)).mean((2, 3)))

    x = torch.randn(16, 3, 64, 64, device=device)
    return STN().to(device), (x, torch.randn(16, 64, device=device))


#: model name -> builder (the tenth sweep of issue 27)
SWEEP15: Final = {
    "heldout-switch": _switch,
    "heldout-selective": _selective,
    "heldout-warp": _warp,
}
