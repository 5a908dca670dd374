"""The device overflow flag's window: everything since the last ``update()`` (issue 25).

A chip whose float16 arithmetic saturates (clamps to +-65504, raises a flag) is simulated on
the CPU: ``saturate`` clamps a forward activation and raises the adapter's flag where float16
would have overflowed.  With ``init_scale=1`` no gradient is non-finite, so only the flag can
make the scaler skip.  Properties over every (micro-batches, overflowing micro-batch) pair,
with and without ``unscale_`` + clipping and with fused optimizers; the same on the in-repo
saturating test device in tests/plugins/test_saturating_device.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import make_adapter

import ampcore

FP16_MAX = 65504.0
CASES = [(n, k) for n in (1, 2, 3) for k in range(n)]


class Chip:
    """The flag of a saturating chip and its hooks (counting clears)."""

    def __init__(self) -> None:
        self.flag = torch.zeros(1)
        self.clears = 0

    def saturate(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` clamped to float16's range, raising the flag where it overflowed (gradients
        pass through unchanged, so that a step taken shows in the weights)."""
        if bool((t.detach().abs() > FP16_MAX).any()):
            self.flag.fill_(1.0)
        return t + (t.clamp(-FP16_MAX, FP16_MAX) - t).detach()

    def clear(self, device: torch.device) -> None:
        self.clears += 1
        self.flag.zero_()

    def plugin(self) -> object:
        return make_adapter(
            "saturating",
            dtypes=(torch.float16,),
            ampcore_device_overflow_flag=lambda device: self.flag,
            ampcore_clear_device_overflow_flag=self.clear,
        )


@pytest.fixture
def chip(register: Callable[..., Any]) -> Chip:
    made = Chip()
    register(made.plugin(), name="saturating")
    return made


def _optimizer(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind in ("sgd", "paddle"):
        return torch.optim.SGD(params, lr=0.1)
    try:
        return torch.optim.SGD(params, lr=0.1, fused=True)
    except (RuntimeError, ValueError) as exc:
        pytest.skip(f"this torch has no fused SGD on the CPU: {exc}")


def accumulate(chip: Chip, micro_batches: int, overflow_in: int | None, *, clip: bool, optimizer: str = "sgd",
               scaler: ampcore.GradScaler | None = None) -> tuple[bool, float]:  # fmt: skip
    """One iteration of ``micro_batches`` forward/backward passes; the forward of micro-batch
    ``overflow_in`` saturates.  Returns (whether the step was taken, the scale after update)."""
    scaler = scaler or ampcore.GradScaler("saturating", init_scale=1.0)
    weight = torch.nn.Parameter(torch.ones(4))
    opt = _optimizer(optimizer, [weight])
    for micro in range(micro_batches):
        x = torch.full((4,), 96000.0 if micro == overflow_in else 1.0)
        loss = chip.saturate(x * weight).sum() / 1e5
        scaler.scale(loss).backward()
    if clip:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_([weight], max_norm=1.0)
    if optimizer == "paddle":
        scaler.minimize(opt, loss)  # Paddle's step() + update()
    else:
        scaler.step(opt)
        scaler.update()
    return bool(weight.detach().ne(1.0).any()), scaler.get_scale()


@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale_+clip"])
@pytest.mark.parametrize(("micro_batches", "overflow_in"), CASES, ids=[f"{k + 1}of{n}" for n, k in CASES])
def test_overflow_in_any_forward_skips_the_step_and_backs_off(
    chip: Chip, micro_batches: int, overflow_in: int, clip: bool
) -> None:
    stepped, scale = accumulate(chip, micro_batches, overflow_in, clip=clip)
    assert not stepped, f"the step was taken although the forward of micro-batch {overflow_in + 1} saturated"
    assert scale == 0.5


@pytest.mark.parametrize(("micro_batches", "overflow_in"), CASES, ids=[f"{k + 1}of{n}" for n, k in CASES])
@pytest.mark.parametrize("optimizer", ["fused", "paddle"], ids=["fused-sgd", "paddle-minimize"])
def test_overflow_in_any_forward_skips_a_fused_step_and_minimize(
    chip: Chip, micro_batches: int, overflow_in: int, optimizer: str
) -> None:
    stepped, scale = accumulate(chip, micro_batches, overflow_in, clip=False, optimizer=optimizer)
    assert (stepped, scale) == (False, 0.5)


@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale_+clip"])
@pytest.mark.parametrize("micro_batches", [1, 2, 3])
def test_clean_iterations_step_and_the_next_window_starts_clean(chip: Chip, micro_batches: int, clip: bool) -> None:
    scaler = ampcore.GradScaler("saturating", init_scale=1.0)
    assert accumulate(chip, micro_batches, 0, clip=clip, scaler=scaler) == (False, 0.5)
    assert chip.clears == 1, "update() must reset the flag once the iteration read it"
    stepped, _ = accumulate(chip, micro_batches, None, clip=clip, scaler=scaler)
    assert stepped, "an overflow of the previous iteration leaked into the next one"


def test_overflow_while_clipping_after_unscale_is_seen_by_step(chip: Chip) -> None:
    scaler = ampcore.GradScaler("saturating", init_scale=1.0)
    weight = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([weight], lr=0.1)
    scaler.scale(chip.saturate(weight * 2.0).sum()).backward()
    scaler.unscale_(opt)
    chip.saturate(torch.full((1,), 1e6))  # e.g. a float16 norm computed while clipping
    scaler.step(opt)
    scaler.update()
    assert torch.equal(weight.detach(), torch.ones(4)) and scaler.get_scale() == 0.5


def test_scale_leaves_the_flag_alone(chip: Chip) -> None:
    scaler = ampcore.GradScaler("saturating", init_scale=1.0)
    chip.flag.fill_(1.0)
    scaler.scale(torch.ones(()))
    assert chip.clears == 0 and chip.flag.item() == 1.0
