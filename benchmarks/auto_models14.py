"""The held-out models of issue 27's fourteenth stop for ``bench_auto.py``: weights used
more than once in one call (a torch.autocast step casts each once: autocast's cache)."""

from __future__ import annotations

from typing import Any, Final


def _albert(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-albert``: ALBERT-like shared layers: one pre-norm block (LayerNorm(256),
    ``Linear(256, 1024)``, GELU, ``Linear(1024, 256)``) applied 6 times, on 16 x 32 x 256."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Shared(nn.Module):
        def __init__(self, d: int = 256, depth: int = 6) -> None:
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.depth = depth

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            for _ in range(self.depth):
                x = x + self.down(F.gelu(self.up(self.norm(x))))
            return x

    return Shared().to(device), (torch.randn(16, 32, 256, device=device), torch.randn(16, 32, 256, device=device))


def _cell(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-cell``: a recurrent cell stepped 64 times at a small batch (decoding-like):
    ``Embedding(2000, 256)``, a GRU-like cell of ``Linear(512, 768)`` on batch 8, the head
    tied to the embedding (its weight used again: ``h @ embed.weight.t()``); targets 8 x 2000
    logits of the last step."""
    import torch
    from torch import nn

    class Cell(nn.Module):
        def __init__(self, vocab: int = 2000, d: int = 256) -> None:
            super().__init__()
            self.embed, self.gates = nn.Embedding(vocab, d), nn.Linear(2 * d, 3 * d)

        def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            h = torch.zeros_like(x[:, 0])
            for t in range(ids.shape[1]):
                z, r, n = self.gates(torch.cat([x[:, t], h], -1)).float().chunk(3, -1)
                h = torch.sigmoid(z) * h + (1 - torch.sigmoid(z)) * torch.tanh(n * torch.sigmoid(r))
            return h @ self.embed.weight.t()

    ids = torch.randint(0, 2000, (8, 64), device=device)
    return Cell().to(device), (ids, torch.randn(8, 2000, device=device))


#: model name -> builder (the fourteenth stop of issue 27)
SWEEP14: Final = {"heldout-albert": _albert, "heldout-cell": _cell}
