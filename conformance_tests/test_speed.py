"""Speed report: float32 vs ``ampcore.autocast`` on a small MLP, and the growth of peak memory
where the backend measures it (informative: measured, never asserted).

Timings on a shared or busy machine swing widely, so the two modes run in interleaved
rounds and the report gives the median speed-up with its range over the rounds; a wide
range is flagged as unreliable.  The check itself only makes sure the timed autocast run
really ran in the low-precision dtype, so the numbers mean something.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

import ampcore
from ampcore import toolkit as memory
from ampcore_conformance._checks import make_mlp, region, require_white, timed
from ampcore_conformance._context import SuiteContext, dtype_name
from ampcore_conformance._reports import summarize_speed

WIDTH, DEPTH, BATCH = 128, 4, 128
#: interleaved rounds x timed steps per mode and round
ROUNDS, STEPS = 5, 5


def _sync(device: torch.device) -> None:
    synchronize = getattr(getattr(torch, device.type, None), "synchronize", None)
    if callable(synchronize):
        synchronize()


def _peak_growth_mib(backend: ampcore.Backend, step: Callable[[], None]) -> float | None:
    """How much the peak use grew during ``step`` (MiB), or None when the backend cannot say."""
    try:
        memory.reset_peak_memory(backend, 0)
        base = memory.memory_in_use(backend, 0)
        step()
        peak = memory.peak_memory(backend, 0)
    except Exception:  # ampcore_memory is optional and informative only
        return None
    return None if base is None or peak is None else round(max(peak - base, 0) / 2**20, 2)


def _rounds(step: Callable[[bool], None], device: torch.device) -> tuple[list[float], list[float]]:
    """Per-round median step time (s) of fp32 and of autocast, the modes alternating."""
    fp32, low = [], []
    for round_ in range(ROUNDS):
        order = (False, True) if round_ % 2 == 0 else (True, False)  # no mode always goes first
        for enabled in order:
            times = timed(lambda enabled=enabled: step(enabled), lambda: _sync(device), STEPS)
            (low if enabled else fp32).append(statistics.median(times))
    return fp32, low


def test_speed_report(
    amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    require_white(amp_context, amp_dtype, ["linear"])
    model = make_mlp(amp_device, width=WIDTH, depth=DEPTH, n_in=WIDTH, n_out=WIDTH)
    x = torch.randn(BATCH, WIDTH, device=amp_device)
    dtypes: dict[bool, set[torch.dtype]] = {False: set(), True: set()}

    def step(enabled: bool) -> None:
        model.zero_grad(set_to_none=True)
        with region(amp_backend, amp_dtype, enabled=enabled):
            out = model(x)
        dtypes[enabled].add(out.dtype)
        out.float().pow(2).mean().backward()

    for enabled in (False, True, False, True):  # warm-up (kernels, caches)
        step(enabled)
    fp32, low = _rounds(step, amp_device)
    assert dtypes == {False: {torch.float32}, True: {amp_dtype}}, f"the timed runs produced {dtypes}"
    amp_context.speed[dtype_name(amp_dtype)] = {
        "workload": (
            f"MLP {DEPTH + 1}x Linear({WIDTH}), batch {BATCH}, forward+backward; "
            f"{ROUNDS} interleaved rounds of {STEPS} steps per mode"
        ),
        **summarize_speed(fp32, low),
        "fp32_peak_growth_mib": _peak_growth_mib(amp_backend, lambda: step(False)),
        "autocast_peak_growth_mib": _peak_growth_mib(amp_backend, lambda: step(True)),
    }
