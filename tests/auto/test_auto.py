"""level="auto": decisions from costs, plans applied per shape class, custom lists, black-list
ops, validation, and the plan's round trip across processes.

Decisions are tested with injected costs (a plan given to ``ampcore.load_plan``), never with
wall-clock thresholds; the tests that measure only check that measuring happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_adapter
from torch import nn

import ampcore
from ampcore._auto import Costs, _hooks, decide
from ampcore._auto._cache import forget_plans, write_cache
from ampcore._auto._shapes import shape_class
from ampcore._cli.main import main


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A private disk cache, no in-memory plans, a full warm-up budget, no emulation warning."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("AMPCORE_AUTO_CACHE", str(cache))
    forget_plans()
    monkeypatch.setattr(_hooks._process, "spent_s", 0.0)
    monkeypatch.setattr(_hooks._process, "warned", False)
    monkeypatch.setattr(_hooks._process, "exhausted_warned", False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*runs emulated.*", category=ampcore.AmpcoreWarning)
        yield cache
    forget_plans()


class Mixed(nn.Module):
    """A large Linear, then small residual Linears: the issue's mixed model, tiny."""

    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(32, 32)
        self.small = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.down = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.big(x)
        for layer in self.small:
            y = y + layer(y)
        return x, y


def _classes(model: Mixed, x: torch.Tensor, y: torch.Tensor) -> tuple[str, str]:
    with torch.enable_grad():
        return shape_class(model.big, (x,), "cpu"), shape_class(model.small[0], (y,), "cpu")  # type: ignore[return-value]


def _plan(decisions: dict[str, str]) -> dict[str, Any]:
    costs = {"low": Costs(10.0, 4.0, 1.0), "fp32": Costs(1.0, 4.0, 1.0)}
    entries = {key: {"decision": d, "costs": costs[d].as_dict(), "source": "given"} for key, d in decisions.items()}
    return {"format": 1, "fingerprint": ampcore.auto_plan("cpu").fingerprint, "entries": entries}


def _output_dtypes(model: nn.Module, run: Any) -> dict[str, torch.dtype]:
    seen: dict[str, torch.dtype] = {}
    handles = [
        module.register_forward_hook(lambda m, a, out, name=name: seen.update({name: out.dtype}) and None)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return seen


# -- the cost model (pure) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fp32", "low", "expected"),
    [
        (10.0, 5.0, "low"),
        (10.0, 9.6, "low"),
        (10.0, 10.0, "low"),
        (10.0, 10.2, "low"),
        (10.0, 10.4, "fp32"),
        (1.0, 30.0, "fp32"),
    ],
)
def test_decide_is_a_pure_function_of_the_costs(fp32: float, low: float, expected: str) -> None:
    costs = Costs(fp32_ms=fp32, low_ms=low, cast_ms=0.5)
    assert decide(costs) == expected
    assert decide(costs) == decide(Costs(**costs.as_dict()))  # deterministic, no hidden state


def test_decide_ties_within_margin_or_spread_go_to_torch_autocasts_choice() -> None:
    costs = Costs(fp32_ms=10.0, low_ms=12.0, cast_ms=1.0)
    assert decide(costs, margin=0.1) == "fp32"
    assert decide(costs, margin=0.25) == "low"  # within the margin: low, as torch.autocast
    assert decide(Costs(10.0, 12.0, 1.0, fp32_spread=0.3)) == "low"  # within the measured spread
    assert decide(Costs(10.0, 12.0, 1.0, low_spread=0.1)) == "fp32"


def test_shape_classes_bucket_sizes_and_separate_kinds() -> None:
    linear = nn.Linear(64, 32)
    a = shape_class(linear, (torch.zeros(500, 64),), "cpu")
    b = shape_class(linear, (torch.zeros(512, 64),), "cpu")
    c = shape_class(linear, (torch.zeros(16, 64),), "cpu")
    assert a == b != c
    assert shape_class(nn.ReLU(), (torch.zeros(4),), "cpu") is None  # not a planned kind
    assert shape_class(linear, (torch.zeros(4, 64, dtype=torch.long),), "cpu") is None  # nothing floating


# -- plans applied ---------------------------------------------------------------------


