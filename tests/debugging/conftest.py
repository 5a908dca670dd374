"""Models for the debugging tools: one with a planted float16 overflow, one with attention."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

#: exp overflows float16 (max 65504) for inputs above log(65504) ~ 11.09, float32 above ~88.7.
FP16_EXP_LIMIT = math.log(torch.finfo(torch.float16).max)
FP32_EXP_LIMIT = math.log(torch.finfo(torch.float32).max)


class Planted(nn.Module):
    """``exp`` of a linear layer's output: finite in float32, inf in float16 for inputs > 11.09."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.proj(x))


class PlantedNet(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(width, width), nn.ReLU(), Planted(width), nn.Linear(width, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class AttentionNet(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.attn(x, x, x)  # need_weights: the bmm + softmax path, not fused SDPA
        return self.head(y)


@pytest.fixture
def planted() -> tuple[PlantedNet, torch.Tensor]:
    """An eval-mode PlantedNet and a batch whose ``exp`` input lies in (11.09, 88.7):
    the float32 forward is finite, the float16 one overflows at ``blocks.2``'s ``exp``."""
    torch.manual_seed(0)
    net = PlantedNet().eval()
    with torch.no_grad():
        proj = net.blocks[2].proj
        proj.weight.copy_(torch.eye(8) * 20)
        proj.bias.zero_()
        x = torch.randn(16, 8)
        exp_input = proj(net.blocks[1](net.blocks[0](x)))
    assert FP16_EXP_LIMIT < float(exp_input.max()) < FP32_EXP_LIMIT
    assert torch.isfinite(net(x)).all()
    return net, x


@pytest.fixture
def attention() -> tuple[AttentionNet, torch.Tensor]:
    torch.manual_seed(0)
    return AttentionNet(), torch.randn(2, 5, 8)
