"""``ampcore bench``: every mode trains, the table and JSON hold what they claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore._cli.bench import format_result, plot_result
from ampcore._cli.experiment import (
    GUIDE_SIZES,
    HOST_SIZES,
    MODES,
    BenchResult,
    BenchSettings,
    ModeResult,
    default_sizes,
    run_bench,
    unreliable_reasons,
)
from ampcore._cli.main import main

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
    # ampcore's scaler is a transparent no-op for bf16: no scale to report (not "1")
    assert {r.mode: r.loss_scale for r in result.results} == dict.fromkeys(MODES)
    assert not any(line.rstrip().endswith(" 1") for line in format_result(result).splitlines()[4:8])


def test_fp16_reports_the_loss_scale(no_emulation_warning: None) -> None:
    fp16 = run_bench(
        BenchSettings(
            device="cpu", dtype=torch.float16, size=16, batch=4, steps=2, modes=("fp32", "AMP-O1"), isolate=False
        )
    )
    assert fp16.results[1].loss_scale == 1024.0


def test_table_lists_modes_and_columns(result) -> None:
    text = format_result(result)
    assert "9 x Linear(64, 64), batch 16" in text
    for column in ("ms/step", "speed-up", "final loss", "peak memory", "loss scale"):
        assert column in text
    for mode in MODES:
        assert any(line.startswith(mode) for line in text.splitlines())


def test_cli_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--device",
            "cpu",
            "--size",
            "32",
            "--batch",
            "8",
            "--steps",
            "2",
            "--warmup",
            "0",
            "--modes",
            "fp32",
            "AMP-O1",
            "--in-process",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert [r["mode"] for r in data["results"]] == ["fp32", "AMP-O1"]
    assert data["backend"] == "cpu" and data["size"] == 32 and data["versions"]["ampcore"] == ampcore.__version__
    assert "AMP-O1" in capsys.readouterr().out


def test_plot_without_matplotlib_fails_before_training(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
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
    big = register(make_adapter("big", ampcore_memory=lambda: {"total": 80 * 2**30}), name="big")
    small = register(make_adapter("small", ampcore_memory=lambda: {"total": 8 * 2**30}), name="small")
    assert default_sizes(big) == GUIDE_SIZES and default_sizes(small) == HOST_SIZES


def test_bad_settings() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="unknown mode"):
        run_bench(BenchSettings(device="cpu", modes=("fp64",)))
    with pytest.raises(ampcore.AmpcoreError, match="steps and batches must be >= 1"):
        run_bench(BenchSettings(device="cpu", steps=0))


@pytest.mark.slow
def test_isolated_modes_match_in_process_losses() -> None:
    """A fresh process per mode (the default) trains exactly as in process."""
    settings = BenchSettings(device="cpu", size=32, batch=8, steps=2, modes=("fp32", "AMP-O1"))
    isolated = run_bench(settings)
    settings.isolate = False
    inline = run_bench(settings)
    assert [r.losses for r in isolated.results] == [r.losses for r in inline.results]
    assert all(r.peak_memory is not None for r in isolated.results)


@pytest.mark.slow
def test_an_error_in_the_isolated_process_is_raised_here() -> None:
    from ampcore._cli.experiment import _run_isolated

    with pytest.raises(
        ampcore.AmpcoreError, match="mode 'fp64' failed: AmpcoreError: ampcore bench: unknown mode 'fp64'"
    ):
        _run_isolated("fp64", BenchSettings(steps=1), "cpu", torch.bfloat16, 8, 2, None)


@pytest.mark.parametrize("field", ["size", "batch"])
def test_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=f"--{field} must be a positive integer"):
        run_bench(BenchSettings(device="cpu", **{field: 0 if field == "batch" else -1}))


def _fake(load: float | None = 0.1, repeats: int = 1) -> BenchResult:
    result = BenchResult(
        "cpu", "AMD EPYC", "bfloat16", 2048, 512, 4, 0, 1e-4, {}, repeats=repeats, load_average=load, cpus=2
    )
    result.results = [
        ModeResult("fp32", 700.0, [700.0, 700.0, 701.0, 699.0], [0.5, 0.333110], 0.333110, 479 * 2**20, None),
        ModeResult(
            "AMP-O1", 350.0, [350.0, 350.0, 351.0, 349.0], [0.5, 0.3331100001], 0.3331100001, 481 * 2**20, None, 2.0
        ),
    ]
    return result


def test_no_negative_zero_or_scale_one_noise() -> None:
    text = format_result(_fake())
    assert "-0.000%" not in text and "<0.001%" in text
    row = next(line for line in text.splitlines() if line.startswith("AMP-O1"))
    assert row.split()[-1] == "-" and "349-351" in row  # no scale; min-max of the steps


def test_table_says_what_amp_o1_adds_and_fits_100_columns() -> None:
    text = format_result(_fake())
    assert "custom_white_list={'elementwise_add'}" in text and "ampcore.GradScaler" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "unreliable" not in text


def test_a_busy_machine_or_a_wide_spread_is_called_unreliable() -> None:
    busy = _fake(load=5.0)
    assert unreliable_reasons(busy) == ["the machine was busy (load average 5.00 on 2 CPUs at the start)"]
    assert "WARNING: these speed-ups are unreliable: the machine was busy" in format_result(busy)
    spread = _fake()
    spread.results[1].step_ms = [100.0, 350.0, 900.0, 1500.0]
    assert "step times spread widely in AMP-O1" in unreliable_reasons(spread)[0]
    repeats = _fake(repeats=3)
    repeats.results[1].speedup_range = [1.2, 3.9]
    assert unreliable_reasons(repeats) == ["the repeats disagree (AMP-O1 1.20-3.90x)"]
    assert "2.00x (1.20-3.90)" in format_result(repeats)


def test_repeats_are_interleaved_and_give_a_speedup_range() -> None:
    settings = BenchSettings(
        device="cpu", size=16, batch=4, steps=2, repeats=2, modes=("fp32", "AMP-O1"), isolate=False
    )
    order: list[str] = []
    result = run_bench(settings, on_step=lambda mode, step, total: order.append(mode) if step == total else None)
    assert order == ["fp32", "AMP-O1", "fp32", "AMP-O1"]
    fp32, o1 = result.results
    assert len(o1.step_ms) == 4 and len(o1.repeat_ms) == 2 and fp32.speedup_range is None
    ratios = [f / m for f, m in zip(fp32.repeat_ms, o1.repeat_ms, strict=False)]
    assert o1.speedup_range == [min(ratios), max(ratios)]
    with pytest.raises(ampcore.AmpcoreError, match="--repeats must be a positive integer"):
        run_bench(BenchSettings(device="cpu", repeats=0))


def test_plot_has_integer_step_ticks_and_a_difference_panel(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    captured = {}
    real_subplots = plt.subplots

    def subplots(*args, **kwargs):  # type: ignore[no-untyped-def]
        fig, axes = real_subplots(*args, **kwargs)
        captured["axes"] = axes
        return fig, axes

    result = _fake()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plt, "subplots", subplots)
        plot_result(result, str(tmp_path / "bench.png"))
    assert (tmp_path / "bench.png").stat().st_size > 0
    times, losses, deltas = captured["axes"]
    assert deltas.get_title() == "loss minus fp32's loss"
    for axis in (times, losses, deltas):
        assert all(float(t).is_integer() for t in axis.get_xticks())
    styles = {line.get_linestyle() for line in losses.get_lines()}
    assert len(styles) == len(result.results)  # coinciding curves stay apart
    fp32_delta, o1_delta = (line.get_ydata() for line in deltas.get_lines())
    assert list(fp32_delta) == [0.0, 0.0] and o1_delta[-1] == pytest.approx(1e-10)


# -- issue 12: output paths checked before the run; no "nanx" without an fp32 run ----------


@pytest.mark.parametrize("option", ["--json", "--plot"])
@pytest.mark.parametrize("where", ["missing-dir/out", "a-file/out", "."])
def test_unwritable_output_paths_fail_before_training(
    option: str, where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("")
    path = str(tmp_path / where) + (".png" if option == "--plot" else ".json") if where != "." else str(tmp_path)
    import ampcore._cli.bench as cli_bench

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran before the output path was checked")

    monkeypatch.setattr(cli_bench, "run_bench", never)
    assert main(["bench", "--device", "cpu", option, path, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"ampcore bench {option} {path}" in err
    assert not Path(path).is_file() or where == "."


def test_modes_without_fp32_show_no_nan_speedup(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--device",
            "cpu",
            "--size",
            "16",
            "--batch",
            "4",
            "--steps",
            "2",
            "--modes",
            "AMP-O1",
            "--in-process",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "nan" not in text.lower()
    assert "NaN" not in out.read_text()  # valid JSON: null, not NaN
    data = json.loads(out.read_text())
    assert data["results"][0]["speedup"] is None


@pytest.mark.parametrize("spelling", ["bf16", "BFloat16", "torch.bfloat16", "fp16", "half"])
def test_dtype_accepts_the_spellings_conformance_accepts(spelling: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", "--device", "cpu", "--dtype", spelling, "--size", "16", "--batch", "4", "--steps", "1",
                 "--warmup", "0", "--modes", "AMP-O1", "--in-process", "--no-progress",
                 "--json", str(out)])  # fmt: skip
    assert code == 0
    assert json.loads(out.read_text())["dtype"] == str(ampcore.toolkit.parse_dtype(spelling)).removeprefix("torch.")


def test_dtype_refuses_a_non_dtype_listing_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--device", "cpu", "--dtype", "fp8", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "ampcore bench --dtype fp8" in err and "bf16" in err


def test_torch_autocast_row_says_it_is_blind_to_a_device_overflow_flag() -> None:
    result = _fake()
    result.results.append(ModeResult("torch.autocast", 360.0, [360.0, 360.0], [0.5, 0.3331], 0.3331, None, 1024.0, 1.9))
    assert "blind to that flag" not in format_result(result)
    result.overflow_flag = True
    text = format_result(result)
    assert (
        "torch's GradScaler, which is blind to that flag" in text
        and max(len(line) for line in text.splitlines()) <= 100
    )


def test_the_model_is_built_on_the_device() -> None:
    """No host-side initialisation and copy of 9 x size^2 weights (issue 24: minutes on a GPU)."""
    from ampcore._cli.experiment import SeedNet

    model = SeedNet(8, torch.device("meta"))
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_the_table_says_where_the_time_went() -> None:
    result = run_bench(BenchSettings(device="cpu", size=16, batch=4, steps=2, modes=("fp32", "AMP-O1"), isolate=False))
    for r in result.results:
        assert r.setup_s > 0 and r.steps_s > 0 and r.start_s == 0.0  # in process: no process start
    assert result.wall_s >= sum(r.setup_s + r.steps_s for r in result.results)
    note = format_result(result).split("time: ")[1]
    assert note.startswith("wall ") and "fp32 set-up " in note and "AMP-O1 set-up " in note


@pytest.mark.slow
def test_isolated_modes_count_their_process_start() -> None:
    result = run_bench(BenchSettings(device="cpu", size=16, batch=4, steps=2, modes=("fp32", "AMP-O1")))
    assert all(r.start_s > 0 for r in result.results)
    assert "fp32 start " in format_result(result)


def test_modes_fork_from_a_server_that_imported_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each mode's process starts without importing torch and ampcore again (spawn on request)."""
    import multiprocessing

    from ampcore._cli.experiment import _process_context

    if "forkserver" in multiprocessing.get_all_start_methods():
        assert _process_context().get_start_method() == "forkserver"
    monkeypatch.setenv("AMPCORE_BENCH_START_METHOD", "spawn")
    assert _process_context().get_start_method() == "spawn"
