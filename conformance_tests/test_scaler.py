"""``ampcore.GradScaler`` on the device: a single inf or nan is found and the step skipped,
growth, backoff, hysteresis, bounds, state-dict round trip, and the mode for each dtype."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import ampcore
from ampcore_conformance._checks import make_mlp, region, rel_error, require_feature


@pytest.fixture(autouse=True)
def _scaler_exists() -> None:
    require_feature(ampcore, "GradScaler", "dynamic loss scaling (ampcore.GradScaler)")


class _Loop:
    """A small model, its optimizer and one scaler, stepping with optional poisoned grads."""

    def __init__(self, backend: ampcore.Backend, device: torch.device, dtype: torch.dtype, **scaler: Any) -> None:
        self.backend, self.device, self.dtype = backend, device, dtype
        self.model = make_mlp(device, width=64)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.scaler = ampcore.GradScaler(backend.name, dtype=dtype, **scaler)
        self.x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3)).to(device)

    def step(self, poison: tuple[int, int, float] | None = None) -> bool:
        """One iteration; ``poison`` = (parameter index, element index, value) put into a grad.

        Returns whether the optimizer changed any parameter."""
        self.opt.zero_grad(set_to_none=True)
        with region(self.backend, self.dtype):
            loss = self.model(self.x).float().pow(2).mean()
        self.scaler.scale(loss).backward()
        params = list(self.model.parameters())
        if poison is not None:
            which, index, value = poison
            with torch.no_grad():
                params[which].grad.view(-1)[index] = value
        before = [p.detach().clone() for p in params]
        self.scaler.step(self.opt)
        self.scaler.update()
        return any(not torch.equal(b, p.detach()) for b, p in zip(before, params, strict=True))

    def run(self, pattern: str) -> list[float]:
        """Steps for a pattern of ``"."`` (clean) and ``"x"`` (one inf); the scale after each."""
        scales = []
        for mark in pattern:
            self.step((0, 5, float("inf")) if mark == "x" else None)
            scales.append(self.scaler.get_scale())
        return scales


def _ratios(scales: Sequence[float], init: float) -> list[float]:
    return [s / init for s in scales]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_scaler_finds_a_single_nonfinite_element(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype, value: float
) -> None:
    """One bad element anywhere (first or last parameter, any position) skips the step."""
    loop = _Loop(amp_backend, amp_device, amp_dtype, enabled=True, init_scale=1024.0)
    n_params = len(list(loop.model.parameters()))
    for which, index in ((0, 0), (0, 777), (n_params - 1, 3), (n_params - 2, 64 * 4 - 1)):
        scale = loop.scaler.get_scale()
        assert not loop.step((which, index, value)), (
            f"a step with {value} in parameter {which}[{index}] was not skipped"
        )
        assert loop.scaler.get_scale() == scale * 0.5, "the scale did not back off after the overflow"
    assert loop.step(), "a clean step after overflows did not update the parameters"


def test_scaler_unscales_gradients(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    loop = _Loop(amp_backend, amp_device, amp_dtype, enabled=True, init_scale=2.0**12)
    with region(amp_backend, amp_dtype):
        loss = loop.model(loop.x).float().pow(2).mean()
    loss.backward(retain_graph=True)
    reference = [p.grad.clone() for p in loop.model.parameters()]
    loop.opt.zero_grad(set_to_none=True)
    loop.scaler.scale(loss).backward()
    loop.scaler.unscale_(loop.opt)
    for (name, p), ref in zip(loop.model.named_parameters(), reference, strict=True):
        assert rel_error(p.grad, ref, floor=1e-12) <= 1e-3, f"unscaled grad of {name} differs from the plain grad"


def test_scaler_growth_and_backoff(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    loop = _Loop(amp_backend, amp_device, amp_dtype, enabled=True, init_scale=256.0, growth_interval=3)
    got = _ratios(loop.run("......x..."), 256.0)
    assert got == [1, 1, 2, 2, 2, 4, 2, 2, 2, 4], f"scale / init_scale after each step: {got}"


def test_scaler_hysteresis(amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    """With hysteresis 2 only the second overflow in a row backs off; a clean step resets."""
    loop = _Loop(amp_backend, amp_device, amp_dtype, enabled=True, init_scale=256.0, growth_interval=100, hysteresis=2)
    got = _ratios(loop.run("x.x.xx"), 256.0)
    assert got == [1, 1, 1, 1, 1, 0.5], f"scale / init_scale after each step: {got}"


def test_scaler_bounds(amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    low = _Loop(amp_backend, amp_device, amp_dtype, enabled=True, init_scale=8.0, min_scale=2.0)
    assert low.run("xxxx") == [4.0, 2.0, 2.0, 2.0]
    high = _Loop(amp_backend, amp_device, amp_dtype, enabled=True, init_scale=8.0, max_scale=32.0, growth_interval=1)
    assert high.run("....") == [16.0, 32.0, 32.0, 32.0]


def test_scaler_state_dict_round_trip(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    settings = {"enabled": True, "init_scale": 64.0, "growth_interval": 3, "hysteresis": 2, "min_scale": 1.0}
    first = _Loop(amp_backend, amp_device, amp_dtype, **settings)
    first.run("..x.")
    buffer = io.BytesIO()
    torch.save(first.scaler.state_dict(), buffer)
    buffer.seek(0)
    second = _Loop(amp_backend, amp_device, amp_dtype, **{**settings, "init_scale": 2.0, "hysteresis": 1})
    second.scaler.load_state_dict(torch.load(buffer, weights_only=True))
    assert second.scaler.state_dict() == first.scaler.state_dict()
    assert first.run("x..x.x") == second.run("x..x.x"), "a resumed scaler diverged from the original"


def test_scaler_mode_follows_the_backend(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    """Default ``enabled=None``: scaling where the backend says the dtype needs it, else a
    no-op with scale 1 that still skips non-finite steps."""
    loop = _Loop(amp_backend, amp_device, amp_dtype, init_scale=512.0)
    if amp_backend.needs_loss_scaling(amp_dtype):
        assert loop.scaler.is_enabled() and loop.scaler.get_scale() == 512.0
    else:
        assert not loop.scaler.is_enabled() and loop.scaler.get_scale() == 1.0
    assert not loop.step((0, 1, float("inf"))), "a step with an inf gradient was not skipped"
    assert loop.step()
