#!/usr/bin/env python3
"""Set-up-complete project commands: each creates ``.venv`` and installs what it needs.

    python3 tasks.py demo     # the main job: `ampcore info` + `ampcore bench` (args go to bench)
    python3 tasks.py test     # lint (ruff, mypy --strict), the whole test suite, then the
                              # conformance suite against cpu (bfloat16, float16) and the
                              # example plugin (reports/); ends with one summary of every stage
    python3 tasks.py gpu-wheels  # build the wheels the GPU check carries (dist/gpu-wheels)
    python3 tasks.py gpu      # on a GPU machine without network: the GPU check (<= 8 min) with
                              # the machine's own Python and torch (benchmarks/gpu_check.py)
    python3 tasks.py compat   # the same at the oldest supported torch (2.8.0), then again
                              # with Intel Extension for PyTorch 2.8.0 imported in every
                              # process (.venv-compat; wheels cached, ~3.6 GB; args go to pytest;
                              # AMPCORE_COMPAT_IPEX=none: the plain run only)

Only Python >= 3.10 is needed.  torch is pinned: ``AMPCORE_TORCH`` (default
``torch==2.13.0``) is split like a shell command line and handed to pip, so it can carry pip
options that pick the build, e.g.
``AMPCORE_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"``.
pip must never resolve an open torch range on a fresh venv (a multi-GB CUDA build).
The venv is ``AMPCORE_VENV`` (default ``.venv``).  Set-up writes a stamp into the venv and
skips pip on reruns while pyproject.toml, the plugin's pyproject.toml and ``AMPCORE_TORCH``
are unchanged (delete ``<venv>/ampcore-setup.json`` to force a reinstall).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("AMPCORE_VENV", ROOT / ".venv"))
TORCH = os.environ.get("AMPCORE_TORCH", "torch==2.13.0")
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
PLUGIN = ROOT / "plugins" / "ampcore-example"
#: Installed by set-up after ampcore, with --no-deps: the example plugin, the pure-Python
#: PrivateUse1 test device and the PrivateUse1 vendor template that drives it (acme).
PLUGINS = (PLUGIN, ROOT / "plugins" / "ampcore-testdevice", ROOT / "plugins" / "ampcore-privateuse1")
#: Where conformance reports go (``AMPCORE_REPORTS``); ``compat`` keeps its own.
REPORTS = Path(os.environ.get("AMPCORE_REPORTS", ROOT / "reports"))
#: ``always``: ``test`` runs the conformance stages also when pytest gets arguments.
CONFORMANCE_MODE = os.environ.get("AMPCORE_CONFORMANCE", "auto")
#: ``always``/``never``: ``test`` runs the lint stage also when pytest gets arguments / not
#: at all (``auto``: only without arguments, as CI runs it).
LINT_MODE = os.environ.get("AMPCORE_LINT", "auto")
#: A vendor manifest (skips/xfails with reasons) for the cpu conformance runs, or empty.
CPU_MANIFEST = os.environ.get("AMPCORE_CPU_MANIFEST", "")
STAMP = VENV / "ampcore-setup.json"
CONSTRAINTS = VENV / "ampcore-constraints.txt"
#: pip output lines shown during set-up (the rest is shown only when pip fails).
_PIP_PROGRESS = re.compile(r"^\s*(Collecting|Downloading|Installing collected|Successfully installed|ERROR)")


def sh(*cmd: str | Path) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True)


def torch_args(spec: str = TORCH) -> list[str]:
    """``AMPCORE_TORCH`` as pip arguments (shell-style split: requirements and pip options)."""
    args = shlex.split(spec)
    if not args:
        sys.exit("AMPCORE_TORCH is empty: give a torch requirement such as torch==2.13.0")
    return args


def pip(stage: str, *args: str | Path) -> None:
    """Run ``pip install ARGS`` under a status line, showing what pip fetches and installs."""
    started = time.monotonic()
    print(f"setup: {stage} ...", flush=True)
    command = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", *map(str, args)]
    print("+", " ".join(command), flush=True)
    held: list[str] = []
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, bufsize=1) as process:
        for line in process.stdout or ():
            if _PIP_PROGRESS.match(line):
                print("  " + line.strip(), flush=True)
            else:
                held.append(line)
    if process.returncode:
        print("".join(held), end="", flush=True)  # everything pip said, to see why
        raise subprocess.CalledProcessError(process.returncode, command)
    print(f"setup: {stage} done in {time.monotonic() - started:.0f} s", flush=True)


def _setup_key() -> str:
    digest = hashlib.sha256(TORCH.encode())
    for path in (ROOT / "pyproject.toml", *(plugin / "pyproject.toml" for plugin in PLUGINS)):
        digest.update(path.read_bytes() if path.exists() else b"-")
    return digest.hexdigest()


def _up_to_date(extras: tuple[str, ...]) -> bool:
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return False
    return PY.exists() and stamp.get("key") == _setup_key() and set(extras) <= set(stamp.get("extras", []))


#: What `python3 tasks.py test` installs: the test tools and the optional integrations'
#: frameworks (pure Python; pinned to the venv's torch by the constraints file).
TEST_EXTRAS = ("test", "integrations")


def setup(extras: tuple[str, ...] = TEST_EXTRAS) -> None:
    """Create the venv and install torch (``AMPCORE_TORCH``), ampcore[extras], the plugins."""
    if _up_to_date(extras):
        print(f"setup: {VENV} is up to date (delete {STAMP.name} there to reinstall)", flush=True)
        return
    STAMP.unlink(missing_ok=True)
    if not PY.exists():
        print(f"setup: creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip(f"[1/3] torch ({TORCH})", *torch_args())
    version = subprocess.run(
        [str(PY), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    CONSTRAINTS.write_text(f"torch=={version}\n")  # the rest must keep exactly this build
    target = f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)
    pip(f"[2/3] ampcore{'[' + ','.join(extras) + ']' if extras else ''}", "-c", CONSTRAINTS, "-e", target)
    plugins = [plugin for plugin in PLUGINS if (plugin / "pyproject.toml").exists()]
    if plugins:
        editable = [arg for plugin in plugins for arg in ("-e", plugin)]
        pip(f"[3/3] the plugins ({', '.join(p.name for p in plugins)})", "--no-deps", *editable)
    STAMP.write_text(json.dumps({"key": _setup_key(), "extras": sorted(extras), "torch": version}) + "\n")


def demo(args: list[str]) -> None:
    """The main job: the backend table, then the AMP guide's benchmark on the default device."""
    setup(extras=())
    sh(BIN / "ampcore", "info")
    sh(BIN / "ampcore", "bench", *args)


