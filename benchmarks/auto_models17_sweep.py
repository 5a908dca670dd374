"""The held-out models of issue 27's twelfth sweep for ``bench_auto.py`` (its docstring names
each): training setups the earlier sweeps' benchmarks did not have."""

from __future__ import annotations

from typing import Any, Final


def _moco(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-moco``: MoCo: a query encoder (``Linear(256, 1024)``, ``Linear(1024, 1024)``,
    ``Linear(1024, 128)``), a key encoder of the same layers with frozen parameters updated
    by momentum inside ``forward`` (an EMA under ``torch.no_grad``), a queue of 4096 keys (a
    buffer) written in place; InfoNCE over 256 samples (1 + 4096 logits each)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def encoder() -> nn.Module:
        return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 128))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k = encoder(), encoder()
            self.k.load_state_dict(self.q.state_dict())
            self.k.requires_grad_(False)
            self.register_buffer("queue", F.normalize(torch.randn(4096, 128), dim=1))
            self.ptr = 0

        def forward(self, a: torch.Tensor, b: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            q = F.normalize(self.q(a).float(), dim=1)
            with torch.no_grad():
                for pk, pq in zip(self.k.parameters(), self.q.parameters(), strict=True):
                    pk.mul_(0.999).add_(pq.detach(), alpha=0.001)
                k = F.normalize(self.k(b).float(), dim=1)
            logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().t()], 1) / 0.07
            with torch.no_grad():
                self.queue[self.ptr : self.ptr + k.shape[0]] = k
                self.ptr = (self.ptr + k.shape[0]) % self.queue.shape[0]
            return F.cross_entropy(logits, torch.zeros(a.shape[0], dtype=torch.long, device=a.device))

    a = torch.randn(256, 256, device=device)
    return Net().to(device), (a, a + 0.1 * torch.randn(256, 256, device=device), torch.zeros((), device=device))


def _reentrant(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-reentrant``: 4 pre-norm residual MLP blocks (``LayerNorm``, ``Linear(384,
    1536)``, GELU, ``Linear(1536, 384)``), each run by ``torch.utils.checkpoint(...,
    use_reentrant=True)`` (recomputed in backward without module hooks), a ``Linear(384,
    10)`` head; 64 x 32 tokens of 384 features."""
    import torch
    import torch.utils.checkpoint
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(384)
            self.mlp = nn.Sequential(nn.Linear(384, 1536), nn.GELU(), nn.Linear(1536, 384))

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + self.mlp(self.norm(h))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(4))
            self.head = nn.Linear(384, 10)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            h = x
            for block in self.blocks:
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=True)
            return self.head(h)

    x = torch.randn(64, 32, 384, device=device, requires_grad=True)
    return Net().to(device), (x, torch.randn(64, 32, 10, device=device))


def _normed(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-normed``: a discriminator-style MLP with parametrizations: weight norm on
    ``Linear(512, 1024)``, spectral norm (a power iteration buffer) on ``Linear(1024,
    1024)`` twice, a plain ``Linear(1024, 1)``, LeakyReLU; the forward inside
    ``parametrize.cached()``; a batch of 512."""
    import torch
    from torch import nn
    from torch.nn import functional as F
    from torch.nn.utils import parametrizations, parametrize

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = parametrizations.weight_norm(nn.Linear(512, 1024))
            self.b = parametrizations.spectral_norm(nn.Linear(1024, 1024))
            self.c = parametrizations.spectral_norm(nn.Linear(1024, 1024))
            self.out = nn.Linear(1024, 1)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            with parametrize.cached():
                h = F.leaky_relu(self.a(x), 0.2)
                h = F.leaky_relu(self.b(h), 0.2)
                return self.out(F.leaky_relu(self.c(h), 0.2))

    return Net().to(device), (torch.randn(512, 512, device=device), torch.randn(512, 1, device=device))


#: model name -> builder (the twelfth sweep of issue 27)
SWEEP17: Final = {
    "heldout-moco": _moco,
    "heldout-reentrant": _reentrant,
    "heldout-normed": _normed,
}
