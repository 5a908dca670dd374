"""What the tests of both one-pass CPU kernels share (``test_onepass.py``, the fused
flavour; ``test_onepass_loop.py``, the for-loop flavour): the SGD options each kernel is
compared on against torch's, and the thread counts."""

from __future__ import annotations

import os
import subprocess
import sys
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


def run_at_capability(script: str, capability: str) -> None:
    """Run ``script`` (it prints the capability torch dispatched and the kernel chosen, then
    checks the kernel) in a process whose torch dispatches ``capability``
    (``ATEN_CPU_CAPABILITY``), with this folder importable; it must pass and have chosen the
    one-pass kernel at that capability."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "AMPCORE_O2_ONEPASS": "auto"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert first == f"{capability.upper()} onepass", done.stdout