#: Conformance runs of `python3 tasks.py test`: (backend, dtype or None for all declared,
#: environment).  acme (plugins/ampcore-privateuse1) runs in each autocast registration mode
#: of the PrivateUse1 test device: no kernels, a fallthrough only, partial kernels declared
#: through the adapter, torch's generic lists (CUDA's without the cuDNN ops); and once as an
#: fp16-only chip whose float16 arithmetic saturates (``AMPCORE_ACME_FP16=saturate``).
CONFORMANCE_RUNS: tuple[tuple[str, str | None, dict[str, str]], ...] = (
    ("cpu", "bfloat16", {}),
    ("cpu", "float16", {}),
    ("example", None, {}),
    *(("acme", "float16", {"AMPCORE_ACME_AUTOCAST": mode}) for mode in ("none", "fallthrough", "partial", "generic")),
    # an fp16-only chip that saturates and raises an overflow flag, declaring bfloat16 too and
    # refusing it on the device: every dtype the device runs (~70 s on 2 busy cores)
    ("acme", None, {"AMPCORE_ACME_AUTOCAST": "generic", "AMPCORE_ACME_FP16": "saturate"}),
)
#: backend -> its vendor manifest (device limits only, each with a reason)
CONFORMANCE_MANIFESTS = {"acme": ROOT / "plugins" / "ampcore-privateuse1" / "conformance-manifest.toml"}
#: Backends whose device is the pure-Python PrivateUse1 test device (plugins/ampcore-testdevice):
#: their runs are skipped, with the reason, where the venv's torch cannot host it (torch 2.8).
TESTDEVICE_BACKENDS = frozenset({"acme"})


@dataclass
class Stage:
    """One stage of ``python3 tasks.py test`` and what became of it (``skipped``: not run,
    ``detail`` says why; it does not fail the summary)."""

    name: str
    ok: bool
    detail: str
    skipped: bool = False


