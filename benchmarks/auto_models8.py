"""The held-out models of issue 27's eighth sweep for ``bench_auto.py`` (its docstring
describes each): kinds and uses the earlier sweeps' benchmarks did not have."""

from __future__ import annotations

from typing import Any, Final


def _scan(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-scan``: a Mamba/S4-like model: 2 blocks of input projections
    (``Linear(128, 256)``, gates ``Linear(128, 32)``), a selective scan over 64 time steps
    in a Python loop (``einsum``, ``cumsum``, ``exp``), an output ``Linear(128, 128)``, on
    8 x 64 x 128."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, d: int = 128, n: int = 32) -> None:
            super().__init__()
            self.inp, self.gate = nn.Linear(d, 2 * d), nn.Linear(d, n)
            self.b, self.c = nn.Linear(d, n), nn.Linear(d, n)
            self.a = nn.Parameter(-torch.rand(d, n))
            self.out = nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            u, z = self.inp(x).chunk(2, -1)
            delta = F.softplus(self.gate(x)).float().cumsum(1) * 0.01
            bx, cx = self.b(x).float(), self.c(x).float()
            state = torch.zeros(x.shape[0], x.shape[2], self.a.shape[1], device=x.device)
            ys = []
            for t in range(x.shape[1]):
                decay = torch.exp(torch.einsum("bn,dn->bdn", delta[:, t], self.a))
                state = decay * state + torch.einsum("bd,bn->bdn", u[:, t].float(), bx[:, t])
                ys.append(torch.einsum("bdn,bn->bd", state, cx[:, t]))
            return self.out(torch.stack(ys, 1) * torch.sigmoid(z.float()))

    class Scan(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(2))

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = x + block(x)
            return x

    x = torch.randn(8, 64, 128, device=device)
    return Scan().to(device), (x, torch.randn(8, 64, 128, device=device))


def _convnext(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-convnext``: a Swin/ConvNeXt-like stage: a stem ``Conv2d(3, 96, 4,
    stride=4)``, 2 ConvNeXt blocks (depthwise ``Conv2d(96, 96, 7, groups=96)``, LayerNorm
    over channels-last, ``Linear(96, 384)``, GELU, ``Linear(384, 96)``, layer scale) and 2
    shifted-window attention blocks (``roll``, 8 x 8 windows, 3 heads, ``Linear(96, 288)``,
    ``Linear(96, 96)``), on 8 x 3 x 128 x 128 images."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class ConvNeXtBlock(nn.Module):
        def __init__(self, c: int = 96) -> None:
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.norm = nn.LayerNorm(c)
            self.up, self.down = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
            self.gamma = nn.Parameter(torch.full((c,), 0.1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C)
            h = self.dw(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
            return x + self.down(F.gelu(self.up(self.norm(h)))) * self.gamma

    class Window(nn.Module):
        def __init__(self, shift: int, c: int = 96, heads: int = 3, size: int = 8) -> None:
            super().__init__()
            self.shift, self.heads, self.size = shift, heads, size
            self.norm = nn.LayerNorm(c)
            self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, h, w, c = x.shape
            s, k = self.size, self.heads
            y = torch.roll(self.norm(x), (-self.shift, -self.shift), (1, 2))
            win = y.reshape(b, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
            q, kk, v = self.qkv(win).reshape(-1, s * s, 3, k, c // k).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(q, kk, v).transpose(1, 2).reshape(-1, s * s, c)
            out = self.proj(att).reshape(b, h // s, w // s, s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
            return x + torch.roll(out, (self.shift, self.shift), (1, 2))

    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 96, 4, stride=4)
            self.blocks = nn.Sequential(ConvNeXtBlock(), ConvNeXtBlock(), Window(0), Window(4))

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.blocks(self.stem(x).permute(0, 2, 3, 1))

    x = torch.randn(8, 3, 128, 128, device=device)
    return Stage().to(device), (x, torch.randn(8, 32, 32, 96, device=device))


def _clip(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-clip``: a CLIP-like pair of towers called as two roots in one region (the
    pair itself is never called as a module): an image tower (``Linear(768, 1024)``, GELU,
    ``Linear(1024, 512)``) on 256 patch-pooled images and a text tower (``Embedding(4096,
    256)`` mean-pooled over 32 tokens, ``Linear(256, 512)``, GELU, ``Linear(512, 512)``) on
    256 captions, ``F.normalize``, a learned logit scale; the 256 x 256 logits compared with a
    target."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Text(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(4096, 256)
            self.body = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 512))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return F.normalize(self.body(self.embed(ids).mean(1)), dim=-1)

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.image = nn.Sequential(nn.Linear(768, 1024), nn.GELU(), nn.Linear(1024, 512))
            self.text = Text()
            self.scale = nn.Parameter(torch.tensor(2.6))

        def __call__(self, images: torch.Tensor, ids: torch.Tensor, target: torch.Tensor) -> Any:  # two roots
            a = F.normalize(self.image(images), dim=-1)
            return self.scale.exp() * a @ self.text(ids).t()

    images, ids = torch.randn(256, 768, device=device), torch.randint(0, 4096, (256, 32), device=device)
    return Pair().to(device), (images, ids, torch.randn(256, 256, device=device))


#: model name -> builder (the eighth sweep of issue 27)
SWEEP8: Final = {
    "heldout-scan": _scan,
    "heldout-convnext": _convnext,
    "heldout-clip": _clip,
}
