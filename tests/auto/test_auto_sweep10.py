"""Issue 27, tenth held-out sweep of ``level="auto"``: model kinds the earlier sweeps
(``test_auto_sweep*.py``) did not try; the uses are in ``test_auto_sweep10_uses.py``.

* a Switch mixture of experts: top-1 routing with a capacity (tokens over it dropped),
  dispatched by ``scatter`` into an expert buffer and combined by ``gather``, plus a
  load-balancing loss; experts as one 3-d parameter run by ``torch.bmm``;
* a Mamba-like selective scan (``softplus`` step sizes, a causal depthwise ``Conv1d``, a
  recurrence in float32 over time);
* a 2-layer bidirectional ``LSTM`` with ``proj_size`` over packed sequences
  (``pad_packed_sequence`` back);
* a speech model: strided ``Conv1d``, a ``GRU``, ``F.ctc_loss``;
* an ``EmbeddingBag`` and an ``Embedding`` with sparse gradients (``SparseAdam`` beside Adam);
* grouped, depthwise and transposed convolutions (1-d, 2-d, 3-d) in channels_last;
* a parametrization of the user's own (``parametrize.register_parametrization``, two chained
  on one weight, one with ``right_inverse``);
* a hypernetwork (``F.linear`` with generated weights), a spatial transformer
  (``affine_grid`` + ``grid_sample``), ``F.fold`` reassembling patches, an ``torch.stft``
  audio front end, a GCN over a sparse COO adjacency (``torch.sparse.mm``),
  ``nn.AdaptiveLogSoftmaxWithLoss``, a RealNVP flow (log-determinant), a Perceiver-like
  cross-attention by ``einsum``, ``nn.MultiheadAttention`` with other ``kdim`` / ``vdim``,
  ``nn.TransformerDecoder`` with a causal mask and a memory padding mask.

Each case is compared step by step with the fixed precision its plan gives
(``test_auto_sweep3.run``: outputs, gradients, parameters equal; nothing of auto left;
settled, no recording), with measured plans (a fake clock) and given plans.  No wall clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, _backward, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from test_auto_sweep9 import _state
from torch import nn
from torch.nn.utils import parametrize

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class Switch(nn.Module):
    """Top-1 routing to 4 experts with a capacity of 3 tokens each (the rest dropped: passed
    through), the experts' weights one ``(4, 16, 16)`` parameter run by ``torch.bmm``."""

    def __init__(self, d: int = 16, experts: int = 4, capacity: int = 3) -> None:
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.w = nn.Parameter(torch.randn(experts, d, d) / math.sqrt(d))
        self.capacity = capacity
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(self.router(x).float(), -1)
        gate, expert = probs.max(-1)
        onehot = F.one_hot(expert, self.w.shape[0])
        slot = (onehot.cumsum(0) * onehot).sum(-1) - 1  # the token's place in its expert's buffer
        kept = slot < self.capacity
        index = (expert * self.capacity + slot.clamp(max=self.capacity - 1))[kept]
        buf = x.new_zeros(self.w.shape[0] * self.capacity, x.shape[1])
        buf = buf.scatter(0, index[:, None].expand(-1, x.shape[1]), x[kept])
        h = torch.bmm(buf.view(self.w.shape[0], self.capacity, -1), self.w.to(buf.dtype)).flatten(0, 1)
        y = x.clone()
        y[kept] = torch.gather(h, 0, index[:, None].expand(-1, x.shape[1])).to(x.dtype) * gate[kept, None].to(x.dtype)
        balance = (onehot.float().mean(0) * probs.mean(0)).sum() * self.w.shape[0]
        return self.head(y), balance


