"""The Lightning precision plugins train exactly as the raw ampcore loop (Trainer and Fabric)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ampcore

lightning = pytest.importorskip("lightning", reason="lightning is not installed (pip install ampcore[lightning])")
from ampcore.integrations import AmpcoreSettings  # noqa: E402
from ampcore.integrations.lightning import AmpcoreFabricPrecision, AmpcorePrecision  # noqa: E402

STEPS = 4
SETTINGS: dict[str, Any] = {
    "device": "cpu",
    "level": "O1",
    "dtype": "float16",
    "custom_black_list": {"gelu"},
    "scaler": {"init_scale": 2.0**10, "growth_interval": 2},
}


@dataclass
class TinyConfig:
    features: int = 8
    hidden: int = 16
    outputs: int = 4


def build(config: TinyConfig) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(config.features, config.hidden), nn.GELU(), nn.Linear(config.hidden, config.outputs))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 8, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(STEPS)]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out.float(), y)


def raw_loop(level: str = "O1") -> tuple[list[torch.Tensor], nn.Module, ampcore.GradScaler]:
    settings = AmpcoreSettings(**{**SETTINGS, "level": level})
    model = build(TinyConfig())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = settings.decorate_models(model, opt)
    scaler = settings.make_scaler()
    assert scaler is not None
    losses = []
    for x, y in batches():
        with settings.autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses, model, scaler


class Module(lightning.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = build(TinyConfig())
        self.losses: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        loss = loss_fn(self(batch[0]), batch[1])
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(plugin: AmpcorePrecision, **kwargs: Any) -> Any:
    return lightning.Trainer(
        accelerator="cpu", devices=1, max_steps=STEPS, plugins=[plugin], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, **kwargs,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_trainer_plugin_matches_the_raw_loop(level: str, tmp_path: Path) -> None:
    want, model, scaler = raw_loop(level)
    plugin = AmpcorePrecision(AmpcoreSettings(**{**SETTINGS, "level": level}))
    module = Module()
    run = trainer(plugin)
    run.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches(), batch_size=None))
    assert [float(v) for v in module.losses] == [float(v) for v in want]
    got = module.net.state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(got[name], value), name
    assert plugin.scaler.get_scale() == scaler.get_scale() != 2.0**10  # it grew: the scaler ran
    run.save_checkpoint(tmp_path / "last.ckpt")
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["AmpcorePrecision"]["scale"] == scaler.get_scale()


def test_fabric_plugin_matches_the_raw_loop() -> None:
    want, model, _ = raw_loop()
    fabric = lightning.Fabric(accelerator="cpu", devices=1, plugins=AmpcoreFabricPrecision(**SETTINGS))
    net = build(TinyConfig())
    net, opt = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    losses = []
    for x, y in batches():
        with fabric.autocast():
            loss = loss_fn(net(x), y)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    assert [float(v) for v in losses] == [float(v) for v in want]
    for (name, value), got in zip(model.state_dict().items(), net.state_dict().values(), strict=False):
        assert torch.equal(got, value), name


def test_fabric_o2_needs_a_decorated_model() -> None:
    fabric = lightning.Fabric(accelerator="cpu", devices=1, plugins=AmpcoreFabricPrecision(device="cpu", level="O2"))
    net = build(TinyConfig())
    with pytest.raises(ampcore.AmpcoreError, match="Decorate it with its optimizers before fabric.setup"):
        fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))


def test_settings_or_keywords_not_both() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="not both"):
        AmpcorePrecision(AmpcoreSettings(), level="O1")
    with pytest.raises(ampcore.AmpcoreError, match="level"):
        AmpcorePrecision(device="cpu", level="O3")