def test_plan_decides_per_shape_class_not_per_op_name() -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    big, small = _classes(model, x, y)
    ampcore.load_plan(_plan({big: "low", small: "fp32"}))
    with ampcore.autocast("cpu", level="auto"):
        dtypes = _output_dtypes(model, lambda: model(x, y))
    assert dtypes == {"big": torch.bfloat16, "small.0": torch.float32, "small.1": torch.float32}


def test_fp32_module_gets_float32_inputs_and_gradients_flow() -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    big, small = _classes(model, x, y)
    small_bf16 = _classes(model, x, y.bfloat16())[1]  # the input's dtype is part of the class
    assert small_bf16 == small.replace("[4x8]", "[4x8:bfloat16]")
    ampcore.load_plan(_plan({big: "low", small: "fp32", small_bf16: "fp32"}))
    with ampcore.autocast("cpu", level="auto"):
        out_x, out_y = model(x, y.bfloat16())  # a low-precision input reaches a float32 layer
    assert out_y.dtype == torch.float32
    (out_x.float().sum() + out_y.sum()).backward()
    assert all(
        p.grad is not None and p.grad.dtype == torch.float32
        for p in model.parameters()
        if p is not model.down.weight and p is not model.down.bias
    )


def test_custom_lists_override_the_plan() -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    big, small = _classes(model, x, y)
    ampcore.load_plan(_plan({big: "low", small: "fp32"}))
    with ampcore.autocast("cpu", level="auto", custom_black_list={"linear"}):
        dtypes = _output_dtypes(model, lambda: model(x, y))
    assert set(dtypes.values()) == {torch.float32}
    with ampcore.autocast("cpu", level="auto", custom_white_list={"linear"}):
        dtypes = _output_dtypes(model, lambda: model(x, y))
    assert set(dtypes.values()) == {torch.bfloat16}


def test_black_list_ops_stay_float32_as_in_o1() -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    big, small = _classes(model, x, y)
    ampcore.load_plan(_plan({big: "low", small: "fp32"}))
    with ampcore.autocast("cpu", level="auto"):
        out_x, _ = model(x, y)
        assert out_x.dtype == torch.bfloat16
        loss = nn.functional.mse_loss(out_x, torch.zeros_like(x))
        assert nn.functional.l1_loss(out_x, out_x.detach()).dtype == torch.float32
        assert torch.cdist(out_x, out_x).dtype == torch.float32
    with ampcore.autocast("cpu", level="O1"):
        reference = nn.functional.mse_loss(model(x, y)[0], torch.zeros_like(x))
    assert loss.dtype == reference.dtype == torch.float32
    torch.testing.assert_close(loss, reference)


def test_frozen_plan_measures_nothing_and_runs_unknown_classes_with_o1_lists() -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    ampcore.load_plan(_plan({}))
    region = ampcore.autocast("cpu", level="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)  # no "measuring" warning
        with region:
            dtypes = _output_dtypes(model, lambda: model(x, y))
    assert set(dtypes.values()) == {torch.bfloat16}
    assert ampcore.auto_plan("cpu").entries == {}


def test_outside_auto_regions_nothing_changes() -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    big, small = _classes(model, x, y)
    ampcore.load_plan(_plan({big: "fp32", small: "fp32"}))
    with ampcore.autocast("cpu", level="O1"):
        assert set(_output_dtypes(model, lambda: model(x, y)).values()) == {torch.bfloat16}
    with ampcore.autocast("cpu", level="auto"), ampcore.autocast("cpu", level="O1"):  # innermost decides
        assert set(_output_dtypes(model, lambda: model(x, y)).values()) == {torch.bfloat16}
    assert set(_output_dtypes(model, lambda: model(x, y)).values()) == {torch.float32}


def test_measuring_fills_the_plan_and_leaves_module_state_alone(fresh: Path) -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    torch.manual_seed(0)
    expected_rng = torch.get_rng_state()
    region = ampcore.autocast("cpu", level="auto")
    with pytest.warns(ampcore.AmpcoreWarning, match="measuring the costs"), region:
        model(x, y)
    assert torch.equal(torch.get_rng_state(), expected_rng)
    assert all(p.grad is None for p in model.parameters())
    plan = ampcore.auto_plan("cpu")
    assert set(plan.entries) == set(_classes(model, x, y))
    for entry in plan.entries.values():
        assert entry.source == "measured" and entry.costs is not None
        assert entry.costs.fp32_ms > 0 and entry.costs.low_ms > 0
        assert entry.decision == decide(entry.costs)
    assert "decision" in ampcore.debugging.auto_plan_table("cpu")
    assert list(fresh.glob("auto-cpu-bfloat16-*.json"))  # written to the disk cache


def test_disk_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, fresh: Path) -> None:
    monkeypatch.setenv("AMPCORE_AUTO_CACHE", "off")
    model = nn.Linear(4, 4)
    region = ampcore.autocast("cpu", level="auto")
    with pytest.warns(ampcore.AmpcoreWarning, match="disk cache is off"), region:
        model(torch.randn(2, 4))
    assert ampcore.auto_plan("cpu").entries
    assert not fresh.exists()