class SelectiveScan(nn.Module):
    """Mamba-like: input projection, a causal depthwise conv, input-dependent step sizes and
    B / C, a float32 recurrence over time, a gated output projection."""

    def __init__(self, d: int = 16, inner: int = 32, state: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(d, 2 * inner)
        self.conv = nn.Conv1d(inner, inner, 4, groups=inner, padding=3)
        self.xproj = nn.Linear(inner, 2 * state + 1)
        self.dt = nn.Linear(1, inner)
        self.a_log = nn.Parameter(torch.log(torch.arange(1, state + 1).float()).repeat(inner, 1))
        self.out = nn.Linear(inner, d)
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        u, z = self.inp(x).chunk(2, -1)
        u = F.silu(self.conv(u.transpose(1, 2))[..., :t].transpose(1, 2))
        dt_in, b, c = self.xproj(u).split([1, self.a_log.shape[1], self.a_log.shape[1]], -1)
        dt = F.softplus(self.dt(dt_in)).float()
        a = -self.a_log.exp()
        h = u.new_zeros(u.shape[0], u.shape[2], self.a_log.shape[1], dtype=torch.float32)
        ys = []
        for s in range(t):
            h = torch.exp(dt[:, s, :, None] * a) * h + dt[:, s, :, None] * b[:, s, None, :].float() * u[:, s, :, None]
            ys.append((h * c[:, s, None, :].float()).sum(-1))
        y = torch.stack(ys, 1) * F.silu(z.float())
        return self.head(self.out(y.to(z.dtype)).mean(1))


class BiLSTM(nn.Module):
    """A 2-layer bidirectional LSTM with ``proj_size`` over packed sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.lstm = nn.LSTM(16, 16, num_layers=2, bidirectional=True, proj_size=8, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(ids), lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        return self.head(padded.sum(1) / lengths[:, None].to(padded.dtype))


class Speech(nn.Module):
    """A strided ``Conv1d`` front end, a ``GRU``, per-frame log-probabilities for CTC."""

    def __init__(self) -> None:
        super().__init__()
        self.front = nn.Conv1d(8, 16, 3, stride=2, padding=1)
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.out = nn.Linear(16, 6)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(F.relu(self.front(feats)).transpose(1, 2))
        return F.log_softmax(self.out(h).float(), -1)


class Sparse(nn.Module):
    """An ``EmbeddingBag`` (mean, per-bag offsets) and an ``Embedding`` with sparse gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(40, 16, mode="mean", sparse=True)
        self.emb = nn.Embedding(40, 16, sparse=True)
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, flat: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.bag(flat, offsets), self.emb(ids).mean(1)], -1))