def installed_backends() -> set[str]:
    """Backend names the venv's ampcore knows (``ampcore info --json``)."""
    out = subprocess.run([str(BIN / "ampcore"), "info", "--json"], capture_output=True, text=True, check=True).stdout
    return {backend["name"] for backend in json.loads(out)["backends"]}


def _report_counts(report_dir: Path) -> str:
    """'120 passed, 4 skipped' from a conformance run's report.json (or why it is missing)."""
    try:
        report = json.loads((report_dir / "report.json").read_text())
    except (OSError, ValueError):
        return "no report.json written"
    counts = ", ".join(f"{n} {outcome}" for outcome, n in report["summary"].items() if n) or "no tests"
    problem = f"; {report['problem']}" if report.get("problem") else ""
    return f"{counts}{problem} ({os.path.relpath(report_dir / 'report.md', ROOT)})"


def skipped_stage(name: str, reason: str) -> Stage:
    """A stage that is not run here, saying why (printed now and in the summary)."""
    print(f"{name}: skipped: {reason}", flush=True)
    return Stage(name, True, f"skipped: {reason}", skipped=True)


def simulated_gpu_unsupported_reason() -> str | None:
    """Why the faked-GPU run cannot run with the venv's torch, or None: a CUDA build of torch
    without a usable GPU (``compat``'s torch 2.8) takes a faked GPU for real in torch's own
    code (``torch.optim.Adam`` asks the CUDA runtime about graph capture) and fails there;
    a CPU-only build never reaches the runtime, a machine with a GPU has one."""
    code = "import torch; print(torch.__version__ if torch.version.cuda and not torch.cuda.is_available() else '')"
    done = subprocess.run([str(PY), "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    version = done.stdout.strip() if done.returncode == 0 else ""
    if not version:
        return None
    return (
        f"torch {version} is a CUDA build and this machine has no usable GPU: with a GPU faked, torch's "
        "own code reaches its CUDA runtime (no driver), so only a CPU-only build or a real GPU can run it"
    )


def testdevice_unsupported_reason() -> str | None:
    """Why the venv's torch cannot host the test device (``ampcore_testdevice.unsupported_reason``,
    a capability check), or None: it can, or the question itself failed (the runs then fail
    on their own, with torch's error, rather than being skipped)."""
    code = "import ampcore_testdevice as d; print(d.unsupported_reason() or '')"
    done = subprocess.run([str(PY), "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def conformance() -> list[Stage]:
    """Run the conformance suite for CONFORMANCE_RUNS (reports under reports/), one stage each."""
    known, stages = installed_backends(), []
    no_testdevice = testdevice_unsupported_reason() if TESTDEVICE_BACKENDS & known else None
    for backend, dtype, env in CONFORMANCE_RUNS:
        name = f"{backend}-{dtype or 'all'}" + "".join(f"-{value}" for value in env.values())
        if backend not in known:  # setup() installs every one of them: missing is a failure
            stages.append(Stage(f"conformance {name}", False, f"backend {backend!r} is not installed"))
            continue
        if backend in TESTDEVICE_BACKENDS and no_testdevice:
            stages.append(skipped_stage(f"conformance {name}", no_testdevice))
            continue
        report_dir = REPORTS / name
        command = [BIN / "ampcore", "conformance", "--backend", backend, "--report-dir", report_dir]
        if backend in CONFORMANCE_MANIFESTS:
            command += ["--manifest", CONFORMANCE_MANIFESTS[backend]]
        elif backend == "cpu" and CPU_MANIFEST:
            command += ["--manifest", CPU_MANIFEST]
        print("+", " ".join(map(str, command)), flush=True)
        code = subprocess.run(
            [str(c) for c in (*command, *(["--dtype", dtype] if dtype else []), "--", "-q")],
            cwd=ROOT, env={**os.environ, **env}, check=False,
        ).returncode  # fmt: skip
        stages.append(Stage(f"conformance {name}", code == 0, _report_counts(report_dir)))
    return stages


def run_pytest(args: list[str], env: dict[str, str] | None = None, name: str = "pytest") -> Stage:
    """pytest on the configured test paths (``env``: variables added), streamed; the stage
    carries its final counts line."""
    command = [str(PY), "-m", "pytest", *args]
    print("+", " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *command]), flush=True)
    last = ""
    environ = {**os.environ, **(env or {})}
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, bufsize=1, env=environ) as process:
        for line in process.stdout or ():
            print(line, end="", flush=True)
            if re.search(r"\b(passed|failed|errors?|skipped|no tests ran)\b.* in [\d.]+s", line):
                last = line.strip().strip("=").strip()
    code = process.returncode
    if code == 5:  # pytest: no tests collected; zero tests never reads as green
        return Stage(name, False, f"no tests were collected (pytest exit 5) {last}".strip())
    return Stage(name, code == 0, (last or "no summary line") + ("" if code == 0 else f" (exit {code})"))


#: The second executor's run in CI (issue 26): the policy tests again with the Python policy
#: kernels, since the main run uses the compiled ones wherever a compiler is available.
SECOND_EXECUTOR_RUN: tuple[list[str], dict[str, str]] = (
    ["tests/policy", "-q", "-p", "no:cacheprovider"],
    {"AMPCORE_POLICY_KERNEL": "python"},
)

#: The suite again as on a machine with one CUDA GPU (faked: ``AMPCORE_TEST_SIMULATE_CUDA=1``,
#: tests/conftest.py): the GPU runs found tests that held only where CUDA is absent; this run
#: finds them on every machine (the ``slow`` tests and those marked ``cuda_runtime`` left out).
SIMULATED_GPU_RUN: tuple[list[str], dict[str, str]] = (
    ["-q", "-p", "no:cacheprovider", "-m", "not slow"],
    {"AMPCORE_TEST_SIMULATE_CUDA": "1"},
)


#: The lint stage's commands (venv tools; configured in pyproject.toml's [tool.ruff] and
#: [tool.mypy]): any finding fails the stage.
LINT_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("ruff", "check", "."),
    ("ruff", "format", "--check", "."),
    ("mypy", "--strict", "ampcore"),
)
#: Their closing lines: ruff's "All checks passed!" / "Found 3 errors.", mypy's
#: "Success: no issues found ..." / "Found 2 errors in 1 file ...".
_LINT_SUMMARY = re.compile(
    r"^(All checks passed|Found \d+ error|Success: |\d+ files? (already formatted|would be reformatted))"
)


def lint() -> Stage:
    """Run LINT_COMMANDS with the venv's tools, streamed; the stage carries each tool's closing line."""
    results, ok = [], True
    for tool, *args in LINT_COMMANDS:
        command = [str(BIN / tool), *args]
        print("+", " ".join(command), flush=True)
        last = ""
        try:
            with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, bufsize=1) as process:
                for line in process.stdout or ():
                    print(line, end="", flush=True)
                    if _LINT_SUMMARY.match(line) or not last:
                        last = line.strip()
        except FileNotFoundError:
            results.append(f"{tool}: not installed in {VENV} (the test extra pins it)")
            ok = False
            continue
        code = process.returncode
        ok = ok and code == 0
        results.append(f"{tool}: {last or 'no output'}" + ("" if code == 0 else f" (exit {code})"))
    return Stage("lint", ok, "; ".join(results))


def summarize(stages: list[Stage], started: float) -> bool:
    """Print one summary of every stage; True when all passed."""
    width = max(len(stage.name) for stage in stages)
    print("\n" + "=" * 30 + " python3 tasks.py test: summary " + "=" * 30, flush=True)
    for stage in stages:
        mark = "skip" if stage.skipped else "ok  " if stage.ok else "FAIL"
        print(f"  {mark}  {stage.name.ljust(width)}  {stage.detail}")
    failed = [stage.name for stage in stages if not stage.ok]
    skipped = sum(stage.skipped for stage in stages)
    minutes, seconds = divmod(round(time.monotonic() - started), 60)
    ran = len(stages) - skipped
    verdict = (
        f"FAILED: {', '.join(failed)}"
        if failed
        else (f"all {ran} stages passed" if ran > 1 else "passed") + (f", {skipped} skipped" if skipped else "")
    )
    print(f"{verdict} in {minutes}m{seconds:02d}s", flush=True)
    return not failed


def build_policy_kernel() -> None:
    """Choose the policy-kernel executor once before the tests, building the compiled one
    (20-60 s on a fresh machine, then cached per torch version) so that no test's own time
    limit pays for the build; prints which executor runs and why."""
    code = (
        "from ampcore._policy.executor import executor; e = executor(); print(f'policy kernels: {e.name} ({e.reason})')"
    )
    subprocess.run([str(PY), "-c", code], cwd=ROOT, check=False)


def test(args: list[str]) -> None:
    """Lint, pytest on tests/ (with ``args``); without args, lint and the conformance runs (CI)."""
    started = time.monotonic()
    setup()
    build_policy_kernel()
    stages = [lint()] if LINT_MODE == "always" or (LINT_MODE == "auto" and not args) else []
    stages.append(run_pytest(args))
    if not args:
        second_args, env = SECOND_EXECUTOR_RUN
        stages.append(run_pytest(second_args, env, name="pytest tests/policy, Python policy kernels"))
        simulated_args, env = SIMULATED_GPU_RUN
        no_fake = simulated_gpu_unsupported_reason()
        name = "pytest with a faked CUDA GPU"
        stages.append(skipped_stage(name, no_fake) if no_fake else run_pytest(simulated_args, env, name=name))
    if not args or CONFORMANCE_MODE == "always":
        stages += conformance()
    if not summarize(stages, started):
        sys.exit(1)


# -- compat: the oldest supported torch, with and without Intel Extension for PyTorch -----

#: The oldest torch ampcore supports (pyproject's lower bound) and the IPEX that matches it
#: (IPEX's last release).  ``AMPCORE_COMPAT_IPEX=none`` skips the IPEX run.
COMPAT_TORCH = os.environ.get("AMPCORE_COMPAT_TORCH", "2.8.0")
COMPAT_IPEX = os.environ.get("AMPCORE_COMPAT_IPEX", "2.8.0")
COMPAT_VENV = Path(os.environ.get("AMPCORE_COMPAT_VENV", ROOT / ".venv-compat"))
#: ``ipex``: the IPEX run only (the venv is set up first, the plain run skipped); empty: both.
COMPAT_ONLY = os.environ.get("AMPCORE_COMPAT_ONLY", "")
#: The downloaded wheels (torch's CUDA build and its nvidia libraries: ~3.6 GB), kept
#: between runs so that only the first one downloads.
#: What an imported IPEX changes in torch.autocast itself (the cpu conformance runs waive it).
COMPAT_IPEX_MANIFEST = ROOT / "tests" / "compat" / "ipex-cpu-manifest.toml"
COMPAT_CACHE = Path(os.environ.get("AMPCORE_COMPAT_CACHE", Path.home() / ".cache" / "ampcore" / "compat-wheels"))


def compat_requirements(torch_version: str = COMPAT_TORCH, ipex_version: str = COMPAT_IPEX) -> list[str]:
    """The pinned requirements ``compat`` downloads (IPEX left out for ``none``)."""
    wanted = [f"torch=={torch_version}"]
    if ipex_version.lower() != "none":
        wanted.append(f"intel-extension-for-pytorch=={ipex_version}")
    return wanted


def compat_env(ipex_dir: Path | None) -> dict[str, str]:
    """The environment of a ``compat`` run: its venv, torch from the cache only, its reports;
    with ``ipex_dir``, IPEX on the path and imported at start-up (its ``sitecustomize``)."""
    env = dict(os.environ)
    env.update(
        AMPCORE_VENV=str(COMPAT_VENV),
        AMPCORE_TORCH=shlex.join([f"torch=={COMPAT_TORCH}", "--no-index", "--find-links", str(COMPAT_CACHE)]),
        AMPCORE_REPORTS=str(ROOT / "reports" / (f"compat-torch{COMPAT_TORCH}" + ("-ipex" if ipex_dir else ""))),
        AMPCORE_CONFORMANCE="always",
        # lint checks the source once, against the pinned torch's annotations (`test`); older
        # torch annotates differently, which is no finding in ampcore.
        AMPCORE_LINT="never",
    )
    if ipex_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ipex_dir), env.get("PYTHONPATH")]))
        env["AMPCORE_IMPORT_IPEX"] = "1"
        env["AMPCORE_CPU_MANIFEST"] = str(COMPAT_IPEX_MANIFEST)
    return env


