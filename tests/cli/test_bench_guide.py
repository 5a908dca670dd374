"""``ampcore bench`` reproduces the guide (issue 30): Paddle's Linear (matmul + a separate bias
add, Xavier-uniform weights, zero bias), so the guide's custom list changes something and the
losses start where the guide's do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ampcore
from ampcore._cli.bench import format_result
from ampcore._cli.experiment import BenchResult, BenchSettings, GuideLinear, ModeResult, SeedNet, run_bench


def test_guide_linear_is_paddles_layout_and_initialisation() -> None:
    torch.manual_seed(0)
    layer = GuideLinear(512, 256)
    assert layer.weight.shape == (512, 256) and torch.equal(layer.bias, torch.zeros(256))
    bound = (6.0 / (512 + 256)) ** 0.5  # Xavier uniform
    assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.95 * bound
    x = torch.rand(3, 512)
    assert torch.allclose(layer(x), x @ layer.weight + layer.bias)


def test_the_guides_custom_white_list_changes_the_bias_add() -> None:
    """torch.autocast runs the add in float32 (widest input); AMP-O1's list runs it low."""
    layer, x = GuideLinear(8, 8), torch.rand(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.float32
    with ampcore.autocast("cpu", dtype=torch.bfloat16, level="O1", custom_white_list={"elementwise_add"}):
        assert layer(x).dtype == torch.bfloat16
    linear = nn.Linear(8, 8)  # torch's Linear fuses the add (addmm): the list changes nothing
    with ampcore.autocast("cpu", dtype=torch.bfloat16, level="O1", custom_white_list={"elementwise_add"}):
        assert linear(x).dtype == torch.bfloat16


def test_the_guides_initialisation_gives_the_guides_loss() -> None:
    """Uniform [0, 1) data and labels: about 2/3 with Xavier weights (the guide's ~0.65), about
    1/3 with torch's default initialisation."""
    torch.manual_seed(0)
    size = 256
    x, y = torch.rand(64, size), torch.rand(64, size)
    guide = nn.functional.mse_loss(SeedNet(size)(x), y).item()
    torch_default = nn.functional.mse_loss(nn.Sequential(*[nn.Linear(size, size) for _ in range(9)])(x), y).item()
    assert 0.6 < guide < 0.72 and 0.3 < torch_default < 0.37


def test_bench_amp_o1_differs_from_torch_autocast_in_its_losses() -> None:
    result = run_bench(
        BenchSettings(device="cpu", size=64, batch=16, steps=2, isolate=False, modes=("torch.autocast", "AMP-O1"))
    )
    native, amp = result.results
    assert 0.6 < native.losses[0] < 0.75
    assert native.losses != amp.losses  # the bias adds run in bfloat16 under AMP-O1 only


def _fake(repeats: int) -> BenchResult:
    result = BenchResult("cpu", "cpu", "bfloat16", 64, 8, 2, 0, 1e-4, {}, repeats=repeats, load_average=9.0, cpus=2)
    result.results = [ModeResult("fp32", 1.0, [1.0, 1.0], [0.6, 0.6], 0.6, None, None)]
    return result


@pytest.mark.parametrize(("repeats", "advice"), [(1, "--repeats 3"), (3, "already had 3 repeats")])
def test_the_unreliable_warning_does_not_suggest_what_the_run_did(repeats: int, advice: str) -> None:
    text = format_result(_fake(repeats)).replace("\n", " ")
    assert advice in text
    if repeats >= 3:
        assert "--repeats 3" not in text
