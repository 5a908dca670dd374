"""AmpcoreAccelerator trains exactly as the raw ampcore loop: accumulation, clipping, O2,
and the scaler in save_state/load_state."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampcore

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install ampcore[accelerate])")
from ampcore.integrations import AmpcoreSettings  # noqa: E402
from ampcore.integrations.accelerate import AmpcoreAccelerator  # noqa: E402

ACCUMULATE = 2
MICRO_STEPS = 8


@dataclass
class TinyConfig:
    features: int = 8
    hidden: int = 16
    outputs: int = 4


def build(config: TinyConfig) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(config.features, config.hidden), nn.GELU(), nn.Linear(config.hidden, config.outputs))


def settings(level: str) -> AmpcoreSettings:
    return AmpcoreSettings(
        device="cpu", level=level, dtype="float16", custom_black_list={"gelu"},
        scaler={"init_scale": 2.0**10, "growth_interval": 2},
    )  # fmt: skip


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(MICRO_STEPS)]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out.float(), y)


def clip_targets(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def raw_loop(level: str) -> tuple[list[float], nn.Module, ampcore.GradScaler]:
    config = settings(level)
    model = build(TinyConfig())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = config.decorate_models(model, opt)
    scaler = config.make_scaler()
    assert scaler is not None
    losses = []
    for index, (x, y) in enumerate(batches()):
        with config.autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss / ACCUMULATE).backward()
        losses.append(loss.item())
        if (index + 1) % ACCUMULATE == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(clip_targets(model, opt), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    return losses, model, scaler


def accelerate_loop(level: str) -> tuple[list[float], nn.Module, AmpcoreAccelerator]:
    accelerator = AmpcoreAccelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE, ampcore=settings(level))
    model = build(TinyConfig())
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    losses = []
    for x, y in batches():
        with accelerator.accumulate(model):
            with accelerator.autocast():
                loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses, model, accelerator


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_accelerator_matches_the_raw_loop(level: str) -> None:
    want, model, scaler = raw_loop(level)
    got, prepared, accelerator = accelerate_loop(level)
    assert got == want
    for (name, value), other in zip(model.state_dict().items(), prepared.state_dict().values(), strict=False):
        assert torch.equal(other, value), name
    assert accelerator.scaler is not None and accelerator.scaler.get_scale() == scaler.get_scale() != 2.0**10


def test_save_state_and_load_state_carry_the_scaler(tmp_path: Path) -> None:
    _, _, accelerator = accelerate_loop("O1")
    scale = accelerator.scaler.get_scale()
    accelerator.save_state(str(tmp_path / "state"))
    fresh = AmpcoreAccelerator(cpu=True, ampcore=settings("O1"))
    model = build(TinyConfig())
    fresh.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    fresh.load_state(str(tmp_path / "state"))
    assert fresh.scaler is not None and fresh.scaler.get_scale() == scale


def test_accelerates_own_mixed_precision_is_refused() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="leave Accelerate's off"):
        AmpcoreAccelerator(cpu=True, mixed_precision="bf16")
