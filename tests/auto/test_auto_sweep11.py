"""Issue 27, eleventh held-out sweep of ``level="auto"``: model kinds the earlier sweeps
(``test_auto_sweep*.py``) did not try; the uses are in ``test_auto_sweep11_uses.py``, the
damaged caches in ``test_auto_sweep11_cache.py``.

* a U-Net upsampling by ``F.interpolate`` (bilinear and nearest) and ``F.pixel_shuffle``,
  with skip concatenations of mixed dtypes;
* a denoiser conditioned by FiLM (scale and shift from a sin/cos timestep embedding, per
  sample integer timesteps, ``GroupNorm``);
* an NT-Xent contrastive loss inside the root (a 128 x 128 logit matrix, the diagonal
  masked with ``-inf``, a learned temperature);
* a Perceiver whose learned latents cross-attend by ``nn.MultiheadAttention``, then a
  ``TransformerEncoderLayer`` over the latents;
* early exit chosen by the data (``.item()`` of a confidence breaks the loop: depth varies
  between steps);
* multi-task heads returning a dict of losses (and an accuracy);
* capsules with dynamic routing by agreement (``einsum``, iterated softmax);
* a Fourier neural operator layer (``rfft`` / ``irfft``, complex weights by
  ``view_as_complex``, a complex ``einsum``);
* a Gaussian-process head: ``cdist``, ``linalg.cholesky``, ``cholesky_solve``,
  ``linalg.solve``, ``slogdet`` and ``pinverse`` inside the root (ops autocast runs in
  float32 on purpose);
* a VQ-VAE (``cdist`` + ``argmin`` codebook lookup, straight-through estimator, commitment
  loss), a mixture density network by ``torch.distributions``, a hard Gumbel-softmax;
* a PointNet (``Conv1d`` k=1, a predicted 3 x 3 transform by ``bmm``, ``amax`` pooling), a
  linear-chain CRF (``logsumexp`` recursion, indexed transitions), an RK4 neural ODE (one
  module called 12 times per step), DeepSets by ``scatter_reduce`` (``amax`` and ``mean``);
* int8 inputs and uint8 / bool masks (``where``, ``masked_fill``, ``masked_select``);
* buffers updated in forward: an int64 step counter choosing the head and a
  non-persistent running mean.

Each case is compared step by step with the fixed precision its plan gives
(``test_auto_sweep3.run``: outputs, gradients, parameters equal; nothing of auto left;
settled, no recording), with measured plans (a fake clock) and given plans, and in float16
regions with given plans; plus lazy modules initialised inside the region and a layer made
anew in every call.  No wall clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributions as D
import torch.nn.functional as F
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, FP16, Enter, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class UNetInterp(nn.Module):
    """Down by a strided conv, up by bilinear ``interpolate`` and by ``pixel_shuffle``, a
    nearest-upsampled pooled branch, skips concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.down1 = nn.Conv2d(3, 8, 3, padding=1)
        self.down2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.up = nn.Conv2d(16 + 8, 8, 3, padding=1)
        self.mid = nn.Conv2d(16, 32, 1)
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = F.relu(self.down1(x))
        s2 = F.relu(self.down2(s1))
        u = F.interpolate(s2, scale_factor=2, mode="bilinear", align_corners=False)
        h = F.relu(self.up(torch.cat([u, s1], 1)))
        p = F.pixel_shuffle(self.mid(s2), 2)
        n = F.interpolate(F.avg_pool2d(h, 2), size=h.shape[-2:], mode="nearest")
        return self.head(torch.cat([h + n, p], 1))


