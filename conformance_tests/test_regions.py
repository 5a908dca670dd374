"""Regions: nesting, disabled regions, O0, decorator form, threads, exceptions, backward."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

import ampcore
from ampcore import toolkit
from ampcore_conformance._checks import make_mlp, output_dtype, region, rel_error, require_white
from ampcore_conformance._context import SuiteContext
from ampcore_conformance._manifest import Tolerances
from ampcore_conformance._op_samples import OpSample

Probe = Callable[[], torch.dtype]


@pytest.fixture
def probe(amp_white_ops: list[OpSample], amp_device: torch.device) -> Probe:
    """The output dtype of a white-list op, in the current autocast state."""
    op = amp_white_ops[0]
    return lambda: output_dtype(op, amp_device)


def _autocast_off(backend: ampcore.Backend) -> bool:
    return not torch.is_autocast_enabled(backend.device_type)


def test_nested_disabled_region_restores_outer(
    amp_backend: ampcore.Backend, amp_dtype: torch.dtype, probe: Probe
) -> None:
    seen = []
    with region(amp_backend, amp_dtype):
        seen.append(probe())
        with region(amp_backend, amp_dtype, enabled=False):
            seen.append(probe())
            with region(amp_backend, amp_dtype):
                seen.append(probe())
            seen.append(probe())
        seen.append(probe())
    seen.append(probe())
    expected = [amp_dtype, torch.float32, amp_dtype, torch.float32, amp_dtype, torch.float32]
    assert seen == expected, "mm dtypes along outer/disabled/inner/disabled/outer/outside regions"
    assert _autocast_off(amp_backend)


def test_nested_region_with_other_dtype(amp_backend: ampcore.Backend, amp_dtype: torch.dtype, probe: Probe) -> None:
    others = [d for d in toolkit.device_dtypes(amp_backend, 0) if d != amp_dtype]
    if not others:
        pytest.skip(
            f"device {amp_backend.device_type}:0 of backend {amp_backend.name!r} runs no dtype but {amp_dtype} "
            f"(declared: {', '.join(map(str, amp_backend.supported_dtypes))}): nothing to nest with"
        )
    with region(amp_backend, amp_dtype):
        with region(amp_backend, others[0]):
            inner = probe()
        outer = probe()
    assert (inner, outer) == (others[0], amp_dtype)


def test_level_o0_runs_fp32(amp_backend: ampcore.Backend, amp_dtype: torch.dtype, probe: Probe) -> None:
    with region(amp_backend, amp_dtype, level="O0"):
        assert probe() == torch.float32
    with region(amp_backend, amp_dtype, level="O1"):
        assert probe() == amp_dtype


def test_decorator_form(amp_backend: ampcore.Backend, amp_dtype: torch.dtype, probe: Probe) -> None:
    @region(amp_backend, amp_dtype)
    def low() -> torch.dtype:
        return probe()

    assert (low(), low(), probe()) == (amp_dtype, amp_dtype, torch.float32)


def test_exception_inside_region_restores_state(
    amp_backend: ampcore.Backend, amp_dtype: torch.dtype, probe: Probe
) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with region(amp_backend, amp_dtype):
            with region(amp_backend, amp_dtype, enabled=False):
                raise Boom
    assert _autocast_off(amp_backend) and probe() == torch.float32
    with region(amp_backend, amp_dtype):  # the region still works afterwards
        assert probe() == amp_dtype


def test_regions_are_thread_local(amp_backend: ampcore.Backend, amp_dtype: torch.dtype, probe: Probe) -> None:
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
                    got.append(probe())
                    barrier.wait()
            else:
                barrier.wait()
                got.append(probe())
                barrier.wait()
            got.append(probe())
            results[key] = got
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [
        threading.Thread(target=worker, args=("with", True)),
        threading.Thread(target=worker, args=("without", False)),
    ]
    for thread in threads:
        thread.start()
    with region(amp_backend, amp_dtype):
        barrier.wait()
        main = probe()
        barrier.wait()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert results == {"with": [amp_dtype, torch.float32], "without": [torch.float32, torch.float32]}
    assert main == amp_dtype


def test_backward_through_region(
    amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype,
    amp_tolerances: Tolerances,
) -> None:  # fmt: skip
    """Gradients of float32 parameters stay float32 and match a float32 backward."""
    require_white(amp_context, amp_dtype, ["linear"])
    model = make_mlp(amp_device)
    x = torch.randn(32, 16, device=amp_device)
    with region(amp_backend, amp_dtype):
        out = model(x)
        assert out.dtype == amp_dtype
    (out.float() ** 2).mean().backward()
    low_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (model(x) ** 2).mean().backward()
    for (name, p), g in zip(model.named_parameters(), low_grads, strict=True):
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), name
        error = rel_error(g, p.grad, floor=1e-6)
        assert error <= amp_tolerances.grad_rtol, f"grad of {name} differs from float32 by {error:.3g}"
