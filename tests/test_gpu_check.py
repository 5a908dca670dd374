"""The GPU check (``python3 tasks.py gpu``, ``benchmarks/gpu_check.py``): its stages, time
limits, summary, and the carried wheels (issue 24).  The check itself runs on a GPU machine;
here its pure parts, and stages that are tiny Python commands."""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check() -> ModuleType:
    return _load("ampcore_gpu_check", ROOT / "benchmarks" / "gpu_check.py")


@pytest.fixture(scope="module")
def wheels() -> ModuleType:
    return _load("ampcore_gpu_wheels", ROOT / "benchmarks" / "gpu_wheels.py")


@pytest.fixture(scope="module")
def tasks() -> ModuleType:
    return _load("ampcore_tasks_gpu", ROOT / "tasks.py")


def test_the_stages_cover_what_the_issue_asks(check: ModuleType, tmp_path: Path) -> None:
    plan = check.stages("cuda", tmp_path, "py")
    names = [stage.name for stage in plan]
    assert names[:4] == [
        "ampcore bench --device cuda",
        "conformance cuda float16",
        "conformance cuda bfloat16",
        "pytest -m 'not slow' (cuda present)",
    ]
    assert names[4:] == [row.name for row in check.SPEED_ROWS]
    bench, fp16, _, test = plan[:4]
    assert bench.command[:6] == ("py", "-m", "ampcore", "bench", "--device", "cuda")
    assert ("--backend", "cuda", "--dtype", "float16") == fp16.command[4:8]
    assert "not slow" in test.command and "-n" not in test.command
    assert all(f"--deselect {node}" in " ".join(test.command) for node, _ in check.OFFLINE_DESELECT)
    assert all(stage.command[0] == "py" for stage in plan)  # the machine's Python, no venv
    assert all(0 < stage.timeout_s <= check.BUDGET_S for stage in plan)


def test_workers_and_dry_run_arguments_reach_their_commands(check: ModuleType, tmp_path: Path) -> None:
    plan = check.stages("cpu", tmp_path, "py", ("tests/registry",), workers=4, bench_args=("--size", "64"))
    test = next(stage for stage in plan if stage.name.startswith("pytest"))
    assert "-p xdist -n 4 " in " ".join(test.command) and test.command[-1] == "tests/registry"
    benches = [stage for stage in plan if "bench" in stage.command]
    assert benches and all(stage.command[-2:] == ("--size", "64") for stage in benches)


def test_a_speed_row_is_one_line_of_data(check: ModuleType, tmp_path: Path) -> None:
    row = check.SpeedRow(
        "speed: o2 masters", "{python} benchmarks/bench_o2.py --device {device} --json {out}/o2.json", 60
    )
    assert check.fill(row.command, "py", "cuda", "float16", tmp_path) == (
        "py", "benchmarks/bench_o2.py", "--device", "cuda", "--json", f"{tmp_path}/o2.json",
    )  # fmt: skip


def test_detail_keeps_the_lines_that_say_how_a_stage_went(check: ModuleType) -> None:
    log = "collecting\n....\n===== 3 failed, 120 passed, 4 skipped in 41.2s =====\n"
    assert check.detail_of(log) == "3 failed, 120 passed, 4 skipped in 41.2s"
    assert check.detail_of("Traceback\nImportError: no module named pluggy\n") == "ImportError: no module named pluggy"


def test_each_stage_has_its_own_timeout(check: ModuleType, tmp_path: Path) -> None:
    py = sys.executable
    plan = [
        check.Stage("passes", (py, "-c", "print('1 passed in 0.1s')"), 60),
        check.Stage("fails", (py, "-c", "import sys; print('1 failed in 0.1s'); sys.exit(3)"), 60),
        check.Stage("hangs", (py, "-c", "import time; time.sleep(120)"), 2),
    ]
    results = check.run_check(plan, tmp_path, budget_s=600)
    assert [r.status for r in results] == ["ok", "FAIL", "TIMEOUT"]
    assert results[1].detail == "1 failed in 0.1s (exit 3)"
    assert results[2].seconds < 60 and "killed after 2 s" in results[2].detail
    assert Path(results[0].log).read_text().startswith("+ ")
    table = check.summary_table(results, "test machine")
    assert table.splitlines()[0] == "# GPU check: test machine"
    assert table.splitlines()[-1].startswith("FAILED: fails, hangs in ")
    assert table.count("\n| ") == 4  # header and one row per stage


