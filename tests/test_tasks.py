"""``tasks.py`` (the README's two commands): the torch spec carries pip options, set-up is
skipped when nothing changed, and ``test`` ends with one summary of every stage."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tasks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    names = ("AMPCORE_TORCH", "AMPCORE_VENV", "AMPCORE_REPORTS", "AMPCORE_CONFORMANCE", "AMPCORE_CPU_MANIFEST")
    for name in (*names, "AMPCORE_LINT"):
        monkeypatch.delenv(name, raising=False)  # `tasks.py compat` runs these tests with its own
    spec = importlib.util.spec_from_file_location("ampcore_tasks", ROOT / "tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ampcore_tasks", module)  # dataclasses look the module up
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "VENV", tmp_path / "venv")
    monkeypatch.setattr(module, "STAMP", tmp_path / "venv" / "ampcore-setup.json")
    monkeypatch.setattr(module, "PY", Path(sys.executable))
    return module


def test_torch_spec_carries_pip_options(tasks: ModuleType) -> None:
    spec = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu --find-links '/my wheels'"
    assert tasks.torch_args(spec) == [
        "torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu", "--find-links", "/my wheels",
    ]  # fmt: skip
    assert tasks.torch_args("torch==2.13.0") == ["torch==2.13.0"]


def test_setup_is_skipped_when_the_stamp_matches(tasks: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(tasks, "pip", lambda stage, *args: calls.append(args))
    tasks.STAMP.parent.mkdir(parents=True)
    tasks.STAMP.write_text(json.dumps({"key": tasks._setup_key(), "extras": ["test"]}))
    tasks.setup(extras=())  # the demo needs less than what is there
    tasks.setup(extras=("test",))
    assert calls == []
    tasks.STAMP.write_text(json.dumps({"key": tasks._setup_key(), "extras": []}))
    assert not tasks._up_to_date(("test",))  # the demo's venv lacks the test extra
    monkeypatch.setattr(tasks, "TORCH", "torch==2.12.0")
    assert not tasks._up_to_date(())  # another torch spec: reinstall


def test_the_demo_does_not_install_the_test_extra(tasks: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(tasks, "pip", lambda stage, *args: calls.append(tuple(map(str, args))))
    monkeypatch.setattr(tasks, "_up_to_date", lambda extras: False)
    monkeypatch.setattr(tasks.subprocess, "run", lambda *a, **k: type("Done", (), {"stdout": "2.13.0+cpu\n"})())
    monkeypatch.setattr(tasks, "CONSTRAINTS", tasks.VENV / "constraints.txt")
    tasks.VENV.mkdir()
    tasks.setup(extras=())
    assert calls[0] == ("torch==2.13.0",)
    assert calls[1][-1] == str(ROOT) and not any("[test]" in arg for arg in calls[1])
    assert tasks.CONSTRAINTS.read_text() == "torch==2.13.0+cpu\n"  # the rest keeps that exact build
    assert json.loads(tasks.STAMP.read_text())["extras"] == []


def test_pytest_collecting_nothing_is_a_failed_stage(tasks: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    stage = tasks.run_pytest([str(tmp_path / "empty"), "-p", "no:cacheprovider"])
    assert not stage.ok and "no tests were collected" in stage.detail


def test_summary_lists_every_stage_and_fails_on_any(tasks: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    stages = [
        tasks.Stage("pytest", True, "649 passed, 3 skipped in 95.00s"),
        tasks.Stage("conformance cpu-bfloat16", True, "120 passed"),
        tasks.Stage("conformance example-all", False, "1 failed, 60 passed"),
    ]
    assert not tasks.summarize(stages, 0.0)
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("FAILED: conformance example-all")
    assert any("649 passed" in line and line.lstrip().startswith("ok") for line in out)
    assert tasks.summarize(stages[:2], 0.0)
    assert "all 2 stages passed" in capsys.readouterr().out


def test_conformance_runs_stay_a_data_table(tasks: ModuleType) -> None:
    assert ("cpu", "bfloat16", {}) in tasks.CONFORMANCE_RUNS and all(len(run) == 3 for run in tasks.CONFORMANCE_RUNS)
    modes = {env.get("AMPCORE_ACME_AUTOCAST") for backend, _, env in tasks.CONFORMANCE_RUNS if backend == "acme"}
    assert modes == {"none", "fallthrough", "partial", "generic"}
    saturating = [
        (dtype, env) for backend, dtype, env in tasks.CONFORMANCE_RUNS if env.get("AMPCORE_ACME_FP16") == "saturate"
    ]
    assert saturating == [
        (None, {"AMPCORE_ACME_AUTOCAST": "generic", "AMPCORE_ACME_FP16": "saturate"})
    ]  # every dtype the device runs


@pytest.mark.parametrize("reason", [None, "torch 2.8.0 cannot register a PrivateUse1 device from Python (...)"])
def test_test_device_runs_are_skipped_with_the_reason_only_where_torch_cannot_host_it(
    tasks: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], reason: str | None
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(tasks, "installed_backends", lambda: {"cpu", "example", "acme"})
    monkeypatch.setattr(tasks, "testdevice_unsupported_reason", lambda: reason)
    monkeypatch.setattr(tasks, "_report_counts", lambda report_dir: "1 passed")
    monkeypatch.setattr(
        tasks.subprocess, "run", lambda command, **kw: ran.append(command[3]) or type("Done", (), {"returncode": 0})()
    )
    stages = tasks.conformance()
    acme = [stage for stage in stages if stage.name.startswith("conformance acme")]
    assert len(acme) == 5 and ran.count("cpu") == 2 and "example" in ran
    assert all(stage.skipped == (reason is not None) and stage.ok for stage in acme)
    assert ran.count("acme") == (0 if reason else 5)  # skipped: not started at all
    assert tasks.summarize(stages, 0.0)
    out = capsys.readouterr().out
    if reason:
        assert f"conformance acme-float16-none: skipped: {reason}" in out  # printed as it happens
        assert "all 3 stages passed, 5 skipped" in out and out.count("  skip  conformance acme") == 5
    else:
        assert "all 8 stages passed" in out and "skip" not in out


def test_the_test_device_capability_is_asked_of_the_venvs_torch(tasks: ModuleType) -> None:
    device = pytest.importorskip("ampcore_testdevice")  # PY is this interpreter (the fixture)
    assert tasks.testdevice_unsupported_reason() == device.unsupported_reason()


def test_compat_pins_torch_and_the_matching_ipex(tasks: ModuleType) -> None:
    assert tasks.compat_requirements("2.8.0", "2.8.0") == ["torch==2.8.0", "intel-extension-for-pytorch==2.8.0"]
    assert tasks.compat_requirements("2.8.0", "none") == ["torch==2.8.0"]


def test_the_ipex_run_adds_only_what_its_pins_change(tasks: ModuleType) -> None:
    # pip's dry run (--report) with transformers pinned below 5: what differs from the venv
    # goes into IPEX's folder (first on the IPEX run's PYTHONPATH), nothing the venv has already
    report = {"install": [{"metadata": {"name": n, "version": v}} for n, v in (
        ("transformers", "4.51.3"), ("huggingface_hub", "0.36.2"), ("requests", "2.34.2"), ("ampcore", "0.2.0"),
    )]}  # fmt: skip
    installed = {"transformers": "5.24.0", "huggingface-hub": "2.4.0", "ampcore": "0.2.0", "numpy": "2.4.6"}
    wanted = ["transformers==4.51.3", "huggingface_hub==0.36.2", "requests==2.34.2"]
    assert tasks.ipex_overlay(report, installed) == wanted
    assert tasks.ipex_overlay({"install": []}, installed) == []
    assert any(pin.startswith("transformers==4.") for pin in tasks.COMPAT_IPEX_PINS)


@pytest.mark.parametrize(("only", "ipex"), [("plain", "2.8.0"), ("ipex", "none")])
def test_compat_refuses_a_run_it_cannot_make_alone(
    tasks: ModuleType, monkeypatch: pytest.MonkeyPatch, only: str, ipex: str
) -> None:
    monkeypatch.setattr(tasks, "COMPAT_ONLY", only)
    monkeypatch.setattr(tasks, "COMPAT_IPEX", ipex)
    monkeypatch.setattr(tasks, "_download_compat", lambda: pytest.fail("downloaded before the check"))
    with pytest.raises(SystemExit, match=f"AMPCORE_COMPAT_ONLY='{only}': expected 'ipex'"):
        tasks.compat([])


def test_compat_runs_install_torch_from_the_cache_only(tasks: ModuleType, tmp_path: Path) -> None:
    plain = tasks.compat_env(None)
    assert plain["AMPCORE_VENV"] == str(tasks.COMPAT_VENV) and plain["AMPCORE_CONFORMANCE"] == "always"
    assert tasks.torch_args(plain["AMPCORE_TORCH"]) == [
        f"torch=={tasks.COMPAT_TORCH}", "--no-index", "--find-links", str(tasks.COMPAT_CACHE),
    ]  # fmt: skip
    assert "AMPCORE_IMPORT_IPEX" not in plain and plain["AMPCORE_REPORTS"].endswith(f"compat-torch{tasks.COMPAT_TORCH}")
    with_ipex = tasks.compat_env(tmp_path / "ipex")
    assert with_ipex["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "ipex")
    assert with_ipex["AMPCORE_IMPORT_IPEX"] == "1" and with_ipex["AMPCORE_REPORTS"].endswith("-ipex")
    assert Path(with_ipex["AMPCORE_CPU_MANIFEST"]).is_file() and "AMPCORE_CPU_MANIFEST" not in plain


def _fake_tool(bin_dir: Path, name: str, output: str, code: int) -> None:
    """An executable ``bin_dir/name`` that prints ``output`` and exits with ``code``."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!{sys.executable}\nimport sys\nprint({output!r})\nsys.exit({code})\n")
    tool.chmod(0o755)


