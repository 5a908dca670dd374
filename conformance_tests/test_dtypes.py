"""Every dtype the device runs really autocasts there and really computes there; a declared
dtype the device refuses (``ampcore_check_capability`` error) is refused clearly."""

from __future__ import annotations

import warnings

import pytest
import torch

import ampcore
from ampcore import toolkit
from ampcore_conformance._checks import check_runs_low, output_dtype, region, rel_error
from ampcore_conformance._manifest import Tolerances
from ampcore_conformance._op_samples import OpSample


def test_declared_dtype_autocasts(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype,
    amp_white_ops: list[OpSample], amp_tolerances: Tolerances,
) -> None:  # fmt: skip
    kind = amp_backend.device_type
    with region(amp_backend, amp_dtype):
        assert torch.is_autocast_enabled(kind), f"ampcore.autocast left torch autocast off for {kind!r}"
        assert torch.get_autocast_dtype(kind) == amp_dtype
    for op in amp_white_ops[:3]:
        check_runs_low(op, amp_backend, amp_device, amp_dtype, amp_tolerances.op_eps)


def test_torch_autocast_accepts_dtype(amp_backend: ampcore.Backend, amp_dtype: torch.dtype) -> None:
    """torch itself must not disable autocast for the dtype (it only warns on non-CUDA devices)."""
    kind = amp_backend.device_type
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(kind, dtype=amp_dtype):
            enabled, dtype = torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
    disabling = [str(w.message) for w in caught if "autocast" in str(w.message).lower()]
    assert enabled and dtype == amp_dtype, f"torch.autocast({kind!r}, dtype={amp_dtype}) is disabled: {disabling}"


def test_dtype_computes_on_device(amp_device: torch.device, amp_dtype: torch.dtype, amp_tolerances: Tolerances) -> None:
    """Plain arithmetic in the dtype (no autocast) runs and is accurate to the dtype."""
    gen = torch.Generator().manual_seed(0)
    x32 = torch.randn(64, 32, generator=gen)
    w32 = torch.randn(32, 8, generator=gen)
    x, w = x32.to(amp_device, amp_dtype), w32.to(amp_device, amp_dtype)
    y = torch.tanh(x @ w + 1.0) * 0.5
    assert y.dtype == amp_dtype and y.device.type == amp_device.type
    reference = torch.tanh(x.float().cpu() @ w.float().cpu() + 1.0) * 0.5
    error = rel_error(y, reference)
    assert error <= 4 * amp_tolerances.op_eps * torch.finfo(amp_dtype).eps, (
        f"{amp_dtype} arithmetic on the device is off by {error:.3g}"
    )


def test_default_dtype_is_used_without_dtype(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_white_ops: list[OpSample]
) -> None:
    """``dtype=None`` is the backend's default where the device runs it, else the first
    declared dtype the device runs."""
    expected = toolkit.device_dtypes(amp_backend, 0)[0]
    with ampcore.autocast(device=amp_backend.name):
        got = output_dtype(amp_white_ops[0], amp_device)
    assert got == expected


@pytest.mark.parametrize("refused", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_refused_dtype_is_refused_clearly(amp_backend: ampcore.Backend, refused: torch.dtype) -> None:
    """A declared dtype the device refuses: autocast, GradScaler and decorate raise naming
    the dtype and the device, and ``is_dtype_supported`` says False."""
    runs = toolkit.device_dtypes(amp_backend, 0)
    if refused not in amp_backend.supported_dtypes or refused in runs:
        pytest.skip(f"backend {amp_backend.name!r} does not declare {refused}, or its device runs it")
    device = f"{amp_backend.device_type}:0"
    supported = ampcore.is_float16_supported if refused == torch.float16 else ampcore.is_bfloat16_supported
    assert not supported(amp_backend.name), f"is_{refused}_supported() says True on a device that refuses it"
    calls = {
        "ampcore.autocast": lambda: ampcore.autocast(device=amp_backend.name, dtype=refused),
        "ampcore.GradScaler": lambda: ampcore.GradScaler(amp_backend.name, dtype=refused),
    }
    for call, make in calls.items():
        with pytest.raises(ampcore.AmpcoreError) as caught:
            make()
        message = str(caught.value)
        assert str(refused).removeprefix("torch.") in message and device in message, (
            f"{call}(dtype={refused}) on a device that refuses it must name the dtype and {device}: {message!r}"
        )