class Convs(nn.Module):
    """Grouped, depthwise and transposed convolutions in 1, 2 and 3 dimensions."""

    def __init__(self) -> None:
        super().__init__()
        self.grouped = nn.Conv2d(8, 16, 3, padding=1, groups=4)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.up1 = nn.ConvTranspose1d(8, 8, 3, stride=2, padding=1, output_padding=1)
        self.up3 = nn.ConvTranspose3d(8, 4, (1, 2, 2), stride=(1, 2, 2), groups=4)
        self.head = nn.Linear(4 + 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(F.relu(self.depthwise(F.relu(self.grouped(x)))))
        line = self.up1(h.mean(2))
        vol = self.up3(h.unsqueeze(2))
        return self.head(torch.cat([vol.mean((2, 3, 4)), line.mean(2)], 1))


class Symmetric(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w.triu() + w.triu(1).transpose(-1, -2)

    def right_inverse(self, w: torch.Tensor) -> torch.Tensor:
        return w.triu()


class Scaled(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(n, 1))

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * self.scale


class Shifted(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(n))

    def forward(self, b: torch.Tensor) -> torch.Tensor:
        return b + self.shift


def _own_parametrizations() -> nn.Module:
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    parametrize.register_parametrization(m[2], "weight", Symmetric())
    parametrize.register_parametrization(m[2], "weight", Scaled(32))
    parametrize.register_parametrization(m[4], "bias", Shifted(4))
    return m


class Hyper(nn.Module):
    """A hypernetwork: one Linear makes the weights of the layer ``F.linear`` runs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.randn(4))
        self.make = nn.Linear(4, 16 * 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.make(self.embed).view(8, 16)
        return self.head(torch.tanh(F.linear(x, w.to(x.dtype) if w.dtype != x.dtype else w)))


class STN(nn.Module):
    """A spatial transformer: a localisation net predicts the affine map the image is resampled by."""

    def __init__(self) -> None:
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16, 6))
        nn.init.zeros_(self.loc[3].weight)
        with torch.no_grad():
            self.loc[3].bias.copy_(torch.tensor([1.0, 0.1, 0.0, -0.1, 1.0, 0.0]))
        self.body = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta = self.loc(x).view(-1, 2, 3)
        grid = F.affine_grid(theta.float(), list(x.shape), align_corners=False)
        warped = F.grid_sample(x, grid.to(x.dtype), align_corners=False)
        return self.head(F.relu(self.body(warped)).mean((2, 3)))


class Fold(nn.Module):
    """Patches by ``F.unfold``, each mixed by a Linear, put back by ``F.fold``."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(3 * 4, 3 * 4)
        self.body = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = F.unfold(x, 2, stride=2)
        mixed = self.mix(cols.transpose(1, 2)).transpose(1, 2)
        back = F.fold(mixed.to(x.dtype), x.shape[-2:], 2, stride=2)
        return self.head(F.relu(self.body(back)).mean((2, 3)))


class Audio(nn.Module):
    """``torch.stft`` magnitudes (log) into a Conv1d and a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(32))
        self.conv = nn.Conv1d(17, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(wave.float(), 32, 16, window=self.window, return_complex=True).abs().add(1e-4).log()
        return self.head(F.relu(self.conv(spec)).mean(2))


class GCN(nn.Module):
    """Two graph convolutions over a normalised sparse COO adjacency (``torch.sparse.mm``)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):  # (sparse.mm's backward fails under autocast)
            h = torch.sparse.mm(adj, self.l1(x).float())
        h = self.l2(F.relu(h))
        with torch.autocast("cpu", enabled=False):
            return torch.sparse.mm(adj, h.float())


class Adaptive(nn.Module):
    """A language-model head by ``nn.AdaptiveLogSoftmaxWithLoss`` (a head and two tail clusters)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(32, 60, cutoffs=[10, 30], div_value=2.0)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast("cpu", enabled=False):  # (its index_copy_ fails under autocast)
            out = self.asm(self.body(x).float(), target)
        return out.output, out.loss


class Coupling(nn.Module):
    def __init__(self, flip: bool) -> None:
        super().__init__()
        self.flip = flip
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.chunk(2, -1)
        if self.flip:
            a, b = b, a
        s, t = self.net(a).float().chunk(2, -1)
        s = torch.tanh(s)
        b = b * s.exp() + t
        return (torch.cat([b, a], -1) if self.flip else torch.cat([a, b], -1)), s.sum(-1)


class Flow(nn.Module):
    """RealNVP: affine coupling layers; returns the log-likelihood under a standard normal."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Coupling(i % 2 == 1) for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logdet = x.new_zeros(x.shape[0])
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        return -0.5 * (x**2).sum(-1) - 0.5 * x.shape[1] * math.log(2 * math.pi) + logdet


class Perceiver(nn.Module):
    """Learned latents cross-attending to the inputs, written with ``torch.einsum``."""

    def __init__(self) -> None:
        super().__init__()
        self.latents = nn.Parameter(torch.randn(4, 16))
        self.q, self.kv = nn.Linear(16, 16), nn.Linear(16, 32)
        self.ff = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(self.latents)
        k, v = self.kv(x).chunk(2, -1)
        att = torch.einsum("ld,btd->blt", q.to(k.dtype), k).div(4.0).softmax(-1)
        z = torch.einsum("blt,btd->bld", att, v)
        return self.head((z + self.ff(z)).mean(1))


class CrossMHA(nn.Module):
    """``nn.MultiheadAttention`` with keys and values of other widths (separate projections),
    averaged attention weights returned."""

    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(16, 2, kdim=8, vdim=12, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, w = self.att(q, k, v, need_weights=True, average_attn_weights=True)
        return self.head(y.mean(1)), w


class Decoder(nn.Module):
    """``nn.TransformerDecoder`` with a causal target mask and a memory padding mask."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(16, 4)

    def forward(self, tgt: torch.Tensor, memory: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.head(self.dec(tgt, memory, tgt_mask=causal, memory_key_padding_mask=pad))


class Nested(nn.Module):
    """Nested tensors (``torch.nested``, jagged or strided) through Linear layers: made from a
    list inside the forward (``inside``), or given to the root (then a dense head after it)."""

    def __init__(self, layout: torch.layout, inside: bool) -> None:
        super().__init__()
        self.layout, self.inside = layout, inside
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.head = nn.Linear(4, 4)

    def forward(self, x: Any) -> torch.Tensor:
        nt = torch.nested.nested_tensor(x, layout=self.layout) if self.inside else x
        out = self.body(nt)
        return self.head(out.values() if self.layout == torch.jagged else torch.cat(out.unbind()))


# --- the steps -----------------------------------------------------------------------------


def _adjacency(n: int = 10) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    edges = torch.randint(0, n, (2, 30), generator=g)
    edges = torch.cat([edges, torch.arange(n).repeat(2, 1)], 1)
    values = torch.ones(edges.shape[1])
    adj = torch.sparse_coo_tensor(edges, values, (n, n)).coalesce()
    deg = torch.sparse.sum(adj, 1).to_dense()
    idx = adj.indices()
    return torch.sparse_coo_tensor(idx, adj.values() / deg[idx[0]], (n, n)).coalesce()


def _cases() -> dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module, int, Enter], Any]]]:
    x, seq = torch.randn(8, 16), torch.randn(2, 6, 16)
    ids, lengths = torch.randint(0, 30, (3, 7)), torch.tensor([7, 3, 5])
    feats = torch.randn(2, 8, 20)
    targets, target_lengths = torch.randint(1, 6, (2, 4)), torch.tensor([4, 3])
    flat, offsets, bag_ids = (
        torch.randint(0, 40, (20,)),
        torch.tensor([0, 3, 3, 9, 12, 15, 17, 19]),
        torch.randint(0, 40, (8, 3)),
    )
    image8, image = torch.randn(2, 8, 8, 8).to(memory_format=torch.channels_last), torch.randn(2, 3, 8, 8)
    wave, nodes, adj = torch.randn(2, 256), torch.randn(10, 16), _adjacency()
    words = torch.randint(0, 60, (8,))
    memory, pad = torch.randn(2, 5, 16), torch.tensor([[False] * 5, [False, False, False, True, True]])
    keys, values = torch.randn(2, 5, 8), torch.randn(2, 5, 12)
    pieces = [torch.randn(3, 16), torch.randn(5, 16)]
    store: dict[int, Any] = {}

    def nested(layout: torch.layout) -> Callable[[nn.Module, int, Enter], Any]:
        return lambda m, i, enter: _train(m, torch.nested.nested_tensor(pieces, layout=layout), enter)

    def switch(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out, balance = m(torch.randn(10, 16))
        (out.float().pow(2).mean() + 0.01 * balance).backward()
        return out, balance

    def speech(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            logp = m(feats)
        loss = F.ctc_loss(logp.transpose(0, 1), targets, torch.tensor([10, 10]), target_lengths, zero_infinity=True)
        loss.backward()
        return logp, loss

    def sparse(m: nn.Module, i: int, enter: Enter) -> Any:
        sparse_opt, dense_opt = _state(
            m,
            lambda m: (
                torch.optim.SparseAdam([m.bag.weight, m.emb.weight], 1e-2),
                torch.optim.Adam(m.mlp.parameters(), 1e-2),
            ),
            store,
        )
        out = _train(m, flat, enter, offsets=offsets, ids=bag_ids)
        grads = (m.bag.weight.grad.to_dense().clone(), m.emb.weight.grad.to_dense().clone())
        sparse_opt.step()
        dense_opt.step()
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        return out, *grads

    def adaptive(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out, loss = m(x, words)
        loss.backward()
        return out, loss

    def flow(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            ll = m(torch.randn(8, 16))
        (-ll.float().mean()).backward()
        return ll

    def cross(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out, w = m(seq, keys, values)
        _backward(out)
        return out, w

    return {
        "switch-moe-capacity-bmm": (Switch, switch),
        "mamba-selective-scan": (SelectiveScan, lambda m, i, enter: _train(m, seq, enter)),
        "bilstm-proj-packed": (BiLSTM, lambda m, i, enter: _train(m, ids, enter, lengths=lengths)),
        "speech-ctc": (Speech, speech),
        "sparse-embeddings": (Sparse, sparse),
        "grouped-depthwise-transposed-convs": (Convs, lambda m, i, enter: _train(m, image8, enter)),
        "own-parametrizations": (_own_parametrizations, lambda m, i, enter: _train(m, x, enter)),
        "hypernetwork": (Hyper, lambda m, i, enter: _train(m, x, enter)),
        "spatial-transformer": (STN, lambda m, i, enter: _train(m, image, enter)),
        "fold-unfold": (Fold, lambda m, i, enter: _train(m, image, enter)),
        "stft-audio": (Audio, lambda m, i, enter: _train(m, wave, enter)),
        "sparse-gcn": (GCN, lambda m, i, enter: _train(m, nodes, enter, adj=adj)),
        "adaptive-log-softmax": (Adaptive, adaptive),
        "realnvp-flow": (Flow, flow),
        "perceiver-einsum": (Perceiver, lambda m, i, enter: _train(m, seq, enter)),
        "mha-kdim-vdim": (CrossMHA, cross),
        "nested-jagged-inside": (lambda: Nested(torch.jagged, True), lambda m, i, enter: _train(m, pieces, enter)),
        "nested-strided-inside": (lambda: Nested(torch.strided, True), lambda m, i, enter: _train(m, pieces, enter)),
        "nested-jagged-root": (lambda: Nested(torch.jagged, False), nested(torch.jagged)),
        "nested-strided-root": (lambda: Nested(torch.strided, False), nested(torch.strided)),
        "transformer-decoder-masks": (
            Decoder,
            lambda m, i, enter: _train(m, seq[:, :4], enter, memory=memory, pad=pad),
        ),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_models_measured_match_the_fixed_precision(case: str, measuring: Any, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,), measured=True)


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_models_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,))


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
