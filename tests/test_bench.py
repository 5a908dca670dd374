"""``ampcore bench``: every mode trains, the table and JSON hold what they claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ampcore
from ampcore._bench import GUIDE_SIZES, HOST_SIZES, MODES, BenchSettings, default_sizes, run_bench
from ampcore._cli import main
from ampcore._cli_bench import format_result

from conftest import make_adapter

TINY = BenchSettings(device="cpu", size=64, batch=16, steps=3, warmup=1, isolate=False)


@pytest.fixture(scope="module")
def result():
    return run_bench(TINY)


def test_every_mode_runs_from_the_same_start(result) -> None:
    assert [r.mode for r in result.results] == list(MODES)
    first_losses = {r.mode: r.losses[0] for r in result.results}
    # same weights and data: the first loss differs only by the precision of the forward
    for mode, loss in first_losses.items():
        assert loss == pytest.approx(first_losses["fp32"], rel=0.05), mode
    for r in result.results:
        assert len(r.step_ms) == TINY.steps and len(r.losses) == TINY.steps + TINY.warmup
        assert r.ms_per_step > 0 and r.final_loss == r.losses[-1]


def test_speedups_are_relative_to_fp32(result) -> None:
    fp32 = result.results[0]
    assert fp32.speedup == 1.0
    for r in result.results[1:]:
        assert r.speedup == pytest.approx(fp32.ms_per_step / r.ms_per_step)


def test_bf16_needs_no_loss_scale_on_cpu(result) -> None:
    scales = {r.mode: r.loss_scale for r in result.results}
    assert scales["fp32"] is None and scales["torch.autocast"] is None
    # ampcore's scaler is a transparent no-op for bf16: its scale stays 1
    assert scales["AMP-O1"] == 1.0 and scales["AMP-O2"] == 1.0


def test_table_lists_modes_and_columns(result) -> None:
    text = format_result(result)
    assert "9 x Linear(64, 64), batch 16" in text
    for column in ("ms/step", "speed-up", "final loss", "peak memory", "loss scale"):
        assert column in text
    for mode in MODES:
        assert any(line.startswith(mode) for line in text.splitlines())


def test_cli_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", "--device", "cpu", "--size", "32", "--batch", "8", "--steps", "2", "--warmup", "0", "--modes", "fp32", "AMP-O1", "--in-process", "--json", str(out), "--no-progress"])
    assert code == 0
    data = json.loads(out.read_text())
    assert [r["mode"] for r in data["results"]] == ["fp32", "AMP-O1"]
    assert data["backend"] == "cpu" and data["size"] == 32 and data["versions"]["ampcore"] == ampcore.__version__
    assert "AMP-O1" in capsys.readouterr().out


def test_plot_without_matplotlib_fails_before_training(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert main(["bench", "--device", "cpu", "--plot", "x.png", "--no-progress"]) == 1
    assert "needs matplotlib" in capsys.readouterr().err


def test_default_sizes_follow_device_memory(register) -> None:
    assert default_sizes(ampcore.get_backend("cpu")) == HOST_SIZES
    big = register(make_adapter("big", ampcore_device_memory=lambda: 80 * 2**30), name="big")
    small = register(make_adapter("small", ampcore_device_memory=lambda: 8 * 2**30), name="small")
    assert default_sizes(big) == GUIDE_SIZES and default_sizes(small) == HOST_SIZES


def test_bad_settings() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="unknown mode"):
        run_bench(BenchSettings(device="cpu", modes=("fp64",)))
    with pytest.raises(ampcore.AmpcoreError, match="steps and batches must be >= 1"):
        run_bench(BenchSettings(device="cpu", steps=0))


def test_isolated_modes_match_in_process_losses() -> None:
    """A fresh process per mode (the default) trains exactly as in process."""
    settings = BenchSettings(device="cpu", size=32, batch=8, steps=2, modes=("fp32", "AMP-O1"))
    isolated = run_bench(settings)
    settings.isolate = False
    inline = run_bench(settings)
    assert [r.losses for r in isolated.results] == [r.losses for r in inline.results]
    assert all(r.peak_memory is not None for r in isolated.results)


def test_an_error_in_the_isolated_process_is_raised_here() -> None:
    from ampcore._bench import _run_isolated

    with pytest.raises(ampcore.AmpcoreError, match="mode 'fp64' failed: AmpcoreError: ampcore bench: unknown mode 'fp64'"):
        _run_isolated("fp64", BenchSettings(steps=1), "cpu", torch.bfloat16, 8, 2, None)


@pytest.mark.parametrize("field", ["size", "batch"])
def test_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=f"--{field} must be a positive integer"):
        run_bench(BenchSettings(device="cpu", **{field: 0 if field == "batch" else -1}))