@pytest.mark.skipif(os.name == "nt", reason="the fake tools are scripts with a #! line")
def test_lint_fails_on_any_finding_and_names_the_tool(
    tasks: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tasks, "BIN", tmp_path / "bin")
    _fake_tool(tmp_path / "bin", "ruff", "All checks passed!", 0)
    _fake_tool(tmp_path / "bin", "mypy", "Success: no issues found in 72 source files", 0)
    clean = tasks.lint()
    assert clean.ok and clean.name == "lint"
    # the fake ruff answers both `ruff check .` and `ruff format --check .`
    assert clean.detail == (
        "ruff: All checks passed!; ruff: All checks passed!; mypy: Success: no issues found in 72 source files"
    )
    mypy_out = "x.py:1: error: bad  [misc]\nFound 1 error in 1 file (checked 72 source files)"
    _fake_tool(tmp_path / "bin", "mypy", mypy_out, 1)
    finding = tasks.lint()
    assert not finding.ok and "mypy: Found 1 error in 1 file (checked 72 source files) (exit 1)" in finding.detail
    (tmp_path / "bin" / "ruff").unlink()
    missing = tasks.lint()
    assert not missing.ok and "ruff: not installed" in missing.detail


def test_lint_commands_cover_the_whole_tree(tasks: ModuleType) -> None:
    """ruff checks and formats every file of the repository (tests, benchmarks, tasks.py and
    the docs' generators included), with the one config in pyproject.toml (issue 29)."""
    assert ("ruff", "check", ".") in tasks.LINT_COMMANDS
    assert ("ruff", "format", "--check", ".") in tasks.LINT_COMMANDS
    assert ("mypy", "--strict", "ampcore") in tasks.LINT_COMMANDS


