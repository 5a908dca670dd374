"""Level O2's BatchNorm layers: float32 weights and statistics, low-precision activations
where the device's batch-norm kernel mixes dtypes (no float32 island)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import ampcore
import ampcore._o2.decorate as decorate_module
from ampcore._o2.fp32_modules import plain_batch_norm
from ampcore._o2.mixed_norm import mixed_batch_norm

BF16, FP32 = torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _quiet_emulation() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*runs emulated", ampcore.AmpcoreWarning)
        yield


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4)
    )


def input_dtypes(module: nn.Module) -> list[torch.dtype]:
    """The dtypes of the input ``module``'s forward receives (after the hooks decorate put)."""
    seen: list[torch.dtype] = []
    module.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    return seen


def test_the_cpu_kernels_mix_dtypes_and_a_failing_device_says_no() -> None:
    mixed_batch_norm.cache_clear()
    with torch.no_grad():  # decorate under no_grad or inference_mode gets the same answer
        assert mixed_batch_norm("cpu", BF16)
    with torch.inference_mode():
        assert mixed_batch_norm("cpu", torch.float16)
    assert not mixed_batch_norm("meta", BF16)  # no values to check: the probe fails, the island stays


def test_only_torchs_own_batchnorm_forward_runs_without_an_island() -> None:
    class Custom(nn.BatchNorm1d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    assert plain_batch_norm(nn.BatchNorm1d(2)) and plain_batch_norm(nn.LazyBatchNorm2d())
    assert not plain_batch_norm(nn.SyncBatchNorm(2))  # its own kernels
    assert not plain_batch_norm(Custom(2)) and not plain_batch_norm(nn.LayerNorm(2))


def test_batchnorm_takes_low_precision_inputs_and_keeps_float32_state() -> None:
    model = ampcore.decorate(cnn(), device="cpu")
    seen = input_dtypes(model[1])
    with ampcore.autocast(device="cpu", level="O2"):
        out = model(torch.randn(2, 3, 8, 8))
    assert seen == [BF16]  # no island casting it to float32 first (its hook would run before this one)
    assert out.dtype == BF16
    assert {t.dtype for t in (*model[1].parameters(), model[1].running_mean, model[1].running_var)} == {FP32}
    assert model[1].num_batches_tracked.item() == 1 and model[1].running_mean.abs().sum() > 0


def test_a_device_without_mixed_kernels_keeps_the_float32_island(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decorate_module, "mixed_batch_norm", lambda device, low: False)
    model = ampcore.decorate(cnn(), device="cpu")
    seen = input_dtypes(model[1])
    with ampcore.autocast(device="cpu", level="O2"):
        out = model(torch.randn(2, 3, 8, 8))
    assert seen == [FP32] and out.dtype == BF16


def _train(model: nn.Module, level: str, steps: int = 3) -> tuple[list[float], list[torch.Tensor]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    losses = []
    torch.manual_seed(1)
    for _ in range(steps):
        with ampcore.autocast(device="cpu", level=level):
            out = model(torch.randn(4, 3, 8, 8))
        loss = out.float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    state = [model[i].running_mean.clone() for i in (1, 4)] + [model[i].running_var.clone() for i in (1, 4)]
    return losses, state + [p.detach().float().clone() for p in model.parameters()]


@pytest.mark.parametrize("level", ["O2", "O1"])
def test_training_matches_the_island(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mixed kernel computes in float32 from the same low-precision values the island
    widens exactly: losses, statistics and weights agree to bf16 rounding."""
    mixed = _train(cnn(), level)
    monkeypatch.setattr(decorate_module, "mixed_batch_norm", lambda device, low: False)
    island = _train(cnn(), level)
    torch.testing.assert_close(mixed[0], island[0], rtol=2e-2, atol=1e-3)
    for a, b in zip(mixed[1], island[1], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


def test_a_float32_input_still_hands_on_low_precision() -> None:
    """After a float32 (excluded) layer the BatchNorm gets float32: it computes in float32
    and its output goes back to the model's dtype, as the island's did."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    ampcore.decorate(model, device="cpu", excluded_layers=[model[0]])
    seen = input_dtypes(model[1])
    out = model(torch.randn(3, 4))  # no autocast: the next layer's bf16 weight needs a bf16 input
    assert seen == [FP32] and out.dtype == BF16


def test_deepcopy_and_state_dict_keep_working() -> None:
    model = ampcore.decorate(cnn(), device="cpu")
    clone: Any = copy.deepcopy(model)
    clone.load_state_dict(model.state_dict())
    with ampcore.autocast(device="cpu", level="O2"):
        assert clone(torch.randn(1, 3, 8, 8)).dtype == BF16