def test_a_stage_that_no_longer_fits_the_budget_is_skipped(check: ModuleType, tmp_path: Path) -> None:
    results = check.run_check(
        [check.Stage("late", (sys.executable, "-c", "pass"), 60)], tmp_path, budget_s=check.RESERVE_S
    )
    assert [(r.status, r.detail) for r in results] == [("SKIPPED", f"no time left in the {check.RESERVE_S} s budget")]


def test_gpu_wheels_builds_ampcore_and_the_plugins_and_fetches_pure_python_only(
    wheels: ModuleType, tasks: ModuleType, tmp_path: Path
) -> None:
    build, fetch = wheels.build_commands(tmp_path, ROOT, tasks.PLUGINS, python="py")
    assert build[:5] == ["py", "-m", "pip", "--disable-pip-version-check", "wheel"] and "--no-deps" in build
    assert str(ROOT) in build and all(str(plugin) in build for plugin in tasks.PLUGINS)
    assert fetch[4] == "download" and {"--no-deps", "--only-binary=:all:"} <= set(fetch)
    assert fetch[fetch.index("--platform") + 1] == "any"
    assert {"pluggy", "pytest", "hypothesis"} <= set(fetch) and "torch" not in fetch


def test_gpu_wheels_replaces_the_old_wheels(wheels: ModuleType, tasks: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "stale-0.1-py3-none-any.whl").touch()
    ran: list[list[str]] = []
    wheels.build(tmp_path, ROOT, tasks.PLUGINS, run=ran.append)
    assert [command[4] for command in ran] == ["wheel", "download"]
    assert not list(tmp_path.glob("*.whl"))


def test_gpu_installs_the_carried_wheels_without_an_index(wheels: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "b-1.0-py3-none-any.whl").touch()
    (tmp_path / "a-1.0-py3-none-any.whl").touch()
    command = wheels.install_command(tmp_path, tmp_path / "site", python="py")
    assert command[:4] == ["py", "-m", "pip", "install"]
    assert {"--no-index", "--no-deps"} <= set(command) and command[command.index("--target") + 1] == str(
        tmp_path / "site"
    )
    assert [Path(c).name for c in command[-2:]] == ["a-1.0-py3-none-any.whl", "b-1.0-py3-none-any.whl"]
    env = wheels.environment(tmp_path / "site", {"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(":") == [str(tmp_path / "site"), "/elsewhere"]


def test_without_pip_the_wheels_are_unpacked_with_their_entry_points(
    wheels: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    carried, site = tmp_path / "wheels", tmp_path / "site"
    carried.mkdir()
    with zipfile.ZipFile(carried / "ampcore_demo-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("ampcore_demo/__init__.py", "")
        archive.writestr("ampcore_demo-1.0.dist-info/entry_points.txt", "[ampcore]\ndemo = ampcore_demo\n")

    class NoPip:
        returncode = 1

    monkeypatch.setattr(wheels.subprocess, "run", lambda *args, **kwargs: NoPip())
    wheels.install(carried, site, run=lambda command: pytest.fail("pip is not there"))
    assert (site / "ampcore_demo" / "__init__.py").exists()
    assert "demo = ampcore_demo" in (site / "ampcore_demo-1.0.dist-info" / "entry_points.txt").read_text()


def test_tasks_knows_both_gpu_commands(tasks: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["tasks.py", "nosuch"])
    with pytest.raises(SystemExit, match="gpu-wheels") as info:
        tasks.main()
    assert "|gpu|" in str(info.value)
