"""Device resolution: names, indices, torch.device, best available, errors with choices."""

from __future__ import annotations

import pytest
import torch
from conftest import make_adapter, simulate_cuda

import ampcore
from ampcore._backends.registry import resolve_device


@pytest.mark.parametrize(
    ("device", "name", "index"),
    [
        ("cpu", "cpu", None),
        ("cpu:0", "cpu", 0),
        (torch.device("cpu"), "cpu", None),
        (torch.device("cpu", 0), "cpu", 0),
        (" cpu ", "cpu", None),
    ],
)
def test_resolve_names_indices_and_torch_devices(device: object, name: str, index: int | None) -> None:
    resolved = resolve_device(device)  # type: ignore[arg-type]
    assert (resolved.backend.name, resolved.index) == (name, index)


def test_none_picks_the_best_available_backend(register, cuda_absent: ampcore.Backend) -> None:
    assert resolve_device(None).backend.name == "cpu"  # cuda (priority 100) is unavailable (faked)
    register(make_adapter("fast", priority=70), name="fast")
    assert resolve_device(None).backend.name == "fast"
    register(make_adapter("faster", priority=90, ampcore_unavailable_reason=lambda: "no chip"), name="faster")
    assert resolve_device(None).backend.name == "fast"


def test_none_picks_cuda_when_a_gpu_is_present(register, cuda_present: ampcore.Backend) -> None:
    assert resolve_device(None).backend.name == "cuda"  # priority 100 beats cpu (50)
    register(make_adapter("faster", priority=110), name="faster")
    assert resolve_device(None).backend.name == "faster"


@pytest.mark.parametrize("gpu", [False, True], ids=["no-gpu", "gpu"])
def test_unknown_backend_lists_known_backends_with_availability(monkeypatch: pytest.MonkeyPatch, gpu: bool) -> None:
    simulate_cuda(monkeypatch, present=gpu)
    with pytest.raises(ampcore.AmpcoreError) as info:
        resolve_device("tpu9")
    message = str(info.value)
    assert "unknown backend 'tpu9'" in message
    assert "cpu (available)" in message
    assert ("cuda (available)" if gpu else "cuda (unavailable: ") in message


def test_unknown_backend_suggests_the_closest_name() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="did you mean 'cuda'"):
        resolve_device("cdua")


def test_unavailable_backend_raises_with_the_adapters_reason(register) -> None:
    register(make_adapter("ghost", ampcore_unavailable_reason=lambda: "driver libghost.so missing"), name="ghost")
    with pytest.raises(
        ampcore.BackendUnavailableError, match='backend "ghost".*unavailable: driver libghost.so missing'
    ):
        resolve_device("ghost")
    # get_backend still returns it, so that the reason can be read
    assert ampcore.get_backend("ghost").unavailable_reason == "driver libghost.so missing"


def test_availability_probe_that_raises_means_unavailable(register) -> None:
    def probe() -> str:
        raise OSError("cannot open /dev/ghost0")

    backend = register(make_adapter("ghost", ampcore_unavailable_reason=probe), name="ghost")
    assert not backend.is_available
    assert "OSError: cannot open /dev/ghost0" in (backend.unavailable_reason or "")


@pytest.mark.parametrize("device", ["cpu:1", "cpu:x", "cpu:-1"])
def test_bad_device_index(device: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match="device="):
        resolve_device(device)


def test_device_index_is_checked_against_the_adapters_count(register) -> None:
    register(make_adapter("multi", ampcore_device_count=lambda: 4), name="multi")
    assert resolve_device("multi:3").index == 3
    with pytest.raises(ampcore.AmpcoreError, match="4 visible device\\(s\\); valid indices are 0..3"):
        resolve_device("multi:4")


def test_wrong_type_for_device() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="expected a backend name"):
        resolve_device(3)  # type: ignore[arg-type]


def test_a_backend_is_found_by_its_torch_device_type(register) -> None:
    register(make_adapter("vendor", device_type="privateuseone"), name="vendor")
    assert resolve_device(torch.device("privateuseone")).backend.name == "vendor"


def test_resolution_cache_follows_registration(register) -> None:
    with pytest.raises(ampcore.AmpcoreError):
        resolve_device("late")
    register(make_adapter("late"), name="late")
    assert resolve_device("late").backend.name == "late"
