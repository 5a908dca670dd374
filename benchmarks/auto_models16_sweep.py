"""The held-out models of issue 27's eleventh sweep for ``bench_auto.py`` (its docstring
names each): kinds the earlier sweeps' benchmarks did not have."""

from __future__ import annotations

import math
from typing import Any, Final


def _film(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-film``: a denoising U-Net conditioned by FiLM: a sin/cos embedding of per
    sample timesteps through ``Linear(64, 256)`` + ``Linear(256, 128)`` scales and shifts the
    features; 3 x 3 convolutions 3 -> 32 -> 64 (stride 2) -> 64, up by bilinear
    ``F.interpolate`` and by ``F.pixel_shuffle`` (a ``Conv2d(64, 128, 1)``), skips
    concatenated, ``GroupNorm``; 8 x 3 x 64 x 64 images, the noise the target."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.time = nn.Sequential(nn.Linear(64, 256), nn.SiLU(), nn.Linear(256, 128))
            self.down1, self.norm1 = nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32)
            self.down2 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
            self.mid, self.norm2 = nn.Conv2d(64, 64, 3, padding=1), nn.GroupNorm(8, 64)
            self.shuffle = nn.Conv2d(64, 128, 1)
            self.up = nn.Conv2d(64 + 32 + 32, 32, 3, padding=1)
            self.head = nn.Conv2d(32, 3, 1)

        def forward(self, x: torch.Tensor, t: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            freqs = torch.exp(-math.log(10000.0) * torch.arange(32, device=x.device) / 32)
            angles = t.float()[:, None] * freqs[None]
            scale, shift = self.time(torch.cat([angles.sin(), angles.cos()], -1)).chunk(2, -1)
            s1 = F.silu(self.norm1(self.down1(x)))
            h = F.silu(self.down2(s1))
            h = F.silu(self.norm2(self.mid(h)) * (1 + scale[:, :, None, None]) + shift[:, :, None, None])
            up = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
            shuffled = F.pixel_shuffle(self.shuffle(h), 2)
            return self.head(F.silu(self.up(torch.cat([up, shuffled, s1], 1))))

    x = torch.randn(8, 3, 64, 64, device=device)
    t = torch.randint(0, 1000, (8,), device=device)
    return Net().to(device), (x, t, torch.randn(8, 3, 64, 64, device=device))


def _ntxent(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-ntxent``: SimCLR: two views of 256 samples through an encoder
    (``Linear(128, 1024)``, ``Linear(1024, 1024)``) and a ``Linear(1024, 128)`` projection,
    the NT-Xent loss over the 512 x 512 cosine similarities (diagonal masked with ``-inf``,
    a learned temperature); the loss (a scalar) against a zero target."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(128, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU())
            self.proj = nn.Linear(1024, 128)
            self.log_t = nn.Parameter(torch.tensor(math.log(0.1)))

        def forward(self, a: torch.Tensor, b: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            z = F.normalize(self.proj(self.enc(torch.cat([a, b]))).float(), dim=-1)
            n = a.shape[0]
            logits = (z @ z.t()) / self.log_t.exp().clamp(min=0.01)
            logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
            labels = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z.device)
            return F.cross_entropy(logits, labels)

    a = torch.randn(256, 128, device=device)
    b = a + 0.1 * torch.randn(256, 128, device=device)
    return Net().to(device), (a, b, torch.zeros((), device=device))


def _fno(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-fno``: a 1-d Fourier neural operator: ``Linear(16, 64)`` lift, four layers of
    ``rfft`` -> the lowest 24 modes mixed by complex ``(64, 64, 24)`` weights (``einsum``) ->
    ``irfft`` plus a ``Conv1d(64, 64, 1)`` skip, GELU; ``Linear(64, 256)`` + ``Linear(256, 1)``
    out; 32 functions on a 512-point grid."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Layer(nn.Module):
        def __init__(self, c: int = 64, modes: int = 24) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(c, c, modes, 2) / c)
            self.skip = nn.Conv1d(c, c, 1)
            self.modes = modes

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            spec = torch.fft.rfft(h.float())
            mixed = torch.einsum("bix,iox->box", spec[..., : self.modes], torch.view_as_complex(self.w))
            full = torch.cat([mixed, spec.new_zeros(*mixed.shape[:2], spec.shape[-1] - self.modes)], -1)
            return F.gelu(torch.fft.irfft(full, n=h.shape[-1]) + self.skip(h))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lift = nn.Linear(16, 64)
            self.layers = nn.Sequential(*(Layer() for _ in range(4)))
            self.out = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 1))

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.out(self.layers(self.lift(x).transpose(1, 2)).transpose(1, 2))

    x = torch.randn(32, 512, 16, device=device)
    return Net().to(device), (x, torch.randn(32, 512, 1, device=device))


#: model name -> builder (the eleventh sweep of issue 27)
SWEEP16: Final = {
    "heldout-film": _film,
    "heldout-ntxent": _ntxent,
    "heldout-fno": _fno,
}
