"""The GPU check (issue 24): one command, at most 8 minutes, on a borrowed GPU machine.

Runs, each stage in its own process under its own timeout (one hang cannot eat the budget):
``ampcore bench`` (the main job), the conformance suite on the device for float16 and
bfloat16, the test suite with the GPU present (``-m "not slow"``), then the speed rows of
:data:`SPEED_ROWS`.  It writes one summary table (``summary.md``, also printed) and one log
per stage to ``--out``.  It uses the Python and torch it is started with: no venv, no pip
resolution (``python3 tasks.py gpu`` installs the carried wheels of ``python3 tasks.py
gpu-wheels`` into a folder on ``PYTHONPATH`` first).

    python3 benchmarks/gpu_check.py --device cuda --out /tmp/gpu-check   # needs ampcore importable
    python3 benchmarks/gpu_check.py --device cpu --budget 900 ...        # the dry run on a CPU

Adding a speed benchmark is one row of :data:`SPEED_ROWS`: ``SpeedRow(name, command,
timeout_s)`` where the command may use ``{python}``, ``{device}``, ``{out}`` and ``{dtype}``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
#: The whole check's wall-clock budget (seconds): 8 minutes.
BUDGET_S: Final = 480
#: Seconds kept back for writing the summary and ending a stage that timed out.
RESERVE_S: Final = 10


@dataclass(frozen=True)
class SpeedRow:
    """One speed benchmark of the check: ``command`` is split like a shell line after its
    ``{python}``, ``{device}``, ``{dtype}`` and ``{out}`` fields are filled in."""

    name: str
    command: str
    timeout_s: int


#: The speed tables of the check, one row each: the main job interleaved, issue 26 (the
#: policy kernel's cost over torch.autocast per call, region and training step), issue 31
#: (O2's master-weight update against O1 and the pure low-precision loop, with peak memory
#: and a bit-identity check against torch's optimizer on the device) and issue 27 (level
#: auto on a model mixing large GEMMs with many small layers).  They run last: when the
#: budget is spent, ``--only speed`` runs them alone in a second command.
SPEED_ROWS: Final[tuple[SpeedRow, ...]] = (
    SpeedRow(
        "speed: bench interleaved",
        "{python} -m ampcore bench --device {device} --in-process --repeats 3 --warmup 2 --no-progress"
        " --json {out}/bench-interleaved.json",
        90,  # 24 s of it: building the compiled policy kernel on a fresh machine (set-up)
    ),
    SpeedRow(
        "speed: policy kernel (issue 26)",
        "{python} benchmarks/bench_policy_kernel.py --device {device} --dtype {dtype} --rounds 15 --threads 1"
        " --executors compiled",
        75,
    ),
    SpeedRow(
        "speed: O2 master update (issue 31)",
        "{python} benchmarks/bench_o2_update.py --device {device} --quick --memory --check --budget 80",
        100,  # --check compiles the Triton kernel's formulas (about 4 compilations) before the timed rows
    ),
    SpeedRow(
        "speed: level auto (issue 27)",
        "{python} benchmarks/bench_auto.py --device {device} --models gpu-mixed --rounds 5 --tables",
        90,
    ),
)


#: Tests the check leaves out, with why: they need what a GPU machine without network lacks
#: and test nothing about the device (CI runs them).
_BUILDS_A_WHEEL: Final = "pip builds a wheel, with setuptools from an index"
OFFLINE_DESELECT: Final[tuple[tuple[str, str], ...]] = (
    ("tests/test_packaging.py::test_the_build_gives_no_packaging_warnings", _BUILDS_A_WHEEL),
    ("tests/test_packaging.py::test_the_wheel_holds_every_module_and_data_file", _BUILDS_A_WHEEL),
)


@dataclass(frozen=True)
class Stage:
    """A command of the check with its timeout (seconds)."""

    name: str
    command: tuple[str, ...]
    timeout_s: int


@dataclass
class StageResult:
    """What became of a stage: ``status`` is ok, FAIL, TIMEOUT or SKIPPED."""

    name: str
    status: str
    seconds: float
    detail: str
    log: str


def fill(template: str, python: str, device: str, dtype: str, out: Path) -> tuple[str, ...]:
    """``template`` split like a shell line, its fields filled in (paths stay one argument).

    Example::

        >>> fill("{python} -m ampcore bench --device {device}", "py", "cuda", "float16", Path("o"))
        ('py', '-m', 'ampcore', 'bench', '--device', 'cuda')
    """
    fields = {"python": python, "device": device, "dtype": dtype, "out": str(out)}
    return tuple(part.format(**fields) for part in shlex.split(template))


def stages(
    device: str,
    out: Path,
    python: str = sys.executable,
    pytest_args: tuple[str, ...] = (),
    workers: int = 0,
    bench_args: tuple[str, ...] = (),
) -> list[Stage]:
    """Every stage of the check, in the order it runs (the main job first, speed rows last);
    ``bench_args`` go to every ``ampcore bench`` (e.g. smaller sizes for a dry run)."""
    conformance = [
        Stage(
            f"conformance {device} {dtype}",
            (
                python,
                "-m",
                "ampcore",
                "conformance",
                "--backend",
                device,
                "--dtype",
                dtype,
                "--report-dir",
                str(out / f"conformance-{device}-{dtype}"),
                "--",
                "-q",
                "-p",
                "no:cacheprovider",
            ),
            120,
        )  # fmt: skip
        for dtype in ("float16", "bfloat16")
    ]
    parallel = ("-p", "xdist", "-n", str(workers)) if workers > 1 else ()
    deselect = tuple(arg for test, _ in OFFLINE_DESELECT for arg in ("--deselect", test))
    test = (python, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *parallel, *deselect)
    test += pytest_args
    speed = [fill(row.command, python, device, "float16", out) for row in SPEED_ROWS]
    return [
        Stage(
            f"ampcore bench --device {device}",
            (
                python,
                "-m",
                "ampcore",
                "bench",
                "--device",
                device,
                "--no-progress",
                "--json",
                str(out / "bench.json"),
                *bench_args,
            ),
            75,
        ),  # fmt: skip
        *conformance,
        Stage(f"pytest -m 'not slow' ({device} present)", test, 300),
        *(
            Stage(row.name, (*command, *bench_args) if command[1:3] == ("-m", "ampcore") else command, row.timeout_s)
            for row, command in zip(SPEED_ROWS, speed, strict=True)
        ),
    ]


#: The closing lines worth a summary cell: pytest's counts, bench's table rows and speed-ups,
#: bench_auto's verdict per process.
_SUMMARY_LINE: Final = re.compile(r"(\d+ (passed|failed|errors?)\b|^\s*AMP-O[12]\s+\d|^time: wall|^auto / min\()")


def detail_of(log_text: str, limit: int = 3) -> str:
    """The last few lines of a stage's output that say how it went, joined with ``; ``.

    Example::

        >>> detail_of("noise\\n== 3 passed, 1 skipped in 2.0s ==\\n")
        '3 passed, 1 skipped in 2.0s'
    """
    lines = [line for line in log_text.splitlines() if not line.startswith("+ ")]  # not the command
    found = [line.strip().strip("=").strip() for line in lines if _SUMMARY_LINE.search(line)]
    last = ([line for line in lines if line.strip()] or [""])[-1].strip()[:200]
    return "; ".join(" ".join(line.split()) for line in found[-limit:]) or last


def run_stage(stage: Stage, log: Path, timeout_s: float, env: dict[str, str] | None = None) -> StageResult:
    """Run ``stage`` with its output in ``log``; killed (with its children) after ``timeout_s``."""
    started = time.monotonic()
    with open(log, "w") as handle:
        handle.write("+ " + shlex.join(stage.command) + "\n")
        handle.flush()
        process = subprocess.Popen(
            stage.command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            code = None
    seconds = time.monotonic() - started
    detail = detail_of(log.read_text(errors="replace"))
    if code is None:
        killed = f"killed after {timeout_s:.0f} s" + (f"; {detail}" if detail else "")
        return StageResult(stage.name, "TIMEOUT", seconds, killed, str(log))
    status, detail = ("ok", detail) if code == 0 else ("FAIL", f"{detail} (exit {code})")
    return StageResult(stage.name, status, seconds, detail, str(log))


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """End a timed-out stage and everything it started (its own process group)."""
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    process.wait()


def summary_table(results: list[StageResult], header: str) -> str:
    """The check's summary as a Markdown table, then the verdict line.

    Example::

        >>> print(summary_table([StageResult("bench", "ok", 41.0, "AMP-O1 8.6x", "bench.log")], "H200"))
        # GPU check: H200
        <BLANKLINE>
        | stage | status | seconds | detail | log |
        |---|---|---|---|---|
        | bench | ok | 41 | AMP-O1 8.6x | bench.log |
        <BLANKLINE>
        all 1 stages passed in 41 s
    """
    lines = [f"# GPU check: {header}", "", "| stage | status | seconds | detail | log |", "|---|---|---|---|---|"]
    for r in results:
        detail = r.detail.replace("|", "\\|")
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} | {detail} | {os.path.basename(r.log) or '-'} |")
    bad = [r.name for r in results if r.status != "ok"]
    total = sum(r.seconds for r in results)
    verdict = f"FAILED: {', '.join(bad)}" if bad else f"all {len(results)} stages passed"
    return "\n".join(lines) + f"\n\n{verdict} in {total:.0f} s"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_check(plan: list[Stage], out: Path, budget_s: float, env: dict[str, str] | None = None) -> list[StageResult]:
    """Run ``plan`` within ``budget_s``: each stage gets its own timeout, cut to what is left;
    a stage that no longer fits is SKIPPED."""
    deadline = time.monotonic() + budget_s
    results = []
    for number, stage in enumerate(plan, 1):
        left = deadline - time.monotonic() - RESERVE_S
        log = out / f"{number:02d}-{_slug(stage.name)}.log"
        if left < 5:
            results.append(StageResult(stage.name, "SKIPPED", 0.0, f"no time left in the {budget_s:.0f} s budget", ""))
            continue
        timeout = min(stage.timeout_s, left)
        print(f"gpu check: [{number}/{len(plan)}] {stage.name} (timeout {timeout:.0f} s)", flush=True)
        result = run_stage(stage, log, timeout, env)
        print(f"gpu check:   {result.status} in {result.seconds:.0f} s: {result.detail}", flush=True)
        results.append(result)
    return results


def default_workers(cpus: int | None = None, has_xdist: bool | None = None) -> int:
    """pytest-xdist workers for the test stage: half the CPUs, at most 8; 0 (one process)
    below 4 CPUs or without pytest-xdist.

    Example::

        >>> default_workers(16, True), default_workers(2, True), default_workers(16, False)
        (8, 0, 0)
    """
    import importlib.util

    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    has_xdist = importlib.util.find_spec("xdist") is not None if has_xdist is None else has_xdist
    return min(8, cpus // 2) if has_xdist and cpus >= 4 else 0


def describe_machine(python: str, env: dict[str, str] | None = None) -> str:
    """'NVIDIA H200, torch 2.11.0+cu130, ampcore 0.1.0' (what the stages will see)."""
    probe = (
        "import torch, ampcore\n"
        "name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device'\n"
        "print(f'{name}, torch {torch.__version__}, ampcore {ampcore.__version__}')"
    )
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, env=env, check=False)
    except subprocess.TimeoutExpired:
        return "unknown machine (the probe timed out)"
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else f"ampcore cannot be imported: {done.stderr.strip()[-300:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the backend to check (default cuda; cpu for a dry run)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-check", help="summary and logs ($OUT if set)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds for everything (default {BUDGET_S})")
    parser.add_argument(
        "--workers", type=int, default=None,
        help="pytest-xdist workers of the test stage (0: none; default: half the CPUs, at most 8, with xdist)",
    )  # fmt: skip
    parser.add_argument("--only", nargs="+", default=None, help="run only the stages whose name contains one of these")
    parser.add_argument("--bench-args", default="", help="more ampcore bench arguments (dry runs: smaller sizes)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    bench_args = tuple(shlex.split(args.bench_args))
    workers = default_workers() if args.workers is None else args.workers
    plan = stages(args.device, out, sys.executable, tuple(args.pytest_args), workers, bench_args)
    if args.only:
        plan = [s for s in plan if any(word in s.name for word in args.only)]
    started = time.monotonic()
    header = f"{describe_machine(sys.executable)}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    print(f"gpu check: {header}; logs in {out}", flush=True)
    results = run_check(plan, out, args.budget - (time.monotonic() - started))
    table = summary_table(results, header)
    (out / "summary.md").write_text(table + "\n")
    print("\n" + table, flush=True)
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
