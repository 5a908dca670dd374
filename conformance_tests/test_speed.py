"""Speed report: float32 vs ``ampcore.autocast`` on a small MLP (measured, never asserted).

The medians go into report.json and report.md.  The check itself only makes sure the
timed autocast run really ran in the low-precision dtype, so the numbers mean something.
"""

from __future__ import annotations

import statistics

import torch

import ampcore
from ampcore_conformance._checks import make_mlp, region, timed
from ampcore_conformance._context import SuiteContext, dtype_name

WIDTH, DEPTH, BATCH, REPEATS = 128, 4, 128, 7


def _sync(device: torch.device) -> None:
    synchronize = getattr(getattr(torch, device.type, None), "synchronize", None)
    if callable(synchronize):
        synchronize()


def test_speed_report(amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    model = make_mlp(amp_device, width=WIDTH, depth=DEPTH, n_in=WIDTH, n_out=WIDTH)
    x = torch.randn(BATCH, WIDTH, device=amp_device)
    dtypes: list[torch.dtype] = []

    def step(enabled: bool) -> None:
        model.zero_grad(set_to_none=True)
        with region(amp_backend, amp_dtype, enabled=enabled):
            out = model(x)
        dtypes.append(out.dtype)
        out.float().pow(2).mean().backward()

    for enabled in (False, True, False, True):  # warm-up (kernels, caches)
        step(enabled)
    fp32 = timed(lambda: step(False), lambda: _sync(amp_device), REPEATS)
    low = timed(lambda: step(True), lambda: _sync(amp_device), REPEATS)
    assert dtypes[-1] == amp_dtype and torch.float32 in dtypes, f"the timed runs produced {set(dtypes)}"
    fp32_ms, low_ms = statistics.median(fp32) * 1e3, statistics.median(low) * 1e3
    amp_context.speed[dtype_name(amp_dtype)] = {
        "workload": f"MLP {DEPTH + 1}x Linear({WIDTH}), batch {BATCH}, forward+backward, median of {REPEATS}",
        "fp32_ms": round(fp32_ms, 4),
        "autocast_ms": round(low_ms, 4),
        "speedup": round(fp32_ms / low_ms, 3),
    }