class FiLM(nn.Module):
    """A denoiser: features scaled and shifted by an MLP of a sin/cos timestep embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.time = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16))
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(-math.log(10000.0) * torch.arange(8, dtype=torch.float32) / 8)
        angles = t.float()[:, None] * freqs[None]
        scale, shift = self.time(torch.cat([angles.sin(), angles.cos()], -1)).chunk(2, -1)
        h = self.norm(self.conv1(x)) * (1 + scale[:, :, None, None]) + shift[:, :, None, None]
        return self.head(F.silu(self.conv2(F.silu(h))))


class SimCLR(nn.Module):
    """Two views encoded together; the NT-Xent loss over their 2n x 2n similarities."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.proj = nn.Linear(32, 16)
        self.log_t = nn.Parameter(torch.tensor(math.log(0.1)))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = F.normalize(self.proj(self.enc(torch.cat([a, b]))).float(), dim=-1)
        n = a.shape[0]
        logits = (z @ z.t()) / self.log_t.exp().clamp(min=0.01)
        logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
        target = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
        return F.cross_entropy(logits, target), logits.detach()


class PerceiverMHA(nn.Module):
    """Learned latents cross-attend to the inputs (``nn.MultiheadAttention``), then
    self-attend (``nn.TransformerEncoderLayer``)."""

    def __init__(self) -> None:
        super().__init__()
        self.latents = nn.Parameter(torch.randn(4, 32))
        self.inp = nn.Linear(16, 32)
        self.cross = nn.MultiheadAttention(32, 2, batch_first=True)
        self.latent = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kv = self.inp(x)
        q = self.latents.expand(x.shape[0], -1, -1).to(kv.dtype)
        z, _ = self.cross(q, kv, kv, need_weights=False)
        return self.head(self.latent(z + q).mean(1))


class EarlyExit(nn.Module):
    """Residual blocks, each with an exit head; the loop stops where the batch's mean
    confidence passes 0.5 (read by ``.item()``: the depth is chosen by the data)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.exits = nn.ModuleList(nn.Linear(32, 4) for _ in range(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        h = F.relu(self.stem(x))
        out, depth = h, 0
        for depth, (block, exit_) in enumerate(zip(self.blocks, self.exits, strict=True), 1):  # noqa: B007
            h = F.relu(block(h)) + h
            out = exit_(h)
            if out.float().softmax(-1).amax(-1).mean().item() > 0.5:
                break
        return out, depth


class MultiTask(nn.Module):
    """A shared trunk, classification / regression / segmentation heads, a dict of losses."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.cls, self.reg, self.seg = nn.Linear(16, 5), nn.Linear(16, 2), nn.Conv2d(16, 3, 1)

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor, boxes: torch.Tensor, masks: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        h = self.trunk(x)
        pooled = h.mean((2, 3))
        logits = self.cls(pooled)
        return {
            "cls": F.cross_entropy(logits, labels),
            "reg": F.smooth_l1_loss(self.reg(pooled).float(), boxes),
            "seg": F.cross_entropy(self.seg(h), masks),
            "acc": (logits.argmax(-1) == labels).float().mean(),
        }


def _squash(s: torch.Tensor) -> torch.Tensor:
    n2 = s.float().pow(2).sum(-1, keepdim=True)
    return (n2 / (1 + n2) * s / (n2 + 1e-8).sqrt()).to(s.dtype)


