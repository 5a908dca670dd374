"""Issue 27, twelfth held-out sweep of ``level="auto"``: training setups the earlier sweeps did
not try.

* a model whose forward branches on ``self.training`` (an auxiliary head, dropout) with a
  validation pass (``model.eval()`` under ``torch.no_grad``, two batch sizes) every other
  step;
* a momentum (MoCo) encoder updated in place inside ``forward`` (frozen parameters, an EMA
  under ``torch.no_grad``) with a queue buffer and its position (an int), and a memory bank kept as a
  plain tensor attribute written in ``forward`` (before: the whole-call check's runs wrote
  them 6 to 24 times more, so the real call saw another key encoder, other gradients);
* ``torch.utils.checkpoint`` with ``use_reentrant=True`` around each block inside ``forward``;
* weight-norm and spectral-norm parametrizations (``torch.nn.utils.parametrizations``) used
  inside ``torch.nn.utils.parametrize.cached()``;
* an EMA teacher run through ``torch.func.functional_call`` with its own tensors (updated in
  place after each step);
* a siamese sequence encoder called twice a step at lengths from buckets;
* tensors made inside ``forward`` with ``device=`` / ``dtype=`` from a buffer or activation;
* a WGAN-GP gradient penalty (``torch.autograd.grad(..., create_graph=True)`` of the critic
  at interpolated inputs, then backward through it);
* forward hooks a library adds on intermediate layers mid-training (features in the loss)
  and removes later;
* ``retain_grad`` and a gradient-clipping hook on an activation inside ``forward``.

Each case is compared step by step with the fixed precision its plan gives
(``test_auto_sweep3.run``: outputs, gradients, parameters equal, nothing of auto left, settled
steps record nothing), with measured plans (a fake clock), given plans, and in float16
regions with given plans.  No wall clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, FP16, Enter, _clean, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from test_auto_sweep10_uses import _mlp
from torch import nn
from torch.nn.utils import parametrizations, parametrize

import ampcore

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class Branchy(nn.Module):
    """Training: dropout and an auxiliary head added to the output; eval: another head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 32), nn.ReLU())
        self.head, self.aux, self.val = nn.Linear(32, 4), nn.Linear(32, 4), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.training:
            return self.head(h) + 0.3 * self.aux(h)
        return self.head(h) + self.val(h)


class MoCo(nn.Module):
    """A query encoder, a key encoder (frozen parameters) updated by momentum inside
    ``forward``, a queue of keys (a buffer) and its position (a plain int)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.k = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.k.load_state_dict(self.q.state_dict())
        self.k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(40, 8), dim=1))
        self.ptr = 0  # (a plain int: the check's runs moved it too)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        q = F.normalize(self.q(a).float(), dim=1)
        with torch.no_grad():
            for pk, pq in zip(self.k.parameters(), self.q.parameters(), strict=True):
                pk.mul_(0.9).add_(pq.detach(), alpha=0.1)
            k = F.normalize(self.k(b).float(), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().t()], 1) / 0.2
        with torch.no_grad():
            self.queue[self.ptr : self.ptr + k.shape[0]] = k
            self.ptr = (self.ptr + k.shape[0]) % self.queue.shape[0]
        return logits


class Banked(nn.Module):
    """A memory bank kept as a plain tensor attribute (not a buffer), written in place inside
    ``forward`` and read by the next call (a prototype / feature bank)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()
        self.bank = torch.zeros(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x) + self.bank
        with torch.no_grad():
            self.bank.mul_(0.5).add_(out.detach().float().mean(0))
        return out


class Reentrant(nn.Module):
    """Three residual blocks, each run by ``checkpoint(..., use_reentrant=True)``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(3))
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + torch.utils.checkpoint.checkpoint(block, h, use_reentrant=True)
        return self.out(h)


class Normed(nn.Module):
    """Weight norm on one Linear, spectral norm (a power iteration buffer) on another, the
    forward inside ``parametrize.cached()``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = parametrizations.weight_norm(nn.Linear(16, 32))
        self.b = parametrizations.spectral_norm(nn.Linear(32, 32))
        self.c = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with parametrize.cached():
            return self.c(F.relu(self.b(F.relu(self.a(x)))) + F.relu(self.b(F.relu(self.a(-x)))))


