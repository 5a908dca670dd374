"""The dynamic-scale algorithm against a plain-Python reference, on random overflow patterns.

The reference is the algorithm of docs/scaler.md written with Python floats, rounding to
float32 where the scale tensor does.  Both device paths are driven: torch's
``_amp_update_scale_`` + clamp (hysteresis 1) and ampcore's portable update.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ampcore
from ampcore._scaler.kernels import portable_update_scale_
from ampcore._scaler.options import ScalerOptions


def f32(x: float) -> float:
    """``x`` rounded to float32 (inf where float32 overflows)."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


@dataclass
class Reference:
    """The algorithm, plainly: returns whether each step is skipped; tracks the scale."""

    scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    hysteresis: int
    min_scale: float | None
    max_scale: float | None
    good: int = 0
    bad: int = 0

    def step(self, overflow: bool) -> bool:
        if overflow:
            self.good, self.bad = 0, self.bad + 1
            if self.bad >= self.hysteresis:
                self.bad = 0
                self.scale = f32(self.scale * self.backoff_factor)
                if self.min_scale is not None:
                    self.scale = max(self.scale, f32(self.min_scale))
            return True
        self.bad, self.good = 0, self.good + 1
        if self.good >= self.growth_interval:
            self.good = 0
            grown = f32(self.scale * self.growth_factor)
            if math.isfinite(grown):
                self.scale = grown
            if self.max_scale is not None:
                self.scale = min(self.scale, f32(self.max_scale))
        return False


@st.composite
def scaler_settings(draw: st.DrawFn) -> dict[str, float | int | None]:
    min_scale = draw(st.one_of(st.none(), st.sampled_from([1.0, 0.5, 3.0]), st.floats(1e-3, 1e3)))
    max_scale = draw(st.one_of(st.none(), st.sampled_from([2.0**10, 2.0**16, 3e38]), st.floats(1e3, 1e8)))
    low, high = min_scale or 1e-6, max_scale or 3e38
    return {
        "growth_factor": draw(st.one_of(st.sampled_from([2.0, 4.0, 1.5]), st.floats(1.0001, 16.0))),
        "backoff_factor": draw(st.one_of(st.sampled_from([0.5, 0.25]), st.floats(0.01, 0.99))),
        "growth_interval": draw(st.integers(1, 6)),
        "hysteresis": draw(st.integers(1, 4)),
        "min_scale": min_scale,
        "max_scale": max_scale,
        "init_scale": draw(st.one_of(st.sampled_from([low, high]), st.floats(low, high))),
    }


def reference_for(options: dict[str, float | int | None]) -> Reference:
    settings_ = {name: value for name, value in options.items() if name != "init_scale"}
    return Reference(scale=f32(float(options["init_scale"])), **settings_)  # type: ignore[arg-type]


def expected_trajectory(options: dict[str, float | int | None], pattern: list[bool]) -> list[tuple[float, bool]]:
    reference = reference_for(options)
    trajectory = []
    for overflow in pattern:
        skipped = reference.step(overflow)
        trajectory.append((reference.scale, skipped))
    return trajectory


def run(options: dict[str, float | int | None], pattern: list[bool], portable: bool) -> list[tuple[float, bool]]:
    """Drive a real scaler through ``pattern`` (True: overflow); return (scale, skipped) per step."""
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, **options)  # type: ignore[arg-type]
    if portable:
        scaler._kernels._native_update["cpu"] = False  # noqa: SLF001 - as on a device without the kernel
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    trajectory = []
    for overflow in pattern:
        p.grad = scaler.scale(torch.full((1,), math.inf if overflow else 1.0))
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        trajectory.append((scaler.get_scale(), torch.equal(before, p.detach())))
    return trajectory


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=scaler_settings(), pattern=st.lists(st.booleans(), min_size=1, max_size=40), portable=st.booleans())
def test_scaler_follows_the_reference_at_every_step(
    options: dict[str, float | int | None], pattern: list[bool], portable: bool
) -> None:
    assert run(options, pattern, portable) == expected_trajectory(options, pattern)


@settings(max_examples=60, deadline=None)
@given(
    pattern=st.lists(st.sampled_from(["clean", "overflow", "burst"]), min_size=1, max_size=30),
    hysteresis=st.integers(1, 3),
    interval=st.integers(1, 4),
)
def test_long_runs_of_overflow_with_settings_from_megatron_and_paddle(
    pattern: list[str], hysteresis: int, interval: int
) -> None:
    """Bursts of consecutive overflows (where hysteresis matters) and Megatron's min_scale=1."""
    flat = [kind != "clean" for kind in pattern for _ in range(3 if kind == "burst" else 1)]
    options: dict[str, float | int | None] = {
        "init_scale": 2.0**4,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": interval,
        "hysteresis": hysteresis,
        "min_scale": 1.0,
        "max_scale": 2.0**6,
    }
    assert run(options, flat, portable=False) == expected_trajectory(options, flat)


@pytest.mark.parametrize("seed", range(5))
def test_portable_update_equals_torchs_kernel_for_hysteresis_one(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    options = ScalerOptions.create(
        "test",
        init_scale=1.0,
        growth_factor=1.7,
        backoff_factor=0.3,
        growth_interval=3,
        hysteresis=1,
        min_scale=None,
        max_scale=None,
        dynamic=True,
        raise_at_min_scale=False,
    )
    native = (torch.tensor(1234.5), torch.zeros((), dtype=torch.int32))
    portable = (torch.tensor(1234.5), torch.zeros((), dtype=torch.int32), torch.zeros((), dtype=torch.int32))
    for _ in range(50):
        found = (torch.rand((), generator=generator) < 0.3).float()
        torch._amp_update_scale_(native[0], native[1], found, 1.7, 0.3, 3)
        portable_update_scale_(*portable, found, options)
        assert torch.equal(native[0], portable[0]) and torch.equal(native[1], portable[1])
