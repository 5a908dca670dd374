"""Issue 28, row 7: ``ampcore bench`` sizes the device's memory cannot hold are a one-line
error naming the option, before anything is allocated (with and without ``--in-process``)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_adapter

from ampcore import AmpcoreError
from ampcore._cli import experiment
from ampcore._cli.bench_limits import bench_bytes, check_bench_fits, host_memory
from ampcore._cli.main import main

GIB = 2**30


def test_the_estimate_counts_weights_gradients_data_and_activations() -> None:
    need = bench_bytes(1024, 64, 10)
    assert need.model == 8 * 9 * 1024 * 1025  # fp32 weights + gradients (O2: bf16 both + fp32 masters)
    assert need.data == 2 * 4 * 10 * 64 * 1024 + 2 * 9 * 64 * 1024
    assert need.total == need.model + need.data


@pytest.mark.parametrize(
    ("size", "batch", "memory", "option"),
    [
        (10**9, 4, 80 * GIB, "--size"),  # the weights alone
        (2048, 10**11, 80 * GIB, "--batch"),  # the data
        (2**62, 1, None, "--size"),  # beyond torch's tensor sizes, memory unknown
        (64, 2**62, None, "--batch"),
        (30_000, 4096, 64 * GIB, "--size"),  # 62 GiB of weights + 4.4 GiB of data: the weights dominate
    ],
)
def test_sizes_beyond_the_memory_name_the_option(size: int, batch: int, memory: int | None, option: str) -> None:
    with pytest.raises(AmpcoreError) as info:
        check_bench_fits(size, batch, 10, memory, "acme:0")
    message = str(info.value)
    assert message.endswith(f"lower {option}") and "\n" not in message
    assert memory is None or "acme:0" in message


def test_sizes_that_fit_pass() -> None:
    check_bench_fits(8192, 2048, 10, 80 * GIB, "cuda:0")  # the guide's sizes on an 80 GiB device
    check_bench_fits(2048, 512, 10, None, "unknown")
    memory = host_memory()
    assert memory is None or memory > 2**20


@pytest.mark.parametrize("in_process", [False, True])
@pytest.mark.parametrize(
    ("args", "option"),
    [(["--size", "1000000000", "--batch", "4"], "--size"), (["--batch", "100000000000"], "--batch"),
     (["--size", str(2**62)], "--size")],
)  # fmt: skip
def test_the_cli_refuses_before_allocating(
    args: list[str], option: str, in_process: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*_: object, **__: object) -> None:
        raise AssertionError("a mode ran")

    monkeypatch.setattr(experiment, "_run_mode", never)
    monkeypatch.setattr(experiment, "_run_isolated", never)
    argv = ["bench", "--device", "cpu", "--steps", "1", "--no-progress", *args] + (
        ["--in-process"] if in_process else []
    )
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ampcore bench: error: --")
    assert err.endswith(f"lower {option}")


def test_a_device_backend_is_measured_against_its_own_memory(
    register, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    memory = lambda device_index, reset_peak: {"total": 4 * GIB, "in_use": 0, "peak": 0}  # noqa: E731
    register(make_adapter("small", dtypes=(torch.bfloat16,), ampcore_memory=memory), name="small")
    monkeypatch.setattr(experiment, "_run_mode", lambda *a, **k: pytest.fail("a mode ran"))
    assert main(["bench", "--device", "small", "--size", "16384", "--in-process", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "more than the 4.0 GiB of small:0" in err and err.strip().endswith("lower --size")