@pytest.mark.parametrize(
    "line",
    [
        "All checks passed!",
        "Found 3 errors.",
        "Success: no issues found in 9 source files",
        "291 files already formatted",
        "1 file would be reformatted, 290 files already formatted",
    ],
)
def test_every_lint_tools_closing_line_is_recognised(tasks: ModuleType, line: str) -> None:
    assert tasks._LINT_SUMMARY.match(line)


@pytest.mark.parametrize(
    ("mode", "args", "linted"),
    [("auto", [], True), ("auto", ["tests/test_tasks.py"], False), ("always", ["-x"], True), ("never", [], False)],
)
def test_test_runs_lint_as_a_stage_as_ci_runs_it(
    tasks: ModuleType, monkeypatch: pytest.MonkeyPatch, mode: str, args: list[str], linted: bool
) -> None:
    summarized: list[list[str]] = []
    monkeypatch.setattr(tasks, "LINT_MODE", mode)
    monkeypatch.setattr(tasks, "setup", lambda: None)
    monkeypatch.setattr(tasks, "build_policy_kernel", lambda: None)
    monkeypatch.setattr(tasks, "lint", lambda: tasks.Stage("lint", True, "clean"))
    runs: list[tuple[list[str], dict[str, str] | None]] = []
    monkeypatch.setattr(
        tasks,
        "run_pytest",
        lambda args, env=None, name="pytest": runs.append((args, env)) or tasks.Stage(name, True, "1 passed"),
    )
    monkeypatch.setattr(tasks, "conformance", lambda: [tasks.Stage("conformance cpu-bfloat16", True, "1 passed")])
    monkeypatch.setattr(tasks, "summarize", lambda stages, started: summarized.append([s.name for s in stages]) or True)
    monkeypatch.setattr(tasks, "simulated_gpu_unsupported_reason", lambda: None)
    tasks.test(args)
    assert ("lint" in summarized[0]) is linted and "pytest" in summarized[0]
    # CI (no arguments) runs the policy tests a second time with the other policy-kernel
    # executor, and the suite as on a machine with a GPU
    assert (runs[1:] == [tasks.SECOND_EXECUTOR_RUN, tasks.SIMULATED_GPU_RUN]) is (not args)
    assert tasks.SECOND_EXECUTOR_RUN[1] == {"AMPCORE_POLICY_KERNEL": "python"}
    assert tasks.SIMULATED_GPU_RUN[1] == {"AMPCORE_TEST_SIMULATE_CUDA": "1"}


