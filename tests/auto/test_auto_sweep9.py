"""Issue 27, ninth held-out sweep of ``level="auto"``: model kinds and uses the earlier
sweeps (``test_auto_sweep*.py``) did not try.

* held-out model kinds: a GRU/LSTM-cell seq2seq over packed sequences with teacher forcing,
  a graph attention net (``index_select``, ``scatter_add``, ``index_add``), a diffusion U-Net
  (sinusoidal timestep embedding, ``GroupNorm``, an attention block, skip concatenations), a
  detection-like head (``gather`` of RoI cells, two losses), ``F.scaled_dot_product_attention``
  with a bool mask, a float mask and ``is_causal`` with dropout, an FNet (``torch.fft``), a
  one-hot input layer, a prototype net (``torch.cdist``), a video net (``Conv3d``), ViT-like
  patches by ``F.unfold``, ``nn.Embedding(max_norm=...)`` (renormalised in place by forward),
  ``RMSNorm`` + SwiGLU, a forward of dict / ``*args`` / keyword-only arguments with ``None``
  in its outputs, a forward changing its input in place, one layer in bfloat16 or float16
  among float32 ones, a model made on the meta device then ``to_empty``, tiny
  ``transformers`` DistilBERT / ViT classifiers;
* uses: a WGAN-GP gradient penalty (``create_graph=True``, double backward), a custom
  ``torch.autograd.Function`` with ``ctx.save_for_backward`` (and one under
  ``torch.amp.custom_fwd``), tensor hooks scaling gradients (on an activation and on the
  parameters, counting calls), the optimizer in backward
  (``register_post_accumulate_grad_hook``), GAN-style alternating steps with two optimizers,
  ``torch.amp.GradScaler`` in float16 with ``unscale_`` + ``clip_grad_norm_``, a BYOL-like
  target network under ``torch.no_grad`` in the region, deterministic algorithms on,
  ``checkpoint_sequential`` (non-reentrant), FGSM adversarial steps (gradients of the
  input, a second forward in the region), a model ensemble by ``torch.func.stack_module_state``
  + ``vmap``.

Each case is compared step by step with the fixed precision its plan gives
(``test_auto_sweep3.run``: outputs, gradients, parameters equal; nothing of auto left;
settled, no recording), with measured plans (a fake clock) and given plans.  No wall clock.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, Final

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from _auto_testing import auto_state, fixed  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, FP16, Enter, _backward, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


# --- model kinds ---------------------------------------------------------------------------


class Seq2Seq(nn.Module):
    """A GRU encoder over packed sequences, an ``LSTMCell`` decoder fed the target token or
    its own prediction (teacher forcing decided per step)."""

    def __init__(self, vocab: int = 20, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.GRU(d, d, batch_first=True)
        self.dec = nn.LSTMCell(d, d)
        self.out = nn.Linear(d, vocab)

    def forward(self, src: torch.Tensor, lengths: torch.Tensor, tgt: torch.Tensor, teacher: list[bool]) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(src), lengths, batch_first=True, enforce_sorted=False)
        _, h = self.enc(packed)
        h = h[0]
        c = torch.zeros_like(h)
        tok, logits = tgt[:, 0], []
        for t in range(1, tgt.shape[1]):
            h, c = self.dec(self.emb(tok).to(h.dtype), (h, c.to(h.dtype)))
            step = self.out(h)
            logits.append(step.float())
            tok = tgt[:, t] if teacher[t] else step.argmax(-1)
        return torch.stack(logits, 1)


class GraphAttention(nn.Module):
    """GAT-like: scores of edges from ``index_select``-ed ends, a softmax over each node's
    incoming edges by ``scatter_add``, messages summed by ``index_add``."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.lin, self.att, self.out = nn.Linear(d, d), nn.Linear(2 * d, 1), nn.Linear(d, 4)

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        src, dst = edges
        e = F.leaky_relu(self.att(torch.cat([h.index_select(0, src), h.index_select(0, dst)], -1))).squeeze(-1)
        w = (e - e.max()).exp()
        denom = torch.zeros(x.shape[0], dtype=w.dtype).scatter_add(0, dst, w)
        msg = h.index_select(0, src) * (w / denom.index_select(0, dst)).unsqueeze(-1)
        agg = msg.new_zeros(h.shape).index_add(0, dst, msg)
        return self.out(F.elu(agg))


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([args.sin(), args.cos()], -1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int = 16) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(4, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(4, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x)))
        h = h + self.t(F.silu(temb))[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class AttnBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm, self.qkv, self.proj = nn.GroupNorm(4, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, hh * ww).transpose(-1, -2).unbind(1)
        y = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.proj(y.transpose(-1, -2).reshape(b, c, hh, ww))


class UNet(nn.Module):
    """A diffusion U-Net: timestep embedding, GroupNorm res blocks, attention in the middle,
    an upsampled path concatenated with the skip."""

    def __init__(self) -> None:
        super().__init__()
        self.temb = nn.Sequential(nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 16))
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.down = ResBlock(16, 32)
        self.mid, self.attn = ResBlock(32, 32), AttnBlock(32)
        self.up = ResBlock(64, 16)
        self.out = nn.Sequential(nn.GroupNorm(4, 16), nn.SiLU(), nn.Conv2d(16, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.temb(timestep_embedding(t, 16))
        skip = self.down(self.stem(x), temb)
        h = self.attn(self.mid(F.avg_pool2d(skip, 2), temb))
        h = torch.cat([F.interpolate(h, scale_factor=2.0, mode="nearest").to(skip.dtype), skip], 1)
        return self.out(self.up(h, temb))


class Detector(nn.Module):
    """A detection-like head: the features of RoI cells gathered from a feature map."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)
        )
        self.cls, self.box = nn.Linear(16, 5), nn.Linear(16, 4)

    def forward(self, image: torch.Tensor, rois: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.backbone(image)
        b, c, hh, ww = f.shape
        flat = f.flatten(2).transpose(1, 2).reshape(b * hh * ww, c)
        idx = rois[:, 0] * hh * ww + rois[:, 1] * ww + rois[:, 2]
        pooled = torch.gather(flat, 0, idx[:, None].expand(-1, c))
        return self.cls(pooled), self.box(pooled)


class SDPA(nn.Module):
    """``F.scaled_dot_product_attention`` with a bool mask, a float mask, or ``is_causal``
    (with attention dropout)."""

    def __init__(self, mode: str, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.mode, self.heads = mode, heads
        self.qkv, self.proj, self.head = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.mode == "causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1 if self.training else 0.0)
        elif self.mode == "bool":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype) if mask is not None else None)
        return self.head(self.proj(y.transpose(1, 2).reshape(b, t, d)).mean(1))


class FNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.norm, self.ff, self.head = (
            nn.Linear(16, 16),
            nn.LayerNorm(16),
            nn.Linear(16, 16),
            nn.Linear(16, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = self.norm(h.float() + torch.fft.fft2(h.float()).real)
        h = h + self.ff(F.gelu(h))
        return self.head(torch.fft.irfft(torch.fft.rfft(h.float(), dim=1), n=h.shape[1], dim=1).mean(1))


class OneHot(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = nn.Linear(20, 32), nn.Linear(32, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(F.one_hot(ids, 20).float()).sum(1)))


class Prototypes(nn.Module):
    """A prototypical net: distances (``torch.cdist``) of embeddings to learned prototypes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        self.protos = nn.Parameter(torch.randn(5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -(torch.cdist(self.embed(x), self.protos.to(self.embed[2].weight.dtype)) ** 2)


class Video(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv3d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv3d(8, 8, (1, 3, 3), padding=(0, 1, 1))
        )
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean((2, 3, 4)))


class Patches(nn.Module):
    """ViT-like patches by ``F.unfold``, a Linear patch embedding, a ``TransformerEncoderLayer``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * 16, 16)
        self.pos = nn.Parameter(torch.zeros(1, 16, 16))
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        patches = F.unfold(image, 4, stride=4).transpose(1, 2)
        return self.head(self.layer(self.embed(patches) + self.pos).mean(1))


class MaxNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16, max_norm=1.0)
        self.head = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


class SwiGLU(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, 32, bias=False), nn.Linear(d, 32, bias=False), nn.Linear(32, d)
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.head(x + self.down(F.silu(self.gate(h)) * self.up(h)))


class Arguments(nn.Module):
    """A dict input, ``*args``, keyword-only arguments (a Python float changing each step, an
    optional mask), ``None`` in a dict and a list of outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.head = nn.Linear(16, 32), nn.Linear(8, 32), nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(
        self, batch: dict[str, torch.Tensor], *extra: torch.Tensor, scale: float = 1.0, mask: torch.Tensor | None = None
    ) -> dict[str, Any]:
        h = self.a(batch["x"]) + self.b(batch["y"])
        for e in extra:
            h = h + self.c(e)
        if mask is not None:
            h = h * mask
        return {"out": self.head(torch.relu(h)) * scale, "none": None, "list": [h, None]}


class InPlace(nn.Module):
    """A forward that changes its input in place (the caller's tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0).clamp_(-1.5, 1.5)
        return self.b(torch.relu_(self.a(x)))


class ScaledGelu(torch.autograd.Function):
    """GELU times a learned scale, its backward by hand from ``ctx.save_for_backward``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, scale)
        return F.gelu(x) * scale

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, scale = ctx.saved_tensors
        xf = x.float()
        cdf = 0.5 * (1.0 + torch.erf(xf / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * xf * xf) / math.sqrt(2.0 * math.pi)
        gx = g.float() * scale * (cdf + xf * pdf)
        return gx.to(x.dtype), (g.float() * F.gelu(xf)).sum().reshape(scale.shape)


class Float32Gelu(torch.autograd.Function):
    """The same under ``torch.amp.custom_fwd(cast_inputs=float32)`` (autocast off inside)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, scale)
        return F.gelu(x) * scale

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ScaledGelu.backward(ctx, g)


class Custom(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.fn.apply(self.a(x), self.scale))


class ActivationHook(nn.Module):
    """A tensor hook on an activation halving its gradient (registered in each forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if h.requires_grad:
            h.register_hook(lambda g: g * 0.5)
        return self.c(torch.relu(self.b(h)))


def _param_hooks() -> nn.Module:
    """Hooks on the parameters themselves: gradients scaled, calls counted."""
    m = _mlp()
    m.calls = torch.zeros(())  # type: ignore[assignment]
    for p in m.parameters():
        p.register_hook(lambda g, m=m: (m.calls.add_(1.0), g * 0.25)[1])
    return m


def _in_backward_optimizer() -> nn.Module:
    """The optimizer in backward: each parameter updated by its own hook once its gradient
    is accumulated (``register_post_accumulate_grad_hook``)."""
    m = _mlp()
    for p in m.parameters():
        p.register_post_accumulate_grad_hook(_sgd_in_backward)
    return m


def _sgd_in_backward(p: torch.Tensor) -> None:
    with torch.no_grad():
        p.add_(p.grad, alpha=-0.1)
    p.grad = None


class GAN(nn.Module):
    """A generator and a critic called as roots in one region; the module is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.g = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
        self.d = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))


class BYOL(nn.Module):
    """An online network trained, a target network under ``torch.no_grad`` in the same forward."""

    def __init__(self) -> None:
        super().__init__()
        self.online, self.target = _mlp(), _mlp().requires_grad_(False)
        self.predict = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            t = self.target(x.flip(0))
        return self.predict(self.online(x)), t


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _one_layer(dtype: torch.dtype) -> Callable[[], nn.Module]:
    """One layer of an MLP in ``dtype`` among float32 ones (the O1 lists there, as torch.autocast)."""

    def make() -> nn.Module:
        m = _mlp()
        m[2].to(dtype)
        return m

    return make


def _meta() -> nn.Module:
    """Made on the meta device, then ``to_empty`` and initialised."""
    with torch.device("meta"):
        m = _mlp()
    m = m.to_empty(device="cpu")
    torch.manual_seed(0)
    for layer in m.modules():
        if isinstance(layer, nn.Linear):
            layer.reset_parameters()
    return m


def _blocks() -> nn.Module:
    return nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(4)), nn.Linear(16, 4))


def _transformers(kind: str) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        if kind == "distilbert":
            cfg = transformers.DistilBertConfig(
                vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32, num_labels=3
            )
            return transformers.DistilBertForSequenceClassification(cfg)
        cfg = transformers.ViTConfig(
            image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, num_labels=3,
        )  # fmt: skip
        return transformers.ViTForImageClassification(cfg)

    return make


# --- the steps -----------------------------------------------------------------------------


def _state(m: nn.Module, make: Callable[[nn.Module], Any], store: dict[int, Any]) -> Any:
    """Per-model state kept across steps (an optimizer, a scaler): the reference and the
    model under auto each have their own."""
    if id(m) not in store:
        store[id(m)] = (m, make(m))  # (the model kept: its id is not reused)
    return store[id(m)][1]


def _cases() -> dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module, int, Enter], Any]]]:
    x, seq = torch.randn(8, 16), torch.randn(2, 6, 16)
    image, small = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 16, 16)
    src, lengths = torch.randint(0, 20, (3, 7)), torch.tensor([7, 4, 5])
    tgt = torch.randint(0, 20, (3, 5))
    nodes, edges = torch.randn(10, 16), torch.randint(0, 10, (2, 30))
    rois = torch.stack([torch.randint(0, 2, (6,)), torch.randint(0, 4, (6,)), torch.randint(0, 4, (6,))], 1)
    labels, boxes = torch.randint(0, 5, (6,)), torch.randn(6, 4)
    bool_mask = torch.rand(6, 6) > 0.3
    bool_mask.fill_diagonal_(True)
    float_mask = torch.zeros(6, 6).masked_fill(~bool_mask, float("-inf"))
    ids = torch.randint(0, 20, (8, 5))
    video = torch.randn(2, 3, 4, 8, 8)
    token_ids = torch.randint(0, 50, (8, 5))
    store: dict[int, Any] = {}

    def seq2seq(m: nn.Module, i: int, enter: Enter) -> Any:
        teacher = [(t + i) % 3 != 0 for t in range(tgt.shape[1])]  # (the same each round of steps)
        with enter(BF16):
            logits = m(src, lengths, tgt, teacher)
        F.cross_entropy(logits.reshape(-1, 20), tgt[:, 1:].reshape(-1)).backward()
        return logits

    def diffusion(m: nn.Module, i: int, enter: Enter) -> Any:
        t = torch.randint(0, 1000, (2,))
        noise = torch.randn_like(small)
        a = torch.cos(t.float() / 1000 * math.pi / 2)[:, None, None, None]
        with enter(BF16):
            pred = m(a * small + (1 - a * a).sqrt() * noise, t)
        F.mse_loss(pred.float(), noise).backward()
        return pred

    def detect(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            cls, box = m(image, rois)
        (F.cross_entropy(cls.float(), labels) + F.smooth_l1_loss(box.float(), boxes)).backward()
        return cls, box

    def penalty(m: nn.Module, i: int, enter: Enter) -> Any:  # WGAN-GP
        real, fake = x, torch.randn(8, 16)
        eps = torch.rand(8, 1)
        inter = (eps * real + (1 - eps) * fake).requires_grad_(True)
        with enter(BF16):
            d_real, d_fake, d_inter = m(real), m(fake), m(inter)
        (g,) = torch.autograd.grad(d_inter.float().sum(), inter, create_graph=True)
        gp = ((g.norm(2, dim=1) - 1) ** 2).mean()
        (d_fake.float().mean() - d_real.float().mean() + 10 * gp).backward()
        return d_real, d_fake, g

    def gan(m: nn.Module, i: int, enter: Enter) -> Any:
        opt_g, opt_d = _state(
            m, lambda m: (torch.optim.Adam(m.g.parameters(), 1e-3), torch.optim.Adam(m.d.parameters(), 1e-3)), store
        )
        z = torch.randn(8, 8)
        with enter(BF16):
            fake = m.g(z).detach()
            loss_d = F.softplus(m.d(fake)).float().mean() + F.softplus(-m.d(x)).float().mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        with enter(BF16):
            out = m.d(m.g(z))
        opt_g.zero_grad()
        F.softplus(-out).float().mean().backward()
        opt_g.step()
        return loss_d, out

    def scaled_clip(m: nn.Module, i: int, enter: Enter) -> Any:
        opt, scaler = _state(
            m, lambda m: (torch.optim.SGD(m.parameters(), 0.1), torch.amp.GradScaler("cpu", init_scale=2.0**10)), store
        )
        with enter(FP16):
            out = m(x)
        scaler.scale(out.float().pow(2).mean()).backward()
        scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        return out, norm, torch.tensor(scaler.get_scale())

    def clip(m: nn.Module, i: int, enter: Enter) -> Any:
        opt = _state(m, lambda m: torch.optim.SGD(m.parameters(), 0.1, momentum=0.9), store)
        out = _train(m, x, enter)
        norm = nn.utils.clip_grad_norm_(m.parameters(), 0.1, foreach=True)
        opt.step()
        opt.zero_grad()
        return out, norm

    def byol(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            p, t = m(x)
        (2 - 2 * F.cosine_similarity(p.float(), t.float(), dim=-1).mean()).backward()
        with torch.no_grad():
            for po, pt in zip(m.online.parameters(), m.target.parameters(), strict=True):
                pt.mul_(0.9).add_(0.1 * po)
        return p, t

    def deterministic(m: nn.Module, i: int, enter: Enter) -> Any:
        before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            return _train(m, nodes, enter, edges=edges)
        finally:
            torch.use_deterministic_algorithms(before)

    def checkpointed(m: nn.Module, i: int, enter: Enter) -> Any:
        """The checkpointed segment (the first two blocks; the last segment is not) runs with
        the O1 lists: its recompute in backward runs with the autocast state of its entry and
        no module hooks (``test_auto_inner``): the reference leaves them to autocast too."""
        xi = x.clone().requires_grad_(True)
        handles = [
            layer.register_forward_pre_hook(lambda mod, a: torch.set_autocast_enabled("cpu", True))
            for block in m[:2]
            for layer in block.modules()
            if enter is fixed and isinstance(layer, nn.Linear)
        ]
        try:
            with enter(BF16):
                out = torch.utils.checkpoint.checkpoint_sequential(m, 2, xi, use_reentrant=False)
        finally:
            for handle in handles:
                handle.remove()
        _backward(out)
        return out, xi.grad

    def fgsm(m: nn.Module, i: int, enter: Enter) -> Any:
        xi = x.clone().requires_grad_(True)
        target = torch.arange(8) % 4
        with enter(BF16):
            loss = F.cross_entropy(m(xi).float(), target)
        (gx,) = torch.autograd.grad(loss, xi)
        adv = (x + 0.1 * gx.sign()).detach()
        with enter(BF16):
            out = m(adv)
        F.cross_entropy(out.float(), target).backward()
        return out, gx

    def ensemble(m: nn.Module, i: int, enter: Enter) -> Any:
        members = [m, *(_state(m, lambda m: [_mlp() for _ in range(2)], store))]
        params, buffers = torch.func.stack_module_state(members)  # type: ignore[arg-type]

        def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(m, (p, b), (xb,))

        with enter(BF16):
            out = torch.vmap(one, in_dims=(0, 0, None))(params, buffers, x)
        out.float().sum().backward()
        return out, *(p.grad for p in params.values())

    def arguments(m: nn.Module, i: int, enter: Enter) -> Any:
        batch = {"x": x, "y": torch.randn(8, 8)}
        extra = [x.flip(0)] * (i % 3)
        mask = (torch.rand(8, 32) > 0.5).float() if i % 2 else None
        with enter(BF16):
            out = m(batch, *extra, scale=1.0 + i % 6, mask=mask)
        _backward(out)
        return out["out"], out["list"][0]

    def inplace(m: nn.Module, i: int, enter: Enter) -> Any:
        xi = x.clone()
        return _train(m, xi, enter), xi

    def sdpa(mode: str) -> Callable[[nn.Module, int, Enter], Any]:
        mask = {"bool": bool_mask, "float": float_mask, "causal": None}[mode]
        return lambda m, i, enter: _train(m, seq, enter, mask=mask)

    def distilbert(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m(input_ids=token_ids, attention_mask=torch.ones_like(token_ids), labels=token_ids[:, 0] % 3)
        out.loss.backward()
        return out.logits

    def vit(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m(pixel_values=small, labels=torch.tensor([0, 2]))
        out.loss.backward()
        return out.logits

    return {
        "seq2seq-packed-teacher-forcing": (Seq2Seq, seq2seq),
        "graph-attention": (GraphAttention, lambda m, i, enter: _train(m, nodes, enter, edges=edges)),
        "diffusion-unet": (UNet, diffusion),
        "detection-gather": (Detector, detect),
        "sdpa-bool-mask": (lambda: SDPA("bool"), sdpa("bool")),
        "sdpa-float-mask": (lambda: SDPA("float"), sdpa("float")),
        "sdpa-causal-dropout": (lambda: SDPA("causal"), sdpa("causal")),
        "fnet-fft": (FNet, lambda m, i, enter: _train(m, seq, enter)),
        "one-hot": (OneHot, lambda m, i, enter: _train(m, ids, enter)),
        "prototypes-cdist": (Prototypes, lambda m, i, enter: _train(m, x, enter)),
        "video-conv3d": (Video, lambda m, i, enter: _train(m, video, enter)),
        "unfold-patches": (Patches, lambda m, i, enter: _train(m, small, enter)),
        "embedding-max-norm": (MaxNorm, lambda m, i, enter: (_train(m, token_ids, enter), m.emb.weight.clone())),
        "rmsnorm-swiglu": (SwiGLU, lambda m, i, enter: _train(m, seq, enter)),
        "dict-args-kwonly-none": (Arguments, arguments),
        "inplace-on-input": (InPlace, inplace),
        "one-layer-bf16": (_one_layer(BF16), lambda m, i, enter: _train(m, x, enter)),
        "one-layer-fp16": (_one_layer(FP16), lambda m, i, enter: _train(m, x, enter)),
        "meta-to-empty": (_meta, lambda m, i, enter: _train(m, x, enter)),
        "gradient-penalty": (_mlp, penalty),
        "autograd-function": (lambda: Custom(ScaledGelu), lambda m, i, enter: _train(m, x, enter)),
        "autograd-function-custom-fwd": (lambda: Custom(Float32Gelu), lambda m, i, enter: _train(m, x, enter)),
        "activation-hook": (ActivationHook, lambda m, i, enter: _train(m, x, enter)),
        "parameter-hooks": (_param_hooks, lambda m, i, enter: (_train(m, x, enter), m.calls.clone())),
        "optimizer-in-backward": (_in_backward_optimizer, lambda m, i, enter: _train(m, x, enter)),
        "gan-alternating": (GAN, gan),
        "scaler-fp16-unscale-clip": (_mlp, scaled_clip),
        "clip-grad-norm-momentum": (_mlp, clip),
        "byol-no-grad-target": (BYOL, byol),
        "deterministic-algorithms": (GraphAttention, deterministic),
        "checkpoint-sequential": (_blocks, checkpointed),
        "fgsm-adversarial": (_mlp, fgsm),
        "vmap-ensemble": (_mlp, ensemble),
        "distilbert-classifier": (_transformers("distilbert"), distilbert),
        "vit-classifier": (_transformers("vit"), vit),
    }


#: cases whose every step is a new configuration (the number of ``*args``, a mask or none):
#: one met for the first time with classes to measure records twice (its first call measures)
_STEPS: Final = {"dict-args-kwonly-none": 12}

#: the region's dtype where it is not bfloat16
_DTYPES: Final = {"scaler-fp16-unscale-clip": (FP16,)}


def _rebuilt(make: Callable[[], nn.Module]) -> Callable[[nn.Module], nn.Module]:
    """A reference made anew with the model's state (a deep copy of a parameter keeps
    neither its hooks nor their closures' own objects)."""

    def clone(model: nn.Module) -> nn.Module:
        twin = make()
        twin.load_state_dict(model.state_dict())
        return twin

    return clone


#: how the reference is made where a deep copy is not the same model
_CLONES: Final = {"parameter-hooks": _rebuilt(_param_hooks), "optimizer-in-backward": _rebuilt(_in_backward_optimizer)}


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_models_and_uses_measured_match_the_fixed_precision(
    case: str, measuring: Any, recordings: list[Any]
) -> None:
    make, step = _cases()[case]
    run(
        make,
        step,
        _STEPS.get(case, 6),
        recordings,
        _DTYPES.get(case, (BF16,)),
        measured=True,
        clone=_CLONES.get(case, copy.deepcopy),
    )


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_models_and_uses_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, _STEPS.get(case, 6), recordings, _DTYPES.get(case, (BF16,)), clone=_CLONES.get(case, copy.deepcopy))


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
