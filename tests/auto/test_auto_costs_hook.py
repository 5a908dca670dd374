"""Issue 28, class-level: the costs an adapter's ``ampcore_auto_costs`` hook returns go
through the same validator as arguments: anything but finite non-negative numbers is a
PluginError naming the hook and the key, never a decision made on nan."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import make_adapter
from torch import nn

import ampcore


@pytest.mark.parametrize(
    ("costs", "words"),
    [
        ({"fp32_ms": float("nan"), "low_ms": 0.5}, "fp32_ms = nan"),
        ({"fp32_ms": 1.0, "low_ms": "b"}, "low_ms = 'b'"),
        ({"fp32_ms": 1.0, "low_ms": 0.5, "cast_ms": -1.0}, "cast_ms = -1.0"),
        ({"fp32_ms": 10**400, "low_ms": 0.5}, "fp32_ms = <a number too large for a float>"),
        ({"fp32_ms": float("inf"), "low_ms": 0.5}, "fp32_ms = inf"),
        ({"fp32_ms": True, "low_ms": 0.5}, "fp32_ms = True"),
    ],
)
def test_costs_from_the_hook_are_validated(register: Any, costs: dict[str, Any], words: str) -> None:
    register(make_adapter("badcosts", ampcore_auto_costs=lambda shape_class, dtype: costs), name="badcosts")
    with pytest.raises(ampcore.PluginError, match="ampcore_auto_costs") as info:
        with ampcore.autocast("badcosts", level="auto"):
            nn.Linear(8, 8)(torch.randn(4, 8))
    assert words in str(info.value)
