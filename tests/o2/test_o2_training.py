"""O1 and O2 train a small transformer on a real dataset to fp32's accuracy.

The data are scikit-learn's handwritten digits (1,797 8x8 images shipped inside the
package, no download), split 1,397 / 400.  Each image is read as 8 tokens, its rows (8
pixel values each): a linear row embedding plus a position embedding (``nn.Embedding``),
one pre-norm transformer block (LayerNorm, multi-head attention, MLP) and a linear head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import ampcore

datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn (a test extra) ships the digits")

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
STEPS, BATCH, ROWS = 200, 64, 8


class DigitTransformer(nn.Module):
    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.rows = nn.Linear(ROWS, width)
        self.positions = nn.Embedding(ROWS, width)
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm3 = nn.LayerNorm(width)
        self.head = nn.Linear(ROWS * width, 10)
        self.register_buffer("index", torch.arange(ROWS), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.rows(images) + self.positions(self.index)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        return self.head(self.norm3(x).flatten(1))


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    images, labels = datasets.load_digits(return_X_y=True)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    x = (torch.as_tensor(images, dtype=torch.float32) / 16).view(-1, ROWS, ROWS)[order]
    y = torch.as_tensor(labels, dtype=torch.long)[order]
    return x[:1397], y[:1397], x[1397:], y[1397:]


def train(mode: str) -> tuple[float, nn.Module]:
    torch.manual_seed(0)
    model = DigitTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    region: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext
    if mode == "O1":
        region = lambda: ampcore.autocast(device="cpu", level="O1")  # noqa: E731
    elif mode == "O2":
        model, opt = ampcore.decorate(model, opt, level="O2", device="cpu")
        region = lambda: ampcore.autocast(device="cpu", level="O2")  # noqa: E731
    scaler = ampcore.GradScaler("cpu")
    x_train, y_train, x_test, y_test = digits()
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        index = torch.randint(0, len(y_train), (BATCH,), generator=gen)
        opt.zero_grad()
        with region():
            loss = nn.functional.cross_entropy(model(x_train[index]), y_train[index])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    with torch.no_grad(), region():
        predicted = model(x_test).argmax(dim=1)
    return 100.0 * float((predicted == y_test).float().mean()), model


@pytest.fixture(scope="module")
def accuracy() -> Iterator[dict[str, tuple[float, nn.Module]]]:
    yield {mode: train(mode) for mode in ("fp32", "O1", "O2")}


@pytest.mark.filterwarnings("ignore:.*runs emulated")
@pytest.mark.parametrize(("dtype", "norms"), [(BF16, BF16), (FP16, FP32)])
def test_parameter_dtypes_follow_the_o2_rules(dtype: torch.dtype, norms: torch.dtype) -> None:
    model = ampcore.decorate(DigitTransformer(), dtype=dtype, device="cpu")
    for name, param in model.named_parameters():
        want = norms if name.startswith("norm") else dtype
        assert param.dtype == want, name


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["O1", "O2"])
def test_reaches_fp32_accuracy_within_one_point(accuracy: dict[str, tuple[float, nn.Module]], mode: str) -> None:
    fp32, _ = accuracy["fp32"]
    got, _ = accuracy[mode]
    assert fp32 > 90.0, f"fp32 only reached {fp32:.1f}%: the task did not train"
    assert abs(got - fp32) <= 1.0, f"{mode}: {got:.2f}% vs fp32 {fp32:.2f}%"


@pytest.mark.slow
def test_the_o2_model_trained_in_low_precision(accuracy: dict[str, tuple[float, nn.Module]]) -> None:
    _, model = accuracy["O2"]
    assert model.attention.in_proj_weight.dtype == BF16 and model.norm1.weight.dtype == BF16
