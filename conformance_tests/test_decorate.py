"""``ampcore.decorate`` at O2: low-precision parameters, float32 norms and master weights,
small updates kept by the masters, and an exact checkpoint resume."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

import ampcore
from ampcore_conformance._checks import region, require_feature, require_white
from ampcore_conformance._context import SuiteContext


@pytest.fixture(autouse=True)
def _decorate_exists() -> None:
    require_feature(ampcore, "decorate", "O2 model preparation with master weights (ampcore.decorate)")


def _model(device: torch.device, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Tanh(),
        torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4),
    ).to(device)  # fmt: skip


def _decorate(backend: ampcore.Backend, dtype: torch.dtype, model: torch.nn.Module, opt: Any, **kw: Any) -> Any:
    return ampcore.decorate(model, opt, level="O2", dtype=dtype, device=backend.name, **kw)


def test_decorate_casts_parameters_and_keeps_norms(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    for keep in (True, False):
        model = _model(amp_device)
        _decorate(amp_backend, amp_dtype, model, None, keep_norm_fp32=keep)
        got = {name: p.dtype for name, p in model.named_parameters()}
        norm = torch.float32 if keep else amp_dtype
        expected = {
            "0.weight": amp_dtype, "0.bias": amp_dtype, "1.weight": torch.float32, "1.bias": torch.float32,
            "3.weight": amp_dtype, "3.bias": amp_dtype, "4.weight": norm, "4.bias": norm,
            "5.weight": amp_dtype, "5.bias": amp_dtype,
        }  # fmt: skip
        assert got == expected, f"keep_norm_fp32={keep}: parameter dtypes after decorate"
        assert model[1].running_mean.dtype == torch.float32, "BatchNorm statistics must stay float32"


def test_decorate_trains_through_fp32_masters(
    amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    require_white(amp_context, amp_dtype, ["linear"], "O2")
    model = _model(amp_device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = _decorate(amp_backend, amp_dtype, model, opt)
    masters = [p for group in opt.param_groups for p in group["params"]]
    assert masters and all(p.dtype == torch.float32 for p in masters), "the optimizer must hold float32 master weights"
    x = torch.randn(8, 16, device=amp_device)
    with region(amp_backend, amp_dtype, level="O2"):
        out = model(x)
    assert out.dtype == amp_dtype, f"an O2 forward returned {out.dtype}"
    before = [m.detach().clone() for m in masters]
    out.float().pow(2).mean().backward()
    opt.step()
    assert not torch.equal(before[-1], masters[-1].detach()), "a step left the master weights unchanged"
    for (name, p), master in zip(model.named_parameters(), masters, strict=True):
        assert torch.equal(p.detach(), master.detach().to(p.dtype)), f"{name} is not its master weight after the step"


def test_master_weights_keep_small_updates(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    """50 updates of 1e-4 each vanish in a low-precision weight of 1.0; the master keeps them."""
    model = torch.nn.Linear(1, 1, bias=False).to(amp_device)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    model, opt = _decorate(amp_backend, amp_dtype, model, opt)
    x = torch.ones(1, 1, device=amp_device)
    for _ in range(50):
        opt.zero_grad()
        with region(amp_backend, amp_dtype, level="O2"):
            out = model(x)
        out.float().sum().backward()  # d/dw = 1: each step subtracts lr
        opt.step()
    master = opt.param_groups[0]["params"][0]
    assert abs(float(master.detach().cpu()) - (1.0 - 50e-4)) < 1e-6, f"master weight {float(master)}; expected 0.995"
    assert model.weight.dtype == amp_dtype and torch.equal(
        model.weight.detach(), master.detach().to(amp_dtype).view_as(model.weight)
    )


def _train(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    scaler: Any,
    backend: ampcore.Backend,
    dtype: torch.dtype,
    data: torch.Tensor,
    steps: range,
) -> list[float]:
    losses = []
    for i in steps:
        x = data[i % len(data)]
        opt.zero_grad()
        with region(backend, dtype, level="O2"):
            loss = (model(x).float() - 1.0).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach().cpu()))
    return losses


def test_checkpoint_resume_is_exact(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    """Save model, optimizer and scaler mid-run; a fresh decorated copy resumes identically."""
    require_feature(ampcore, "GradScaler", "dynamic loss scaling (ampcore.GradScaler)")
    data = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(5)).to(amp_device)

    def fresh(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        model = _model(amp_device, seed)
        model, opt = _decorate(amp_backend, amp_dtype, model, torch.optim.Adam(model.parameters(), lr=1e-3))
        return model, opt, ampcore.GradScaler(amp_backend.name, dtype=amp_dtype)

    model, opt, scaler = fresh(0)
    _train(model, opt, scaler, amp_backend, amp_dtype, data, range(4))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "scaler": scaler.state_dict()}, buffer)
    expected = _train(model, opt, scaler, amp_backend, amp_dtype, data, range(4, 8))
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model2, opt2, scaler2 = fresh(1)
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    scaler2.load_state_dict(saved["scaler"])
    resumed = _train(model2, opt2, scaler2, amp_backend, amp_dtype, data, range(4, 8))
    assert resumed == expected, f"losses after resume {resumed} differ from the uninterrupted run {expected}"
    for (name, a), b in zip(model.state_dict().items(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name} differs after resume"