def test_the_faked_gpu_run_is_skipped_with_the_reason_where_torch_would_take_the_fake_for_real(
    tasks: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    reason = tasks.simulated_gpu_unsupported_reason()  # PY is this interpreter (the fixture)
    assert (reason is None) is (torch.version.cuda is None or torch.cuda.is_available())  # CI's CPU build: None
    stages: list[list[tasks.Stage]] = []
    runs: list[list[str]] = []
    monkeypatch.setattr(tasks, "setup", lambda: None)
    monkeypatch.setattr(tasks, "build_policy_kernel", lambda: None)
    monkeypatch.setattr(tasks, "lint", lambda: tasks.Stage("lint", True, "clean"))
    monkeypatch.setattr(tasks, "conformance", lambda: [])
    monkeypatch.setattr(
        tasks, "run_pytest", lambda args, env=None, name="p": runs.append(args) or tasks.Stage(name, True, "")
    )
    monkeypatch.setattr(tasks, "summarize", lambda got, started: stages.append(got) or True)
    monkeypatch.setattr(tasks, "simulated_gpu_unsupported_reason", lambda: "torch 2.8.0+cu128 is a CUDA build (...)")
    tasks.test([])
    faked = stages[0][-1]
    assert faked.name == "pytest with a faked CUDA GPU" and faked.skipped and faked.ok
    assert faked.detail == "skipped: torch 2.8.0+cu128 is a CUDA build (...)" and tasks.SIMULATED_GPU_RUN[0] not in runs
    assert "pytest with a faked CUDA GPU: skipped: torch 2.8.0+cu128" in capsys.readouterr().out


def test_compat_runs_do_not_lint(tasks: ModuleType) -> None:
    assert tasks.compat_env(None)["AMPCORE_LINT"] == "never"