#: Imports IPEX at the start of the compat venv's Python processes that tasks.py starts
#: (``ampcore info``, pytest, each conformance run), as a program using IPEX would; the
#: variable is dropped there, so the subprocesses tests start do not pay IPEX's import.
_SITECUSTOMIZE = """\
import os, sys
if sys.prefix == {prefix!r} and os.environ.pop("AMPCORE_IMPORT_IPEX", None) == "1":
    import intel_extension_for_pytorch  # noqa: F401
"""


def _download_compat() -> None:
    stamp = COMPAT_CACHE / ("complete-" + "-".join(compat_requirements()).replace("=", "") + ".txt")
    if stamp.exists():
        print(f"compat: wheels cached in {COMPAT_CACHE}", flush=True)
        return
    COMPAT_CACHE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    sh(sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
       "-d", COMPAT_CACHE, *compat_requirements())  # fmt: skip
    stamp.write_text(f"downloaded in {time.monotonic() - started:.0f} s\n")


#: What the IPEX run needs at other versions than the plain run, installed into IPEX's folder
#: (first on its PYTHONPATH) so that the plain run keeps the venv's own: IPEX 2.8.0 does not
#: import next to transformers 5 (its reference models import classes transformers 5 removed:
#: ``NameError: name 'MoeModelOutputWithPast' is not defined``), so the IPEX run gets the
#: transformers release IPEX 2.8 is validated with (``ipex.llm.optimize``'s ``validated_version``).
COMPAT_IPEX_PINS = ("transformers==4.51.3",)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def ipex_overlay(dry_run: dict[str, list[dict[str, dict[str, str]]]], installed: dict[str, str]) -> list[str]:
    """``name==version`` of what pip's dry run (``--report``) would install that the venv
    (``installed``: name -> version) lacks at that version: what IPEX's folder must add."""
    have = {_canonical(name): version for name, version in installed.items()}
    metadata = [item["metadata"] for item in dry_run.get("install", [])]
    return [f"{m['name']}=={m['version']}" for m in metadata if have.get(_canonical(m["name"])) != m["version"]]


