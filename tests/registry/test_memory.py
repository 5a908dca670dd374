"""Memory questions: adapter hooks first, torch.accelerator otherwise, None when unknown."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore._backends.memory import device_memory, memory_in_use, peak_memory, reset_peak_memory
from ampcore_backends.cpu import parse_status_kib


def test_adapter_hooks_are_used(register) -> None:
    calls: list[str] = []
    backend = register(
        make_adapter(
            "mem",
            ampcore_memory=lambda device_index, reset_peak: (
                calls.append(f"reset{device_index}")
                if reset_peak
                else {"total": 16 * 2**30 + device_index, "in_use": 100, "peak": 300}
            ),
        ),
        name="mem",
    )
    assert device_memory(backend, 1) == 16 * 2**30 + 1
    assert memory_in_use(backend) == 100
    reset_peak_memory(backend, 2)
    assert calls == ["reset2"] and peak_memory(backend) == 300


def test_unknown_without_hooks_or_accelerator(register) -> None:
    backend = register(make_adapter("plain", device_type="plain_device"), name="plain")
    assert device_memory(backend) is None and memory_in_use(backend) is None and peak_memory(backend) is None
    reset_peak_memory(backend)  # nothing to reset, no error


def test_parse_proc_status() -> None:
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n"
    assert parse_status_kib(status, "VmHWM") == 200 * 2**20
    assert parse_status_kib(status, "VmRSS") == 100 * 2**20
    assert parse_status_kib(status, "VmSwap") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU adapter reads /proc (Linux only)")
def test_cpu_peak_memory_sees_a_large_allocation() -> None:
    cpu = ampcore.get_backend("cpu")
    assert device_memory(cpu) is None  # host memory: bench picks scaled-down sizes
    reset_peak_memory(cpu)
    before = memory_in_use(cpu)
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    peak = peak_memory(cpu)
    del block
    assert before is not None and peak is not None
    assert peak - before >= 60 * 2**20


def test_accelerator_refusals_read_as_unavailable(register, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PrivateUse1 device registered from Python is torch's current accelerator, but its
    memory calls trip an INTERNAL ASSERT: unavailable, never a crash."""
    from ampcore._backends import memory as _memory

    def refuse(index: int) -> int:
        raise RuntimeError("Allocator for acme is not a DeviceAllocator")

    backend = register(make_adapter("pu1", device_type="pu1"), name="pu1")
    monkeypatch.setattr(_memory, "_drives_current_accelerator", lambda backend: True)
    monkeypatch.setattr(_memory, "_ACCELERATOR_FALLBACKS", dict.fromkeys(_memory._ACCELERATOR_FALLBACKS, refuse))
    assert device_memory(backend) is None and memory_in_use(backend) is None and peak_memory(backend) is None
    reset_peak_memory(backend)


def test_synchronize_hook_then_accelerator_then_device_module(register, monkeypatch: pytest.MonkeyPatch) -> None:
    from ampcore._backends import memory as _memory

    calls: list[str] = []
    hooked = register(
        make_adapter("synced", ampcore_synchronize=lambda device_index: calls.append(f"hook{device_index}")),
        name="synced",
    )
    _memory.synchronize(hooked, 1)
    assert calls == ["hook1"]

    def unsupported(index: int = 0) -> None:
        raise RuntimeError("synchronize is not supported for acme")

    class DeviceModule:
        @staticmethod
        def synchronize() -> None:
            calls.append("module")

    plain = register(make_adapter("pu2", device_type="pu2"), name="pu2")
    monkeypatch.setattr(_memory, "_drives_current_accelerator", lambda backend: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", unsupported)
    monkeypatch.setattr(torch, "pu2", DeviceModule, raising=False)
    _memory.synchronize(plain)
    assert calls == ["hook1", "module"]
