"""What ``ampcore bench`` measured: per-mode results, the run's record, and whether to trust them."""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Final

__all__ = [
    "LOAD_LIMIT",
    "SPREAD_LIMIT",
    "BenchResult",
    "ModeResult",
    "add_speedups",
    "load_average",
    "merge_repeats",
    "unreliable_reasons",
]

#: Load average per CPU above which the machine counts as busy.
LOAD_LIMIT: Final = 0.5
#: Relative spread (step-time interquartile range / median; repeat speed-ups) that counts as wide.
SPREAD_LIMIT: Final = 0.25


@dataclass
class ModeResult:
    """One mode's measurements (times in milliseconds, memory in bytes)."""

    mode: str
    ms_per_step: float
    step_ms: list[float]
    losses: list[float]
    final_loss: float
    peak_memory: int | None
    loss_scale: float | None
    #: fp32's ms/step over this mode's (None when fp32 was not run)
    speedup: float | None = 1.0
    #: median step time of each repeat (one entry per repeat)
    repeat_ms: list[float] = field(default_factory=list)
    #: the fastest and slowest per-repeat speed-up (None with one repeat)
    speedup_range: list[float] | None = None
    #: where the mode's wall time went, in seconds (summed over repeats): starting its
    #: process (interpreter, imports, device runtime; 0 in process), setting up (data, model
    #: built on the device, decorate, regions) and the training steps (warm-up included)
    start_s: float = 0.0
    setup_s: float = 0.0
    steps_s: float = 0.0


@dataclass
class BenchResult:
    """Everything ``ampcore bench`` prints or writes as JSON."""

    backend: str
    device_name: str
    dtype: str
    size: int
    batch: int
    steps: int
    warmup: int
    lr: float
    versions: dict[str, str]
    results: list[ModeResult] = field(default_factory=list)
    repeats: int = 1
    #: the 1-minute load average when the run started and the CPUs it is shared by (None: unknown)
    load_average: float | None = None
    cpus: int | None = None
    #: who provides the device's autocast: "native" (its own kernels) or "ampcore"
    autocast_provider: str = "native"
    #: whether the backend reports overflow through a device flag (torch's GradScaler cannot read it)
    overflow_flag: bool = False
    #: the whole run's wall time in seconds (every mode and repeat, process starts included)
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def add_speedups(results: list[ModeResult], repeats: int) -> None:
    """Each mode's speed-up over fp32 (and its range over the repeats)."""
    reference = next((r for r in results if r.mode == "fp32"), None)
    for r in results:
        r.speedup = reference.ms_per_step / r.ms_per_step if reference else None
        if reference and r is not reference and repeats > 1:
            ratios = [f / m for f, m in zip(reference.repeat_ms, r.repeat_ms, strict=False)]
            r.speedup_range = [min(ratios), max(ratios)]


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not available on this platform
        return None


def merge_repeats(runs: list[ModeResult]) -> ModeResult:
    """One mode's repeats as one result: all measured steps pooled, each repeat's median kept."""
    first = runs[0]
    if len(runs) == 1:
        return first
    steps = [ms for run in runs for ms in run.step_ms]
    peaks = [run.peak_memory for run in runs if run.peak_memory is not None]
    return ModeResult(
        mode=first.mode,
        ms_per_step=statistics.median(steps),
        step_ms=steps,
        losses=first.losses,
        final_loss=first.final_loss,
        peak_memory=max(peaks) if peaks else None,
        loss_scale=first.loss_scale,
        repeat_ms=[run.ms_per_step for run in runs],
        start_s=sum(run.start_s for run in runs),
        setup_s=sum(run.setup_s for run in runs),
        steps_s=sum(run.steps_s for run in runs),
    )


def unreliable_reasons(result: BenchResult) -> list[str]:
    """Why the speed-ups of ``result`` should not be trusted (empty when nothing speaks against them).

    A busy machine (load average above half the CPUs when the run started), step times that
    spread widely within a mode (interquartile range above a quarter of the median), or
    repeats whose speed-ups disagree by more than 25%.

    Example::

        >>> r = BenchResult("cpu", "cpu", "bfloat16", 8, 2, 3, 0, 1e-4, {}, load_average=7.5, cpus=2)
        >>> unreliable_reasons(r)
        ['the machine was busy (load average 7.50 on 2 CPUs at the start)']
    """
    reasons = []
    if result.load_average is not None and result.cpus and result.load_average > LOAD_LIMIT * result.cpus:
        reasons.append(
            f"the machine was busy (load average {result.load_average:.2f} on {result.cpus} CPUs at the start)"
        )
    spread = []
    for r in result.results:
        if len(r.step_ms) >= 4:
            q1, _, q3 = statistics.quantiles(r.step_ms, n=4)
            if q3 - q1 > SPREAD_LIMIT * r.ms_per_step:
                spread.append(r.mode)
    if spread:
        reasons.append(
            f"step times spread widely in {', '.join(spread)} "
            f"(quartiles more than {SPREAD_LIMIT:.0%} of the median apart)"
        )
    disagree = [
        f"{r.mode} {r.speedup_range[0]:.2f}-{r.speedup_range[1]:.2f}x"
        for r in result.results
        if r.speedup_range and r.speedup_range[1] > (1 + SPREAD_LIMIT) * r.speedup_range[0]
    ]
    if disagree:
        reasons.append(f"the repeats disagree ({', '.join(disagree)})")
    return reasons