class Capsules(nn.Module):
    """Primary capsules, votes by ``einsum``, three iterations of routing by agreement."""

    def __init__(self) -> None:
        super().__init__()
        self.primary = nn.Linear(16, 8 * 4)
        self.w = nn.Parameter(torch.randn(8, 3, 6, 4) * 0.3)
        self.head = nn.Linear(3 * 6, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = _squash(self.primary(x).view(-1, 8, 4))
        votes = torch.einsum("iodk,bik->biod", self.w, u)
        logits = votes.new_zeros(votes.shape[:3], dtype=torch.float32)
        for _ in range(3):
            c = logits.softmax(2)
            v = _squash((c[..., None] * votes).sum(1))
            logits = logits + (votes.detach() * v[:, None].detach()).sum(-1).float()
        return self.head(v.flatten(1)), v.float().norm(dim=-1)


class Spectral(nn.Module):
    """A Fourier neural operator layer: the lowest 4 modes mixed by complex weights."""

    def __init__(self) -> None:
        super().__init__()
        self.lift = nn.Linear(16, 8)
        self.w = nn.Parameter(torch.randn(8, 8, 4, 2) * 0.2)
        self.skip = nn.Conv1d(8, 8, 1)
        self.proj = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lift(x).transpose(1, 2)
        spec = torch.fft.rfft(h.float())
        mixed = torch.einsum("bix,iox->box", spec[..., :4], torch.view_as_complex(self.w))
        full = torch.cat([mixed, spec.new_zeros(*mixed.shape[:2], spec.shape[-1] - 4)], -1)
        back = torch.fft.irfft(full, n=h.shape[-1])
        return self.proj(F.gelu(back + self.skip(h)).transpose(1, 2))


class GPHead(nn.Module):
    """Features into an RBF kernel; the marginal likelihood by Cholesky, plus ``solve``,
    ``slogdet`` and ``pinverse`` terms."""

    def __init__(self) -> None:
        super().__init__()
        self.feat = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
        self.log_ls = nn.Parameter(torch.zeros(()))
        self.log_noise = nn.Parameter(torch.tensor(-2.0))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.feat(x)
        d = torch.cdist(z, z)
        k = torch.exp(-0.5 * d.float().pow(2) / self.log_ls.exp() ** 2)
        k = k + (self.log_noise.exp() + 1e-2) * torch.eye(x.shape[0])
        chol = torch.linalg.cholesky(k)
        alpha = torch.cholesky_solve(y[:, None], chol)
        nll = 0.5 * (y[:, None] * alpha).sum() + torch.log(torch.diagonal(chol)).sum()
        sign, logdet = torch.linalg.slogdet(k)
        extra = torch.linalg.solve(k, y).pow(2).mean() + torch.pinverse(z).float().pow(2).mean()
        return nll + 0.01 * extra, sign * logdet


class VQ(nn.Module):
    """A VQ-VAE bottleneck: nearest code by ``cdist`` + ``argmin``, straight-through."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.codebook = nn.Embedding(12, 8)
        self.dec = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = self.enc(x)
        idx = torch.cdist(z.float(), self.codebook.weight).argmin(-1)
        q = self.codebook(idx)
        vq_loss = F.mse_loss(q, z.float().detach()) + 0.25 * F.mse_loss(z.float(), q.detach())
        recon = self.dec(z + (q.to(z.dtype) - z).detach())
        return recon, vq_loss, idx


class MDN(nn.Module):
    """A mixture density network: ``MixtureSameFamily(Categorical, Normal).log_prob``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
        self.pi, self.mu, self.sigma = nn.Linear(32, 3), nn.Linear(32, 3), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        mix = D.Categorical(logits=self.pi(h).float())
        comp = D.Normal(self.mu(h).float(), F.softplus(self.sigma(h).float()) + 1e-3)
        return -D.MixtureSameFamily(mix, comp).log_prob(y).mean()


class Gumbel(nn.Module):
    """A hard Gumbel-softmax choice of one of 6 learned vectors."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Linear(16, 6)
        self.table = nn.Parameter(torch.randn(6, 32))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        onehot = F.gumbel_softmax(self.logits(x).float(), tau=0.5, hard=True)
        return self.head(onehot @ self.table)


class PointNet(nn.Module):
    """A T-net predicts a 3 x 3 transform applied by ``bmm``; shared ``Conv1d`` k=1 features
    max-pooled over points."""

    def __init__(self) -> None:
        super().__init__()
        self.tnet = nn.Sequential(nn.Conv1d(3, 16, 1), nn.ReLU(), nn.Conv1d(16, 32, 1))
        self.tfc = nn.Linear(32, 9)
        self.feat = nn.Sequential(nn.Conv1d(3, 16, 1), nn.ReLU(), nn.Conv1d(16, 32, 1))
        self.head = nn.Linear(32, 4)

    def forward(self, pts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.tfc(self.tnet(pts).amax(-1)).view(-1, 3, 3) + torch.eye(3)
        moved = torch.bmm(t, pts)
        return self.head(self.feat(moved).amax(-1)), t


class CRF(nn.Module):
    """Emissions from an embedding + MLP, the CRF's negative log-likelihood."""

    def __init__(self) -> None:
        super().__init__()
        self.emit = nn.Sequential(nn.Embedding(30, 16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
        self.trans = nn.Parameter(torch.randn(5, 5) * 0.1)

    def forward(self, ids: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        e = self.emit(ids).float()
        alpha = e[:, 0]
        for t in range(1, ids.shape[1]):
            alpha = torch.logsumexp(alpha[:, :, None] + self.trans + e[:, t, None, :], 1)
        gold = e.gather(2, tags[..., None]).squeeze(-1).sum(1) + self.trans[tags[:, :-1], tags[:, 1:]].sum(1)
        return (torch.logsumexp(alpha, -1) - gold).mean()


class ODE(nn.Module):
    """Three RK4 steps of a learned vector field (the field module called 12 times)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = 0.25
        for _ in range(3):
            k1 = self.f(x)
            k2 = self.f(x + h / 2 * k1)
            k3 = self.f(x + h / 2 * k2)
            k4 = self.f(x + h * k3)
            x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return self.head(x)


class DeepSets(nn.Module):
    """Elements embedded, pooled per set by ``scatter_reduce`` (max and mean), then decoded."""

    def __init__(self) -> None:
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.rho = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor, sets: torch.Tensor, count: int) -> torch.Tensor:
        h = self.phi(x)
        index = sets[:, None].expand_as(h)
        top = h.new_zeros(count, h.shape[1]).scatter_reduce(0, index, h, "amax", include_self=False)
        mean = h.new_zeros(count, h.shape[1]).scatter_reduce(0, index, h, "mean", include_self=False)
        return self.rho(top + mean)


class Masks(nn.Module):
    """int8 features, a uint8 keep mask (``where``) and a bool padding mask (``masked_fill``,
    ``masked_select``)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, q8: torch.Tensor, keep: torch.Tensor, pad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(q8.float() / 127)
        h = torch.where(keep.bool()[..., None], h, torch.zeros((), dtype=h.dtype))
        h = h.masked_fill(pad[..., None], 0.0)
        kept = torch.masked_select(h, ~pad[..., None].expand_as(h))
        return self.out(h.mean(1)), kept.float().sum()


class Counter(nn.Module):
    """An int64 step counter (a buffer, incremented in training) picks one of two heads; a
    non-persistent running mean of the inputs centres them."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.odd, self.even = nn.Linear(32, 4), nn.Linear(32, 4)
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.register_buffer("mean", torch.zeros(16), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.training:
            self.count += 1
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        h = self.body(x - self.mean)
        out = self.odd(h) if int(self.count) % 2 else self.even(h)
        return out, self.count.clone(), self.mean.clone()


class Lazy(nn.Module):
    """Lazy modules (``LazyLinear``, ``LazyConv2d``, ``LazyBatchNorm2d``): their parameters
    take their shapes at the first call, inside the region."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.LazyConv2d(8, 3, padding=1), nn.LazyBatchNorm2d(), nn.ReLU())
        self.fc = nn.Sequential(nn.Flatten(), nn.LazyLinear(32), nn.ReLU(), nn.LazyLinear(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x))


class MadeInForward(nn.Module):
    """A layer made anew inside every call (seeded: the same weights each time), beside
    kept ones: a module the plan has never seen at each call."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):  # (the CPU generator: the model runs there)
            torch.manual_seed(7)
            fresh = nn.Linear(32, 32)
        return self.b(F.relu(fresh(F.relu(self.a(x)))))


# --- the steps -----------------------------------------------------------------------------


def _cases() -> dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module, int, Enter], Any]]]:
    x, image = torch.randn(8, 16), torch.randn(2, 3, 8, 8)
    seq, ids, tags = torch.randn(2, 6, 16), torch.randint(0, 30, (3, 7)), torch.randint(0, 5, (3, 7))
    labels, boxes, masks = torch.randint(0, 5, (2,)), torch.randn(2, 2), torch.randint(0, 3, (2, 8, 8))
    sets = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3])
    q8 = torch.randint(-128, 128, (2, 5, 16), dtype=torch.int8)
    keep, pad = torch.randint(0, 2, (2, 5), dtype=torch.uint8), torch.tensor([[False] * 5, [False] * 3 + [True] * 2])

    def film(m: nn.Module, i: int, enter: Enter) -> Any:
        t = torch.randint(0, 1000, (2,))
        a = torch.cos(t.float() / 1000 * math.pi / 2)[:, None, None, None]
        noise = torch.randn_like(image)
        with enter(BF16):
            pred = m(a.sqrt() * image + (1 - a).sqrt() * noise, t)
        F.mse_loss(pred.float(), noise).backward()
        return pred

    def losses(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m(image, labels, boxes, masks)
        sum(v for k, v in out.items() if k != "acc").backward()
        return out

    def scaled(m: nn.Module, i: int, enter: Enter) -> Any:  # the data picks the depth
        return _train(m, x * (0.25 + 2.0 * (i % 3)), enter)

    def simclr(m: nn.Module, i: int, enter: Enter) -> Any:
        base = torch.randn(64, 16)
        return _train(m, base + 0.1 * torch.randn(64, 16), enter, b=base + 0.1 * torch.randn(64, 16))

    return {
        "unet-interpolate-pixel-shuffle": (UNetInterp, lambda m, i, enter: _train(m, image, enter)),
        "film-timestep-denoiser": (FiLM, film),
        "nt-xent-contrastive": (SimCLR, simclr),
        "perceiver-mha-latents": (PerceiverMHA, lambda m, i, enter: _train(m, seq, enter)),
        "early-exit-by-data": (EarlyExit, scaled),
        "multitask-loss-dict": (MultiTask, losses),
        "capsule-routing": (Capsules, lambda m, i, enter: _train(m, x, enter)),
        "fno-spectral-complex": (Spectral, lambda m, i, enter: _train(m, torch.randn(2, 12, 16), enter)),
        "gp-linalg-head": (GPHead, lambda m, i, enter: _train(m, x, enter, y=torch.randn(8))),
        "vq-straight-through": (VQ, lambda m, i, enter: _train(m, x, enter)),
        "mdn-distributions": (MDN, lambda m, i, enter: _train(m, x, enter, y=torch.randn(8))),
        "gumbel-softmax-hard": (Gumbel, lambda m, i, enter: _train(m, x, enter)),
        "pointnet-tnet-bmm": (PointNet, lambda m, i, enter: _train(m, torch.randn(2, 3, 20), enter)),
        "crf-logsumexp": (CRF, lambda m, i, enter: _train(m, ids, enter, tags=tags)),
        "neural-ode-rk4": (ODE, lambda m, i, enter: _train(m, x, enter)),
        "deepsets-scatter-reduce": (DeepSets, lambda m, i, enter: _train(m, x, enter, sets=sets, count=4)),
        "int8-uint8-bool-masks": (Masks, lambda m, i, enter: _train(m, q8, enter, keep=keep, pad=pad)),
        "counter-buffers": (Counter, lambda m, i, enter: _train(m, x, enter)),
        "module-made-in-forward": (MadeInForward, lambda m, i, enter: _train(m, x, enter)),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_models_measured_match_the_fixed_precision(case: str, measuring: Any, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,), measured=True)


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_models_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,))


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_models_in_float16_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, lambda m, i, enter: step(m, i, lambda dtype: enter(FP16)), 6, recordings, (FP16,))


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "given"])
def test_lazy_modules_initialised_inside_the_region(measured: bool, request: Any, recordings: list[Any]) -> None:
    """(An uninitialised lazy module cannot be deep-copied: each copy is a new one, the same
    until its first call, which draws its parameters from the step's seed.)"""
    if measured:
        request.getfixturevalue("measuring")
    image = torch.randn(2, 3, 8, 8)
    step = lambda m, i, enter: _train(m, image, enter)  # noqa: E731
    run(Lazy, step, 6, recordings, (BF16,), measured=measured, clone=lambda m: Lazy())


def test_the_early_exit_depth_varies_with_the_data() -> None:
    """The case is what it says: the loop stops at different depths across the steps."""
    torch.manual_seed(0)
    model, x = EarlyExit(), torch.randn(8, 16)
    with torch.autocast("cpu", dtype=BF16):
        depths = {model(x * (0.25 + 2.0 * i))[1] for i in range(3)}
    assert len(depths) > 1, depths


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