def _install_ipex_pins(python: Path, target: Path, pip_install: list[str | Path]) -> None:
    """COMPAT_IPEX_PINS and what they pull in at other versions into ``target`` (no-deps):
    pip resolves ampcore's test requirements in the venv with the pins, dry."""
    stamp = target / "ampcore-ipex-pins.txt"
    if stamp.exists() and stamp.read_text().split() == list(COMPAT_IPEX_PINS):
        return
    constraints, report = COMPAT_VENV / "ipex-constraints.txt", COMPAT_VENV / "ipex-dry-run.json"
    constraints.write_text((COMPAT_VENV / CONSTRAINTS.name).read_text() + "".join(f"{p}\n" for p in COMPAT_IPEX_PINS))
    sh(*pip_install, "--quiet", "--dry-run", "--report", report, "-c", constraints,
       "-e", f"{ROOT}[{','.join(TEST_EXTRAS)}]", *COMPAT_IPEX_PINS)  # fmt: skip
    code = "import importlib.metadata as m, json; print(json.dumps({d.name: d.version for d in m.distributions()}))"
    installed = json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)
    overlay = ipex_overlay(json.loads(report.read_text()), installed)
    if overlay:
        sh(*pip_install, "--no-deps", "--upgrade", "--target", target, *overlay)
    stamp.write_text("\n".join(COMPAT_IPEX_PINS) + "\n")