# -- validation ------------------------------------------------------------------------


def test_level_auto_is_validated_like_other_levels() -> None:
    assert ampcore.autocast("cpu", level="AUTO").level == "auto"
    assert "auto" in ampcore.LEVELS
    with pytest.raises(ampcore.AmpcoreError, match=r"level='automatic'.*valid levels: O0, OD, O1, O2, auto"):
        ampcore.autocast("cpu", level="automatic")
    lists = ampcore.oplists("cpu", level="auto")
    assert lists.white == ampcore.oplists("cpu", level="O1").white and lists.unlisted == "follow-inputs"


def test_load_plan_errors_name_what_is_wrong(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ampcore.AmpcoreError, match="not JSON"):
        ampcore.load_plan(bad)
    with pytest.raises(ampcore.AmpcoreError, match="cannot read the file"):
        ampcore.load_plan(tmp_path / "missing.json")
    plan = _plan({"k": "low"})
    plan["entries"]["k"]["decision"] = "fast"
    with pytest.raises(ampcore.AmpcoreError, match=r"decision 'fast'.*valid: 'low', 'fp32'"):
        ampcore.load_plan(plan)
    other = _plan({"k": "low"})
    other["fingerprint"] = {**other["fingerprint"], "torch": "1.0"}
    with pytest.raises(ampcore.AmpcoreError, match=r"another setting \(torch differ"):
        ampcore.load_plan(other)
    assert ampcore.load_plan(other, check=False).decision("k") == "low"
    assert ampcore.auto_plan("cpu").decision("k") == "low"  # installed for this process's setting


# -- reproducible across processes -----------------------------------------------------

_CHILD = r"""
import json, sys, warnings, torch, ampcore
from torch import nn
warnings.filterwarnings("ignore", message=".*runs emulated.*")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
mode, path = sys.argv[1], sys.argv[2]
if mode == "load":
    ampcore.load_plan(path)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    due = sorted(ampcore.auto_plan("cpu").due)  # cached provisional (measured busy or noisy): measured again
    for _ in range(2):
        with ampcore.autocast("cpu", level="auto"):
            loss = model(torch.randn(16, 32)).float().sum()
        loss.backward()
measured = any("measuring the costs" in str(w.message) for w in caught)
plan = ampcore.auto_plan("cpu")
if mode == "measure":
    plan.save(path)
print(json.dumps({"measured": measured, "decisions": {k: e.decision for k, e in plan.entries.items()}, "due": due,
                  "sources": sorted({e.source for e in plan.entries.values()})}))
"""


def _child(mode: str, path: Path, cache: str) -> dict[str, Any]:
    env = {**os.environ, "AMPCORE_AUTO_CACHE": cache}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_plan_round_trip_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    first = _child("measure", path, str(tmp_path / "cache"))
    # (2 layers; a class more where the first step, at O1, fed the second layer bfloat16)
    assert first["measured"] and len(first["decisions"]) >= 2 and first["sources"] == ["measured"]
    loaded = _child("load", path, "off")  # another process, no cache: the file decides
    assert not loaded["measured"] and loaded["decisions"] == first["decisions"] and loaded["sources"] == ["loaded"]
    cached = _child("cache", tmp_path / "unused.json", str(tmp_path / "cache"))  # later run: the disk cache
    # (only the classes the first measured busy or noisy, provisional, are measured again: this machine's load)
    settled = {k: d for k, d in first["decisions"].items() if k not in cached["due"]}
    assert cached["measured"] == bool(cached["due"]) and settled.items() <= cached["decisions"].items()
    assert cached["sources"] == ["cache"] or cached["due"] and set(cached["sources"]) <= {"cache", "measured"}


