"""What the tests of both one-pass CPU kernels share (``test_onepass.py``, the fused
flavour; ``test_onepass_loop.py``, the for-loop flavour): the SGD options each kernel is
compared on against torch's, and the thread counts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

#: momentum-free, weight decay and maximize, momentum, Nesterov, dampening; some with a
#: GradScaler's scale the kernel divides by
SGD_CASES: list[dict[str, Any]] = [
    {"weight_decay": 0.0, "momentum": 0.0, "dampening": 0.0, "nesterov": False, "maximize": False},
    {"weight_decay": 0.01, "momentum": 0.0, "dampening": 0.0, "nesterov": False, "maximize": True, "scale": 64.0},
    {"weight_decay": 0.01, "momentum": 0.9, "dampening": 0.0, "nesterov": False, "maximize": False},
    {"weight_decay": 0.01, "momentum": 0.9, "dampening": 0.0, "nesterov": True, "maximize": True},
    {"weight_decay": 0.0, "momentum": 0.5, "dampening": 0.3, "nesterov": False, "maximize": False, "scale": 16.0},
]


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch's intra-op threads for the test (one, and two: the kernels split as torch does)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
