"""Regions: nesting, disabled regions, O0, decorator form, threads, exceptions, backward."""

from __future__ import annotations

import threading

import pytest
import torch

import ampcore
from ampcore_conformance._checks import make_mlp, region, rel_error
from ampcore_conformance._manifest import Tolerances


def _mm_dtype(device: torch.device) -> torch.dtype:
    a = torch.ones(4, 4, device=device)
    return torch.mm(a, a).dtype


def _autocast_off(backend: ampcore.Backend) -> bool:
    return not torch.is_autocast_enabled(backend.device_type)


def test_nested_disabled_region_restores_outer(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    seen = []
    with region(amp_backend, amp_dtype):
        seen.append(_mm_dtype(amp_device))
        with region(amp_backend, amp_dtype, enabled=False):
            seen.append(_mm_dtype(amp_device))
            with region(amp_backend, amp_dtype):
                seen.append(_mm_dtype(amp_device))
            seen.append(_mm_dtype(amp_device))
        seen.append(_mm_dtype(amp_device))
    seen.append(_mm_dtype(amp_device))
    expected = [amp_dtype, torch.float32, amp_dtype, torch.float32, amp_dtype, torch.float32]
    assert seen == expected, "mm dtypes along outer/disabled/inner/disabled/outer/outside regions"
    assert _autocast_off(amp_backend)


def test_nested_region_with_other_dtype(amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    others = [d for d in amp_backend.supported_dtypes if d != amp_dtype]
    if not others:
        pytest.skip(f"backend {amp_backend.name!r} declares one dtype only: nothing to nest with {amp_dtype}")
    with region(amp_backend, amp_dtype):
        with region(amp_backend, others[0]):
            inner = _mm_dtype(amp_device)
        outer = _mm_dtype(amp_device)
    assert (inner, outer) == (others[0], amp_dtype)


def test_level_o0_runs_fp32(amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    with region(amp_backend, amp_dtype, level="O0"):
        assert _mm_dtype(amp_device) == torch.float32
    with region(amp_backend, amp_dtype, level="O1"):
        assert _mm_dtype(amp_device) == amp_dtype


def test_decorator_form(amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    @region(amp_backend, amp_dtype)
    def low() -> torch.dtype:
        return _mm_dtype(amp_device)

    assert (low(), low(), _mm_dtype(amp_device)) == (amp_dtype, amp_dtype, torch.float32)


def test_exception_inside_region_restores_state(amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with region(amp_backend, amp_dtype):
            with region(amp_backend, amp_dtype, enabled=False):
                raise Boom
    assert _autocast_off(amp_backend) and _mm_dtype(amp_device) == torch.float32
    with region(amp_backend, amp_dtype):  # the region still works afterwards
        assert _mm_dtype(amp_device) == amp_dtype


def test_regions_are_thread_local(amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype) -> None:
    """A region in one thread changes nothing in another; regions in threads run side by side."""
    barrier = threading.Barrier(3, timeout=60)
    results: dict[str, list[torch.dtype]] = {}
    errors: list[BaseException] = []

    def worker(key: str, enter: bool) -> None:
        try:
            got = []
            if enter:
                with region(amp_backend, amp_dtype):
                    barrier.wait()
                    got.append(_mm_dtype(amp_device))
                    barrier.wait()
            else:
                barrier.wait()
                got.append(_mm_dtype(amp_device))
                barrier.wait()
            got.append(_mm_dtype(amp_device))
            results[key] = got
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=("with", True)), threading.Thread(target=worker, args=("without", False))]
    for thread in threads:
        thread.start()
    with region(amp_backend, amp_dtype):
        barrier.wait()
        main = _mm_dtype(amp_device)
        barrier.wait()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert results == {"with": [amp_dtype, torch.float32], "without": [torch.float32, torch.float32]}
    assert main == amp_dtype


def test_backward_through_region(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype, amp_tolerances: Tolerances
) -> None:
    """Gradients of float32 parameters stay float32 and match a float32 backward."""
    model = make_mlp(amp_device)
    x = torch.randn(32, 16, device=amp_device)
    with region(amp_backend, amp_dtype):
        out = model(x)
        assert out.dtype == amp_dtype
    (out.float() ** 2).mean().backward()
    low_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (model(x) ** 2).mean().backward()
    for (name, p), g in zip(model.named_parameters(), low_grads):
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), name
        error = rel_error(g, p.grad, floor=1e-6)
        assert error <= amp_tolerances.grad_rtol, f"grad of {name} differs from float32 by {error:.3g}"