def _install_ipex() -> Path:
    """IPEX into its own folder (put on PYTHONPATH for the IPEX run only) with COMPAT_IPEX_PINS,
    its dependencies into the compat venv; returns the folder."""
    target = COMPAT_VENV / "ipex"
    python = COMPAT_VENV / BIN.name / PY.name
    pip_install: list[str | Path] = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    pip_install += ["--find-links", COMPAT_CACHE]
    if not (target / "intel_extension_for_pytorch").exists():
        constraints = COMPAT_VENV / CONSTRAINTS.name
        sh(*pip_install, "--no-deps", "--target", target, f"intel-extension-for-pytorch=={COMPAT_IPEX}")
        sh(*pip_install, "-c", constraints, "psutil", "packaging", "numpy")  # IPEX's requirements
    _install_ipex_pins(python, target, pip_install)
    (target / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(prefix=str(COMPAT_VENV.resolve())))
    return target


def compat(args: list[str]) -> None:
    """``test`` (args go to pytest) at torch ``COMPAT_TORCH``, then with IPEX imported."""
    started = time.monotonic()
    if COMPAT_ONLY not in ("", "ipex") or (COMPAT_ONLY and COMPAT_IPEX.lower() == "none"):
        sys.exit(f"AMPCORE_COMPAT_ONLY={COMPAT_ONLY!r}: expected 'ipex' (with an IPEX to run) or nothing")
    _download_compat()
    stages: list[Stage] = []
    runs: list[tuple[str, Path | None]] = [(f"torch {COMPAT_TORCH}", None)]
    if COMPAT_ONLY == "ipex":
        setup_venv = [sys.executable, "-c", "import tasks; tasks.setup()"]
        subprocess.run(setup_venv, cwd=ROOT, env=compat_env(None), check=True)
        runs = [(f"torch {COMPAT_TORCH} + IPEX {COMPAT_IPEX} imported", _install_ipex())]
    for label, ipex_dir in runs:
        print(f"\ncompat: {label}", flush=True)
        code = subprocess.run([sys.executable, __file__, "test", *args], cwd=ROOT, env=compat_env(ipex_dir)).returncode
        stages.append(Stage(label, code == 0, "see its summary above" + ("" if code == 0 else f" (exit {code})")))
        if ipex_dir is None and COMPAT_IPEX.lower() != "none" and not COMPAT_ONLY:
            runs.append((f"torch {COMPAT_TORCH} + IPEX {COMPAT_IPEX} imported", _install_ipex()))
    if not summarize(stages, started):
        sys.exit(1)


