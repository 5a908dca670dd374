"""The scaler's kernels: adapter hooks first, torch's fused kernels, the portable fallback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import make_adapter

import ampcore
import ampcore._scaler.kernels as kernels_module
from ampcore._scaler.kernels import ScalerKernels, or_non_finite_, portable_unscale_

INF, NAN = float("inf"), float("nan")


def one_param_step(scaler: ampcore.GradScaler, grad: torch.Tensor) -> tuple[bool, torch.Tensor]:
    """Set a scaled gradient, step and update; return (stepped, the unscaled gradient)."""
    p = torch.nn.Parameter(torch.zeros_like(grad))
    opt = torch.optim.SGD([p], lr=1.0)
    p.grad = scaler.scale(grad.clone())
    scaler.step(opt)
    scaler.update()
    return bool(p.detach().ne(0).any()), p.grad


def test_device_overflow_flag_skips_finite_steps_and_is_cleared_once_per_iteration(
    register: Callable[..., Any],
) -> None:
    flag = torch.zeros(1)
    clears: list[torch.device] = []

    def clear(device: torch.device) -> None:
        clears.append(device)
        flag.zero_()

    register(
        make_adapter(
            "npu-like",
            dtypes=(torch.float16,),
            ampcore_device_overflow_flag=lambda device: flag,
            ampcore_clear_device_overflow_flag=clear,
        ),
        name="npu-like",
    )
    scaler = ampcore.GradScaler("npu-like", init_scale=8.0)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=1.0)
    for micro in range(3):  # gradient accumulation: only the first scale() clears
        (scaler.scale(p.sum() + 1.0)).backward()
        if micro == 1:
            flag.fill_(1.0)  # the chip saturated during this micro-batch's backward
    scaler.step(opt)
    scaler.update()
    assert clears == [torch.device("cpu", 0)] and torch.equal(p.detach(), torch.zeros(2))
    assert scaler.get_scale() == 4.0
    opt.zero_grad()
    scaler.scale(p.sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert len(clears) == 2 and not torch.equal(p.detach(), torch.zeros(2))


def test_device_overflow_flag_of_the_wrong_type_is_a_plugin_error(register: Callable[..., Any]) -> None:
    register(
        make_adapter("npu-like", dtypes=(torch.float16,), ampcore_device_overflow_flag=lambda: 1.0), name="npu-like"
    )
    with pytest.raises(ampcore.PluginError, match="expected a one-element tensor or None"):
        one_param_step(ampcore.GradScaler("npu-like"), torch.ones(1))


def _grads(dtype: torch.dtype, poison: float | None, where: int) -> list[torch.Tensor]:
    torch.manual_seed(where)
    grads = [torch.randn(n).mul(1000).to(dtype) for n in (1, 17, 4096, 0, 300)]
    if poison is not None:
        grads[where].view(-1)[-1] = poison
    return grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("poison", "where"), [(None, 0), (INF, 2), (-INF, 0), (NAN, 4), (NAN, 1)])
def test_portable_unscale_equals_torchs_kernel(dtype: torch.dtype, poison: float | None, where: int) -> None:
    inv_scale = torch.tensor(1.0 / 3.0)
    native, portable = _grads(dtype, poison, where), _grads(dtype, poison, where)
    found_native, found_portable = torch.zeros(()), torch.zeros(())
    torch._amp_foreach_non_finite_check_and_unscale_(native, found_native, inv_scale)
    portable_unscale_(portable, found_portable, inv_scale)
    assert found_native.item() == found_portable.item() == (0.0 if poison is None else 1.0)
    for a, b in zip(native, portable, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("fused", [True, False], ids=["max-norms", "aminmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("poison", "where"), [(None, 0), (INF, 2), (-INF, 0), (NAN, 4), (NAN, 1)])
def test_the_read_only_check_finds_what_torchs_kernel_finds_and_writes_nothing(
    dtype: torch.dtype, poison: float | None, where: int, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernels_module, "_fused_foreach", lambda device: fused)  # both ways, on the CPU
    native, checked = _grads(dtype, poison, where), _grads(dtype, poison, where)
    before = [g.clone() for g in checked]
    versions = [g._version for g in checked]
    found_native, found = torch.zeros(()), torch.zeros(())
    torch._amp_foreach_non_finite_check_and_unscale_(native, found_native, torch.ones(()))
    or_non_finite_(checked + [torch.empty(0, dtype=dtype)], found)
    assert found.item() == found_native.item() == (0.0 if poison is None else 1.0)
    assert [g._version for g in checked] == versions
    for a, b in zip(checked, before, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)


def test_unscale_params_unscales_in_place_and_checks_the_others_read_only() -> None:
    kernels = ampcore.GradScaler("cpu", dtype=torch.float16, init_scale=4.0)._kernels  # noqa: SLF001
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.full((3,), 8.0)
    low = torch.tensor([4.0, INF], dtype=torch.float16)
    found = kernels.unscale_params_([param], torch.tensor(0.25), False, None, True, checked=[low])
    assert found.item() == 1.0 and torch.equal(param.grad, torch.full((3,), 2.0))
    assert low[0].item() == 4.0  # checked, not unscaled
    clean = kernels.unscale_params_([], torch.tensor(0.25), False, None, True, checked=[low[:1]])
    assert clean.item() == 0.0


def test_portable_unscale_keeps_an_already_found_inf() -> None:
    found = torch.ones(())
    portable_unscale_([torch.ones(3)], found, torch.ones(()))
    assert found.item() == 1.0


def test_a_scaler_without_torch_kernels_uses_the_portable_path() -> None:
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, init_scale=4.0, hysteresis=1)
    scaler._kernels._native_unscale[("cpu", torch.float32)] = False  # noqa: SLF001 - as on a device without them
    scaler._kernels._native_update["cpu"] = False  # noqa: SLF001
    stepped, grad = one_param_step(scaler, torch.ones(3))
    assert stepped and torch.equal(grad, torch.ones(3)) and scaler.get_scale() == 4.0
    stepped, _ = one_param_step(scaler, torch.tensor([1.0, INF]))
    assert not stepped and scaler.get_scale() == 2.0


def test_probes_detect_missing_kernels_and_cache_the_answer() -> None:
    kernels = ScalerKernels(ampcore.get_backend("cpu"))
    cpu = torch.device("cpu")
    assert kernels.has_native_unscale(cpu, torch.float32) and kernels.has_native_update(cpu)
    assert not kernels.has_native_unscale(cpu, torch.int32)  # torch has no such kernel
    assert kernels._native_unscale == {("cpu", torch.float32): True, ("cpu", torch.int32): False}  # noqa: SLF001
    assert kernels.wide_dtype(cpu) == torch.float64
    assert kernels.inv_scale(torch.tensor(3.0)).item() == torch.tensor(1 / 3.0, dtype=torch.float64).float().item()
