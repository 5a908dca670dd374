"""Speed report: float32 vs ``ampcore.autocast`` on a small MLP, with the peak memory where
the backend measures it (measured, never asserted).

The medians go into report.json and report.md.  The check itself only makes sure the
timed autocast run really ran in the low-precision dtype, so the numbers mean something.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

import ampcore
from ampcore import _memory as memory
from ampcore_conformance._checks import make_mlp, region, require_white, timed
from ampcore_conformance._context import SuiteContext, dtype_name

WIDTH, DEPTH, BATCH, REPEATS = 128, 4, 128, 7


def _sync(device: torch.device) -> None:
    synchronize = getattr(getattr(torch, device.type, None), "synchronize", None)
    if callable(synchronize):
        synchronize()


def _measure(backend: ampcore.Backend, step: Callable[[], None], device: torch.device) -> tuple[list[float], float | None]:
    """Wall-clock times of REPEATS steps and the peak memory (MiB) when the backend measures it."""
    try:
        memory.reset_peak_memory(backend, 0)
    except Exception:  # memory hooks are optional and informative only
        pass
    times = timed(step, lambda: _sync(device), REPEATS)
    try:
        peak = memory.peak_memory(backend, 0)
    except Exception:
        peak = None
    return times, None if peak is None else round(peak / 2**20, 2)


def test_speed_report(amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    require_white(amp_context, amp_dtype, ["linear"])
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
    fp32, fp32_peak = _measure(amp_backend, lambda: step(False), amp_device)
    low, low_peak = _measure(amp_backend, lambda: step(True), amp_device)
    assert dtypes[-1] == amp_dtype and torch.float32 in dtypes, f"the timed runs produced {set(dtypes)}"
    fp32_ms, low_ms = statistics.median(fp32) * 1e3, statistics.median(low) * 1e3
    amp_context.speed[dtype_name(amp_dtype)] = {
        "workload": f"MLP {DEPTH + 1}x Linear({WIDTH}), batch {BATCH}, forward+backward, median of {REPEATS}",
        "fp32_ms": round(fp32_ms, 4),
        "autocast_ms": round(low_ms, 4),
        "speedup": round(fp32_ms / low_ms, 3),
        "fp32_peak_mib": fp32_peak,
        "autocast_peak_mib": low_peak,
    }