# -- gpu: the GPU check on a borrowed machine without network (issue 24) -----------------

#: Where ``gpu-wheels`` puts the wheels to carry (``AMPCORE_GPU_WHEELS``).
GPU_WHEELS = Path(os.environ.get("AMPCORE_GPU_WHEELS", ROOT / "dist" / "gpu-wheels"))
#: Where ``gpu`` installs them on the GPU machine (``AMPCORE_GPU_SITE``; emptied first).
GPU_SITE = Path(os.environ.get("AMPCORE_GPU_SITE", Path("/tmp") / "ampcore-gpu-site"))


def _gpu_wheels_module() -> ModuleType:
    """``benchmarks/gpu_wheels.py`` (standard library only: it runs before anything is installed)."""
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("ampcore_gpu_wheels", str(ROOT / "benchmarks" / "gpu_wheels.py"))
    module = ModuleType(loader.name)
    loader.exec_module(module)
    return module


def gpu_wheels(args: list[str]) -> None:
    """Build the wheels the GPU check carries into ``GPU_WHEELS`` (run where there is network)."""
    wheels = _gpu_wheels_module()
    wheels.build(GPU_WHEELS, ROOT, PLUGINS, run=lambda command: sh(*command))
    print(f"gpu-wheels: {wheels.describe(GPU_WHEELS)}: carry that folder ({os.path.relpath(GPU_WHEELS, ROOT)}), "
          "then run `python3 tasks.py gpu` there", flush=True)  # fmt: skip


def gpu(args: list[str]) -> None:
    """The GPU check with the Python and torch of this machine: install the carried wheels
    (``gpu-wheels``) into ``GPU_SITE``, then ``benchmarks/gpu_check.py`` (args go to it)."""
    env = dict(os.environ)
    if any(GPU_WHEELS.glob("*.whl")):
        wheels = _gpu_wheels_module()
        wheels.install(GPU_WHEELS, GPU_SITE, run=lambda command: sh(*command))
        env = wheels.environment(GPU_SITE, env)
    else:
        print(f"gpu: no wheels in {GPU_WHEELS} (python3 tasks.py gpu-wheels); using the installed ampcore", flush=True)
    check = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *args]
    code = subprocess.run(check, cwd=ROOT, env=env).returncode
    if code:
        sys.exit(code)


def main() -> None:
    commands = {"demo": demo, "test": test, "compat": compat, "gpu": gpu, "gpu-wheels": gpu_wheels}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python3 tasks.py {{{'|'.join(commands)}}} [args...]")
    try:
        commands[sys.argv[1]](sys.argv[2:])
    except subprocess.CalledProcessError as exc:
        sys.exit(exc.returncode)


if __name__ == "__main__":
    main()
