"""Overflow on the device is detected: by inf/nan in the result or by the device's flag.

A chip whose arithmetic saturates (clamps to the dtype's largest value, as Ascend NPUs do
outside INF_NAN mode) must report overflow through the adapter's overflow-flag hooks
(``ampcore_device_overflow_flag`` / ``ampcore_clear_device_overflow_flag``); a backend
without them must really produce inf/nan.  The checks cause overflows on the device
(``max * 2`` elementwise, a matmul whose sums overflow) and require one or the other, then
require that :class:`ampcore.GradScaler` skips a step whose forward pass overflowed and backs
off, and that the next clean step is taken (the flag was cleared).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import ampcore
from ampcore_conformance._checks import make_mlp, region, require_feature

#: name -> how to overflow in ``dtype`` on ``device`` (a result beyond the dtype's range)
OVERFLOWS: dict[str, Callable[[torch.device, torch.dtype], torch.Tensor]] = {
    "max*2": lambda device, dtype: torch.full((8,), torch.finfo(dtype).max, dtype=dtype, device=device) * 2,
    "matmul": lambda device, dtype: (
        torch.full((16, 16), torch.finfo(dtype).max / 4, dtype=dtype, device=device)
        @ torch.ones(16, 16, dtype=dtype, device=device)
    ),
}


class _Flag:
    """The backend's overflow-flag hooks (both or neither), checked as they are used."""

    def __init__(self, backend: ampcore.Backend, device: torch.device) -> None:
        self.read_hook = backend.hook("ampcore_device_overflow_flag")
        self.clear_hook = backend.hook("ampcore_clear_device_overflow_flag")
        self.device = device
        assert (self.read_hook is None) == (self.clear_hook is None), (
            "implement both overflow-flag hooks (ampcore_device_overflow_flag, ampcore_clear_device_overflow_flag) "
            "or neither"
        )

    @property
    def declared(self) -> bool:
        return self.read_hook is not None

    def clear(self) -> None:
        if self.clear_hook is not None:
            self.clear_hook(device=self.device)

    def read(self) -> torch.Tensor | None:
        """The flag as returned (``None``: the hook says the device needs none)."""
        if self.read_hook is None:
            return None
        flag = self.read_hook(device=self.device)
        if flag is not None:
            assert isinstance(flag, torch.Tensor) and flag.numel() == 1, (
                f"ampcore_device_overflow_flag() returned {flag!r}; expected a one-element tensor or None"
            )
            assert flag.device.type == self.device.type, f"the overflow flag lies on {flag.device}, not {self.device}"
        return flag


def _raised(flag: torch.Tensor | None) -> bool:
    return flag is not None and float(flag.float().cpu().reshape(())) > 0


def test_device_overflow_flag_clears(amp_backend: ampcore.Backend, amp_device: torch.device) -> None:
    flag = _Flag(amp_backend, amp_device)
    if not flag.declared:
        pytest.skip(f"backend {amp_backend.name!r} declares no device overflow flag (test_overflow_is_detected "
                    "checks that its arithmetic produces inf/nan)")  # fmt: skip
    flag.clear()
    assert not _raised(flag.read()), "the overflow flag is set right after clearing it"


@pytest.mark.parametrize("overflow", sorted(OVERFLOWS))
def test_overflow_is_detected(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype, overflow: str
) -> None:
    """An overflowing result holds inf/nan, or the device's flag rises (and clears again)."""
    flag = _Flag(amp_backend, amp_device)
    flag.clear()
    result = OVERFLOWS[overflow](amp_device, amp_dtype)
    nonfinite = not bool(torch.isfinite(result).all().cpu())
    raised = flag.read()
    if nonfinite:
        return
    largest = float(result.float().abs().max().cpu())
    where = f"{overflow} in {amp_dtype} on {amp_device} gave finite values (largest {largest:g}): the device saturates"
    assert flag.declared, (
        f"{where}, but backend {amp_backend.name!r} declares no overflow flag: GradScaler cannot see this "
        "overflow. Implement ampcore_device_overflow_flag and ampcore_clear_device_overflow_flag"
    )
    assert raised is not None, f"{where}, but ampcore_device_overflow_flag() returned None"
    assert _raised(raised), f"{where}, but the device overflow flag did not rise (it reads {raised!r})"
    flag.clear()
    assert not _raised(flag.read()), "the overflow flag is still set after ampcore_clear_device_overflow_flag()"


def _iteration(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: Any, x: torch.Tensor,
               backend: ampcore.Backend, dtype: torch.dtype, overflow: bool) -> bool:  # fmt: skip
    """One step; ``overflow`` makes the forward pass overflow in ``dtype``.  Whether it stepped."""
    opt.zero_grad(set_to_none=True)
    factor = torch.finfo(dtype).max if overflow else 1.0
    with region(backend, dtype):
        hidden = (model(x).to(dtype).abs() + 2) * factor  # beyond the range; a saturating chip: finite, flag
        loss = (hidden.float() / factor).pow(2).mean()
    scaler.scale(loss).backward()
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    return any(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters(), strict=True))


def test_scaler_skips_a_step_whose_forward_overflowed(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    require_feature(ampcore, "GradScaler", "dynamic loss scaling (ampcore.GradScaler)")
    model = make_mlp(amp_device, width=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = ampcore.GradScaler(amp_backend.name, dtype=amp_dtype, enabled=True, init_scale=256.0)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(5)).to(amp_device)
    assert _iteration(model, opt, scaler, x, amp_backend, amp_dtype, overflow=False), "a clean step was skipped"
    stepped = _iteration(model, opt, scaler, x, amp_backend, amp_dtype, overflow=True)
    assert not stepped, f"GradScaler took a step whose forward pass overflowed in {amp_dtype} on {amp_device}"
    assert scaler.get_scale() == 128.0, "the scale did not back off after the overflow"
    assert _iteration(model, opt, scaler, x, amp_backend, amp_dtype, overflow=False), (
        "the clean step after an overflow was skipped (is the device overflow flag cleared?)"
    )
