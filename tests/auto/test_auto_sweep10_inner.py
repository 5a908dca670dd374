"""Issue 27, tenth held-out sweep: ops outside torch.autocast's lists whose kernels run
products of the lists inside (``F.affine_grid``'s ``affine_grid_generator`` runs ``bmm``,
``nn.Bilinear``'s ``_trilinear`` runs ``bmm``).

While a root call records, a dispatch mode (``_recording._Outside``) watches the ops
outside planned modules; a dispatch mode's handler runs each op with autocast's key
excluded, so such an op ran its inner products in float32 on the recorded call, where
torch.autocast (and every later call of the program) runs them in low precision: the
spatial transformer of ``test_auto_sweep10.py`` differed from the fixed precision on its
first step.  Here every op of a broad list of functionals runs under autocast with and
without the recording's mode: the same values and dtypes (a torch that adds such an op
fails this test instead of drifting silently).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Final

import pytest
import torch
import torch.nn.functional as F
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, FP16, _train, run
from torch import nn

from ampcore._auto import _recording

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    return {
        "x": r(4, 8),
        "th": r(2, 2, 3),
        "th3": r(2, 3, 4),
        "img": r(2, 3, 8, 8),
        "w": r(6, 8),
        "q": r(5, 2, 8),
        "E": r(10, 8),
        "v": r(8),
        "big": r(30, 8),
        "W": r(32, 8),
        "k": r(3, 4, 2, 2),
        "B": r(3, 8, 8),
        "tbc": r(3, 8, 4),
    }


#: functionals of every kind: products, distances, cells, attention, norms, losses, spectral,
#: sampling, linear algebra (inputs from :func:`_inputs`)
FUNCTIONALS: Final[dict[str, Callable[[dict[str, torch.Tensor]], Any]]] = {
    "affine_grid": lambda t: F.affine_grid(t["th"], [2, 3, 8, 8], align_corners=False),
    "affine_grid-3d": lambda t: F.affine_grid(t["th3"], [2, 3, 4, 4, 4], align_corners=True),
    "bilinear": lambda t: F.bilinear(t["x"], t["x"], t["B"]),
    "grid_sample": lambda t: F.grid_sample(t["img"], t["img"][:, :2].permute(0, 2, 3, 1).tanh(), align_corners=False),
    "embedding_bag-weights": lambda t: F.embedding_bag(
        torch.arange(12) % 10, t["E"], torch.tensor([0, 4, 8]), mode="sum", per_sample_weights=t["big"][:12, 0]
    ),
    "mha-need-weights": lambda t: F.multi_head_attention_forward(
        t["q"],
        t["q"],
        t["q"],
        8,
        2,
        t["big"][:24],
        t["big"][:24, 0],
        None,
        None,
        False,
        0.0,
        t["w"][:1].repeat(8, 1),
        t["v"],
        need_weights=True,
    ),  # fmt: skip
    "addmv": lambda t: torch.addmv(t["v"][:6], t["w"], t["v"]),
    "addr": lambda t: torch.addr(t["w"], t["v"][:6], t["v"]),
    "mv": lambda t: torch.mv(t["w"], t["v"]),
    "dot": lambda t: torch.dot(t["v"], t["v"].flip(0)),
    "kron": lambda t: torch.kron(t["x"], t["x"][:2]),
    "inner-outer": lambda t: (torch.inner(t["x"], t["x"]), torch.outer(t["v"], t["v"])),
    "multi_dot": lambda t: torch.linalg.multi_dot([t["x"], t["x"].t(), t["x"]]),
    "tensordot-einsum": lambda t: (torch.tensordot(t["x"], t["x"].t(), 1), torch.einsum("ij,kj->ik", t["x"], t["x"])),
    "baddbmm": lambda t: torch.baddbmm(t["x"][:2, :2].expand(2, 2, 2), t["q"][:2], t["q"][:2].transpose(1, 2)),
    "matrix_power": lambda t: torch.linalg.matrix_power(t["x"][:, :4], 3),
    "cdist-pdist": lambda t: (torch.cdist(t["big"], t["big"]), F.pdist(t["x"])),
    "pinverse": lambda t: torch.pinverse(t["x"]),
    "cosine-triplet": lambda t: (
        F.cosine_similarity(t["x"], t["x"].flip(0)),
        F.triplet_margin_loss(t["x"], t["x"].flip(0), t["x"] + 1),
    ),
    "norms": lambda t: (
        F.group_norm(t["img"], 3),
        F.layer_norm(t["x"], (8,)),
        F.batch_norm(t["img"], None, None, training=True),
    ),
    "conv-transposed-tbc": lambda t: (
        F.conv_transpose2d(t["img"], t["k"]),
        torch.conv_tbc(t["q"], t["tbc"], t["v"][:4]),
    ),
    "cells": lambda t: (
        torch.lstm_cell(t["x"], (t["x"], t["x"]), t["W"], t["W"])[0],
        torch.gru_cell(t["x"], t["x"], t["big"][:24], t["big"][:24]),
        torch.rnn_tanh_cell(t["x"], t["x"], t["w"][:1].repeat(8, 1), t["w"][:1].repeat(8, 1)),
    ),
    "lstm": lambda t: torch.lstm(
        t["q"], (t["q"][:1], t["q"][:1]), [t["W"], t["W"]], False, 1, 0.0, False, False, False
    )[0],
    "ctc": lambda t: F.ctc_loss(
        t["big"][:20].reshape(10, 2, 8)[:, :, :6].log_softmax(-1),
        torch.tensor([[1, 2, 3, 4], [2, 3, 4, 5]]),
        torch.tensor([10, 10]),
        torch.tensor([4, 3]),
    ),  # fmt: skip
    "stft-istft": lambda t: torch.istft(
        torch.stft(t["big"].flatten()[:128].reshape(2, 64), 16, window=torch.hann_window(16), return_complex=True),
        16,
        window=torch.hann_window(16),
    ),  # fmt: skip
    "sdpa": lambda t: F.scaled_dot_product_attention(t["q"][None], t["q"][None], t["q"][None]),
    "interpolate": lambda t: (
        F.interpolate(t["img"], scale_factor=2.0, mode="bilinear"),
        F.interpolate(t["img"], size=5),
    ),
    "fold-unfold": lambda t: F.fold(F.unfold(t["img"], 2, stride=2), (8, 8), 2, stride=2),
    "losses": lambda t: (
        F.cross_entropy(t["x"], torch.arange(4), label_smoothing=0.1),
        F.kl_div(t["x"].log_softmax(-1), t["x"].softmax(-1), reduction="batchmean"),
        F.huber_loss(t["x"], t["x"].flip(0)),
    ),
    "prelu-softplus": lambda t: (F.prelu(t["x"], torch.tensor([0.25])), F.softplus(t["x"])),
    "cumsum-prod": lambda t: (t["x"].cumsum(0), t["x"].prod(1)),
    "matmul-1d": lambda t: torch.matmul(t["v"], t["w"].t()),
}


def _rows(out: Any) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [o for o in out if isinstance(o, torch.Tensor)]


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(FUNCTIONALS))
def test_an_op_outside_planned_modules_runs_as_torch_autocast_runs_it_while_recording(
    name: str, dtype: torch.dtype
) -> None:
    rec = types.SimpleNamespace(dynamic=False, planned=0, low_outside=False, outside=False)
    t = _inputs()
    with torch.autocast("cpu", dtype=dtype):
        try:
            want = _rows(FUNCTIONALS[name](t))
        except RuntimeError as exc:  # (oneDNN has no float16 LSTM here)
            pytest.skip(f"torch.autocast itself raises: {exc}"[:120])
        with _recording._Outside(rec, frozenset(), "cpu"):  # type: ignore[arg-type]
            got = _rows(FUNCTIONALS[name](t))
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


class Warp(nn.Module):
    """A localisation Linear, ``F.affine_grid`` (its ``bmm`` low under autocast) and
    ``F.grid_sample`` in the root's forward, outside planned modules."""

    def __init__(self) -> None:
        super().__init__()
        self.loc, self.body, self.head = nn.Linear(16, 6), nn.Conv2d(2, 8, 3, padding=1), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        theta = self.loc(x).float().view(-1, 2, 3)
        grid = F.affine_grid(theta, list(image.shape), align_corners=False).float()
        return self.head(F.relu(self.body(F.grid_sample(image, grid, align_corners=False))).mean((2, 3)))


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_affine_grid_in_a_root_matches_the_fixed_precision_from_the_first_call(
    dtype: torch.dtype, recordings: list[Any]
) -> None:
    x, image = torch.randn(2, 16), torch.randn(2, 2, 8, 8)
    run(Warp, lambda m, i, enter: _train(m, x, enter, dtype, image=image), 3, recordings, (dtype,))


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