# -- command line and bench ------------------------------------------------------------


def test_cli_plan_show_check_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    big, small = _classes(model, x, y)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan({big: "low", small: "fp32"})))
    assert main(["plan", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fp32 ms" in out and "low ms" in out and "cast ms" in out and big in out
    assert main(["plan", "check", str(path)]) == 0
    assert main(["plan", "export", str(tmp_path / "out.json"), "--device", "cpu"]) == 1  # nothing cached
    assert "nothing to export" in capsys.readouterr().err
    ampcore.load_plan(path, freeze=False)
    with ampcore.autocast("cpu", level="auto"):
        model(x, y)
    write_cache(ampcore.auto_plan("cpu"))
    forget_plans()
    assert main(["plan", "export", str(tmp_path / "out.json"), "--device", "cpu"]) == 0
    assert set(json.loads((tmp_path / "out.json").read_text())["entries"]) == {big, small}


@pytest.mark.filterwarnings("ignore:.*measuring the costs:ampcore.AmpcoreWarning")
def test_bench_has_an_amp_auto_mode() -> None:
    from ampcore._cli.experiment import BenchSettings, run_bench

    result = run_bench(
        BenchSettings(device="cpu", size=16, batch=4, steps=2, isolate=False, modes=("fp32", "AMP-auto"))
    )
    assert [r.mode for r in result.results] == ["fp32", "AMP-auto"]
    assert result.results[1].final_loss == pytest.approx(result.results[0].final_loss, rel=0.05)


def test_an_exception_in_a_float32_module_restores_autocast() -> None:
    linear = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with torch.enable_grad():
        key = shape_class(linear, (x,), "cpu")
    ampcore.load_plan(_plan({key: "fp32"}))  # type: ignore[dict-item]
    linear.weight.data = torch.randn(8, 9)  # the call fails inside forward
    with ampcore.autocast("cpu", level="auto"):
        with pytest.raises(RuntimeError):
            linear(x)
        assert torch.is_autocast_enabled("cpu")
        assert not _hooks._local.frames


def test_an_adapter_hook_supplies_costs_instead_of_measuring(register: Any) -> None:
    asked: list[str] = []

    def costs(shape_class: str, dtype: torch.dtype) -> dict[str, float] | None:
        asked.append(shape_class)
        return {"fp32_ms": 1.0, "low_ms": 0.5, "cast_ms": 0.1} if "in_features=8" in shape_class else None

    register(make_adapter("autocosts", ampcore_auto_costs=costs), name="autocosts")
    linear = nn.Linear(8, 8)
    region = ampcore.autocast("autocosts", level="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)  # nothing measured
        with region:
            linear(torch.randn(4, 8))
    plan = ampcore.auto_plan("autocosts")
    (entry,) = plan.entries.values()
    assert entry.source == "adapter" and entry.decision == "low" and asked == [entry.shape_class]


@pytest.mark.cuda_runtime  # torch.compile saves the CUDA generator's state once a GPU is reported
@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks:UserWarning")
def test_under_torch_compile_the_plan_is_not_applied_and_results_match_o1() -> None:
    model, x, y = Mixed(), torch.randn(16, 32), torch.randn(4, 8)
    big, small = _classes(model, x, y)
    ampcore.load_plan(_plan({big: "fp32", small: "fp32"}))
    compiled = torch.compile(model, backend="eager")
    with ampcore.autocast("cpu", level="auto"):
        out = compiled(x, y)
    with ampcore.autocast("cpu", level="O1"):
        reference = model(x, y)
    assert out[0].dtype == reference[0].dtype == torch.bfloat16  # O1's lists, not the plan
    torch.testing.assert_close(out, reference)
