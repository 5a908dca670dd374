"""The held-out models of issue 27's ninth sweep for ``bench_auto.py`` (its docstring
describes each): kinds the earlier sweeps' benchmarks did not have."""

from __future__ import annotations

import math
from typing import Any, Final


def _diffusion(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-diffusion``: a diffusion U-Net: a sinusoidal timestep embedding and its MLP
    (``Linear(64, 256)``, SiLU, ``Linear(256, 256)``), GroupNorm(8) res blocks of 3 x 3
    convolutions (32 and 64 channels) each adding a ``Linear(256, C)`` of the embedding, an
    attention block at 16 x 16 (``F.scaled_dot_product_attention``, 1 x 1 conv projections),
    an upsampled path concatenated with the skip; noise predicted for 4 x 3 x 32 x 32."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Res(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.t = nn.Linear(256, cout)
            self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
            h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
            return self.skip(x) + self.c2(F.silu(self.n2(h)))

    class Attn(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.norm, self.qkv, self.proj = nn.GroupNorm(8, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, c, hh, ww = x.shape
            q, k, v = self.qkv(self.norm(x)).reshape(b, 3, 4, c // 4, hh * ww).transpose(-1, -2).unbind(1)
            y = F.scaled_dot_product_attention(q, k, v).transpose(-1, -2).reshape(b, c, hh, ww)
            return x + self.proj(y)

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.temb = nn.Sequential(nn.Linear(64, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU())
            self.stem = nn.Conv2d(3, 32, 3, padding=1)
            self.down, self.mid, self.attn = Res(32, 32), Res(32, 64), Attn(64)
            self.up = Res(96, 32)
            self.out = nn.Sequential(nn.GroupNorm(8, 32), nn.SiLU(), nn.Conv2d(32, 3, 3, padding=1))

        def forward(self, x: torch.Tensor, t: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            freqs = torch.exp(-math.log(10000.0) * torch.arange(32, device=x.device) / 32)
            args = t[:, None].float() * freqs[None]
            temb = self.temb(torch.cat([args.sin(), args.cos()], -1))
            skip = self.down(self.stem(x), temb)
            h = self.attn(self.mid(F.avg_pool2d(skip, 2), temb))
            h = torch.cat([F.interpolate(h, scale_factor=2.0).to(skip.dtype), skip], 1)
            return self.out(self.up(h, temb))

    x, t = torch.randn(4, 3, 32, 32, device=device), torch.randint(0, 1000, (4,), device=device)
    return UNet().to(device), (x, t, torch.randn(4, 3, 32, 32, device=device))


def _gat(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-gat``: a 2-layer graph attention net on 2,048 nodes and 8,192 edges
    (``Linear(128, 128)`` per layer, edge scores by ``index_select`` of both ends and a
    ``Linear(256, 1)``, a softmax over each node's incoming edges by ``scatter_add``,
    messages summed by ``index_add``), a ``Linear(128, 64)`` head."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Layer(nn.Module):
        def __init__(self, d: int = 128) -> None:
            super().__init__()
            self.lin, self.att = nn.Linear(d, d), nn.Linear(2 * d, 1)

        def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
            h = self.lin(x)
            e = F.leaky_relu(self.att(torch.cat([h.index_select(0, src), h.index_select(0, dst)], -1))).squeeze(-1)
            w = (e - e.max()).exp()
            denom = torch.zeros(x.shape[0], dtype=w.dtype, device=x.device).scatter_add(0, dst, w)
            msg = h.index_select(0, src) * (w / denom.index_select(0, dst)).unsqueeze(-1)
            return F.elu(msg.new_zeros(h.shape).index_add(0, dst, msg))

    class GAT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(2))
            self.head = nn.Linear(128, 64)

        def forward(self, x: torch.Tensor, edges: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x, edges[0], edges[1])
            return self.head(x)

    x, edges = torch.randn(2048, 128, device=device), torch.randint(0, 2048, (2, 8192), device=device)
    return GAT().to(device), (x, edges, torch.randn(2048, 64, device=device))


def _sdpa(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-sdpa``: a 2-layer causal decoder of its own blocks (``nn.RMSNorm``,
    ``Linear(256, 768)`` q/k/v, ``F.scaled_dot_product_attention(is_causal=True)``, 4
    heads, ``Linear(256, 256)``, a SwiGLU of ``Linear(256, 768)`` x 2 and
    ``Linear(768, 256)``) on 2 x 128 x 256."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, d: int = 256) -> None:
            super().__init__()
            self.n1, self.qkv, self.o = nn.RMSNorm(d), nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.n2 = nn.RMSNorm(d)
            self.gate, self.up = nn.Linear(d, 768, bias=False), nn.Linear(d, 768, bias=False)
            self.down = nn.Linear(768, d, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.n1(x)).reshape(b, t, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.o(y)
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(2))

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    x = torch.randn(2, 128, 256, device=device)
    return Decoder().to(device), (x, torch.randn(2, 128, 256, device=device))


#: model name -> builder (the ninth sweep of issue 27)
SWEEP9: Final = {
    "heldout-diffusion": _diffusion,
    "heldout-gat": _gat,
    "heldout-sdpa": _sdpa,
}
