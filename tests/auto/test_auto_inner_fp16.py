"""Issue 27, fourteenth stop: an inner ``ampcore.autocast(level="auto", dtype=float16)``
region a forward enters inside a bfloat16 auto region.

fp16fwd (thirteenth stop) found its cases matched the fixed-precision reference only where
both dtypes' plans were loaded with the same decisions.  Not a fault of auto: the inner
region decides its layers by its *own* dtype's plan (float16 figures, measured where the
float16 plan lacks them), while the tests' reference (``_auto_testing.fixed``) applies the
outer region's bfloat16 plan inside an inner auto region; with an empty float16 plan the
two differ wherever float16's figures decide otherwise than bfloat16's.  These tests pin the
semantics: whatever the recording history (the root's program recorded outside the inner
region or inside it) and the root's program's default, the inner layers follow the float16
plan's measured decisions, not the bfloat16 plan's.  A fake clock decides every float16
class (no wall-clock threshold).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_forward_regions import OFFS, Rooted, _steps
from test_auto_root_check import budget  # noqa: F401 (fixture: the process's measuring budget, fresh)
from test_auto_sweep3 import BF16, FP16, _auto, _decide
from torch import nn

from ampcore._auto import _hooks

pytestmark = pytest.mark.usefixtures("auto_state", "budget")


def _clock(low_wins: bool) -> Callable[[Callable[[], None], str], float]:
    figures = {"fp32": 2.0, "low": 1.0} if low_wins else {"fp32": 1.0, "low": 2.0}

    def clock(run: Callable[[], None], label: str) -> float:
        run()
        return figures.get(label, 0.1)

    return clock


@pytest.mark.parametrize("low_wins", [True, False], ids=["float16-wins", "float32-wins"])
@pytest.mark.parametrize("wide", [False, True], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("offs", ["recorded-outside", "recorded-inside"])
def test_an_inner_float16_auto_region_follows_the_float16_plan(
    monkeypatch: pytest.MonkeyPatch, low_wins: bool, wide: bool, offs: str
) -> None:
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: _clock(low_wins))
    torch.manual_seed(0)
    model = Rooted("ampcore-auto-fp16", wide)
    steps = OFFS[offs]
    step = _steps(steps, BF16)
    _decide(model, step, len(steps), (BF16,))  # the bfloat16 plan: Linear(16, *) float32, the others low
    seen: list[torch.dtype] = []
    inner = [m for m in model.block.layers if isinstance(m, nn.Linear)]
    for m in inner:
        m.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    found: list[Any] = []
    for i, off in enumerate(steps):
        seen.clear()
        step(model, i, _auto)
        if off:
            found.append(tuple(seen))
    assert any(m.in_features == 16 for m in inner) and any(m.in_features != 16 for m in inner)
    want = (FP16 if low_wins else torch.float32,) * len(inner)  # every class as float16's figures say
    assert found == [want] * len(found) and found