class Siamese(nn.Module):
    """Token embeddings renormalised in place (``max_norm``: the forward writes its weight),
    a masked mean, a projection: two sequences a step."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 16, max_norm=1.0)
        self.enc = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32))
        self.proj = nn.Linear(32, 8)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.enc(self.emb(ids)) * mask[..., None]
        return self.proj(h.sum(1) / mask.sum(1, keepdim=True))


class Made(nn.Module):
    """Tensors made inside ``forward`` from a buffer's and an activation's device and dtype:
    sinusoidal positions, a causal mask, zeros to pad, ``full_like``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("freqs", torch.exp(-torch.arange(8) / 8.0))
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.arange(x.shape[1], device=self.freqs.device, dtype=self.freqs.dtype)
        angles = t[:, None] * self.freqs[None]
        pos = torch.cat([angles.sin(), angles.cos()], -1)
        h = self.a(x + pos)
        mask = torch.ones(x.shape[1], x.shape[1], device=h.device, dtype=torch.bool).tril()
        scores = (h @ h.transpose(1, 2)).masked_fill(~mask, float("-inf")).softmax(-1)
        h = self.b(scores @ h)
        pad = torch.zeros(h.shape[0], 1, h.shape[2], device=h.device, dtype=h.dtype)
        h = torch.cat([pad, h[:, :-1]], 1) + torch.full_like(h, 0.5)
        return self.c(F.relu(h))


class Probed(nn.Module):
    """``retain_grad`` and a clipping hook on an activation inside ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        self.kept: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        h.register_hook(lambda g: g.clamp(-0.01, 0.01))
        g = self.b(h)
        g.retain_grad()
        self.kept = g
        return self.c(F.relu(g))


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


Case = tuple[Callable[[], nn.Module], Callable[[nn.Module, int, Enter], Any]]


def _cases() -> dict[str, Case]:
    x, y, x2 = torch.randn(8, 16), torch.randint(0, 4, (8,)), torch.randn(8, 16)
    real, seq = torch.randn(8, 16), torch.randn(4, 8, 16)
    lengths = (8, 12, 8, 12, 16, 16)  # (each signature twice: a new one measured records twice)
    emas: dict[int, dict[str, torch.Tensor]] = {}
    hooks: dict[int, Any] = {}

    def validating(m: nn.Module, i: int, enter: Enter) -> Any:
        out = _train(m, x, enter)
        if i % 2:
            m.eval()
            with torch.no_grad(), enter(BF16):
                val = (m(x2), m(x2[:3]))
            m.train()
            return out, val
        return out

    def moco(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            logits = m(x, x + 0.1 * torch.randn(8, 16))
        F.cross_entropy(logits, torch.zeros(8, dtype=torch.long)).backward()
        with torch.no_grad():  # (SGD on the query encoder: the momentum update moves the key encoder)
            for p in m.q.parameters():
                p.sub_(0.5 * p.grad)
        return logits, m.queue.clone(), torch.tensor(m.ptr), [p.clone() for p in m.k.parameters()]

    def teacher(m: nn.Module, i: int, enter: Enter) -> Any:
        ema = emas.setdefault(id(m), {k: v.detach().clone() for k, v in m.named_parameters()})
        with enter(BF16):
            student = m(x)
            with torch.no_grad():
                target = torch.func.functional_call(m, ema, (x,))
        (F.mse_loss(student.float(), target.float()) + F.cross_entropy(student.float(), y)).backward()
        with torch.no_grad():
            for k, v in m.named_parameters():
                ema[k].mul_(0.9).add_(v.detach() - 0.01 * v.grad, alpha=0.1)
        return student, target

    def siamese(m: nn.Module, i: int, enter: Enter) -> Any:
        n = lengths[i]
        g = torch.Generator().manual_seed(i)
        a, b = torch.randint(0, 40, (4, n), generator=g), torch.randint(0, 40, (4, n + 4), generator=g)
        ma, mb = torch.ones(4, n), (torch.rand(4, n + 4, generator=g) > 0.2).float()
        mb[:, 0] = 1
        with enter(BF16):
            za, zb = m(a, ma), m(b, mb)
        (1 - F.cosine_similarity(za.float(), zb.float())).mean().backward()
        return za, zb

    def penalty(m: nn.Module, i: int, enter: Enter) -> Any:
        eps = torch.rand(8, 1)
        mixed = (eps * real + (1 - eps) * x).requires_grad_(True)
        with enter(BF16):
            score_real, score_fake, score_mixed = m(real), m(x), m(mixed)
        (grad,) = torch.autograd.grad(score_mixed.float().sum(), mixed, create_graph=True)
        gp = (grad.norm(2, dim=1) - 1).pow(2).mean()
        (score_fake.float().mean() - score_real.float().mean() + 10 * gp).backward()
        return score_real, score_fake, grad

    def hooked(m: nn.Module, i: int, enter: Enter) -> Any:
        feats = hooks.setdefault(-id(m), {})
        feats.clear()

        def grab(name: str) -> Callable[..., None]:
            def hook(mod: nn.Module, args: Any, out: torch.Tensor) -> None:
                feats[name] = out  # (by name, the latest call's: the common feature-extraction hook)

            return hook

        if i == 2:  # a library starts extracting features: a perceptual term in the loss
            hooks[id(m)] = [m[k].register_forward_hook(grab(str(k))) for k in (0, 2)]
        if i == 4:
            for handle in hooks.pop(id(m), []):
                handle.remove()
        with enter(BF16):
            out = m(x)
        loss = F.cross_entropy(out.float(), y) + sum(f.float().pow(2).mean() for f in feats.values())
        loss.backward()
        return out, dict(feats)

    def probed(m: nn.Module, i: int, enter: Enter) -> Any:
        out = _train(m, x, enter)
        return out, m.kept.grad

    return {
        "validation-every-other-step": (Branchy, validating),
        "momentum-encoder-in-forward": (MoCo, moco),
        "memory-bank-plain-attribute": (Banked, lambda m, i, enter: _train(m, x, enter)),
        "reentrant-checkpoint-per-block": (Reentrant, lambda m, i, enter: _train(m, x, enter)),
        "weight-and-spectral-norm-cached": (Normed, lambda m, i, enter: _train(m, x, enter)),
        "ema-teacher-functional-call": (_mlp, teacher),
        "siamese-bucketed-lengths": (Siamese, siamese),
        "tensors-made-from-buffer-dtype": (Made, lambda m, i, enter: _train(m, seq, enter)),
        "wgan-gp-gradient-penalty": (Critic, penalty),
        "feature-hooks-mid-training": (_mlp, hooked),
        "retain-grad-and-activation-hook": (Probed, probed),
    }


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)


@pytest.mark.parametrize("case", list(_cases()))
def test_sweep12_measured_match_the_fixed_precision(case: str, measuring: Any, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,), measured=True)


@pytest.mark.parametrize("case", list(_cases()))
def test_sweep12_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,))


@pytest.mark.parametrize("case", list(_cases()))
def test_sweep12_in_float16_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, lambda m, i, enter: step(m, i, lambda dtype: enter(FP16)), 6, recordings, (FP16,))


def test_a_bad_batch_after_settling_raises_as_torch_autocast_and_leaves_nothing(
    measuring: Any, recordings: list[Any]
) -> None:
    """A batch of the wrong width inside ``checkpoint(..., use_reentrant=True)`` blocks: the
    user's error, as under torch.autocast, nothing of auto left, and the next good batch
    runs its settled program (no recording)."""
    torch.manual_seed(0)
    model, x = Reentrant(), torch.randn(8, 16)
    for _ in range(4):
        _train(model, x, lambda dtype: ampcore.autocast("cpu", level="auto", dtype=dtype))
    recordings.clear()
    with pytest.raises(RuntimeError) as want, torch.autocast("cpu", dtype=BF16):
        model(torch.randn(8, 15))
    with pytest.raises(RuntimeError) as got, ampcore.autocast("cpu", level="auto", dtype=BF16):
        model(torch.randn(8, 15))
    assert str(got.value) == str(want.value)
    _clean(model)
    recordings.clear()  # (the bad batch's shape: a new signature, recorded as it raised)
    _train(model, x, lambda dtype: ampcore.autocast("cpu", level="auto", dtype=dtype))
    _clean(model)
    assert recordings == []


def test_the_checks_copy_on_write_sees_out_and_foreach_writes_and_survives_a_replaced_tensor() -> None:
    """``Written`` (the whole-call check's copy-on-write): a write through ``out=`` and a
    ``_foreach_`` op are kept and put back; a parameter whose ``.data`` the forward replaced
    by another shape is left as the forward made it (no copy of the old shape into it)."""
    from ampcore._auto._written import Written

    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2), requires_grad=False)
            self.c = nn.Parameter(torch.ones(4))
            self.step = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                torch.add(self.a, 1.0, out=self.a)
                torch._foreach_mul_([self.b], 3.0)
                self.c.mul_(2.0)
                self.c.data = torch.zeros(5)
            self.step += 1
            return x * self.a.sum()

    model, x = Writes(), torch.ones(2)
    written = Written(model)
    with written.watching(model):
        model(x)
    model(x)
    written.restore()
    assert model.a.tolist() == [1.0] * 3 and model.b.tolist() == [1.0] * 2 and model.step == 0
    assert model.c.shape == (5,)
