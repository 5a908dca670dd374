#!/usr/bin/env python3
"""Set-up-complete project commands: each creates ``.venv`` and installs what it needs.

    python3 tasks.py demo     # the main job: `ampcore info` + `ampcore bench` (args go to bench)
    python3 tasks.py test     # the whole test suite, then the conformance suite against
                              # cpu (bfloat16, float16) and the example plugin (reports/)

Only Python >= 3.10 is needed.  torch is pinned (``AMPCORE_TORCH``, default
``torch==2.13.0``): pip must never resolve an open range on a fresh venv, which would pull a
multi-GB CUDA build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("AMPCORE_VENV", ROOT / ".venv"))
TORCH = os.environ.get("AMPCORE_TORCH", "torch==2.13.0")
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")


def sh(*cmd: str | Path) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True)


def setup() -> None:
    if not PY.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    sh(PY, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", TORCH, "-e", f"{ROOT}[test]")
    plugin = ROOT / "plugins" / "ampcore-example"
    if (plugin / "pyproject.toml").exists():
        sh(PY, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "-e", plugin)


def demo(args: list[str]) -> None:
    """The main job: the backend table, then the AMP guide's benchmark on the default device."""
    setup()
    sh(BIN / "ampcore", "info")
    sh(BIN / "ampcore", "bench", *args)


#: Conformance runs of `python3 tasks.py test`: (backend, dtype or None for all declared).
CONFORMANCE_RUNS = (("cpu", "bfloat16"), ("cpu", "float16"), ("example", None))


def installed_backends() -> set[str]:
    """Backend names the venv's ampcore knows (``ampcore info --json``)."""
    out = subprocess.run([str(BIN / "ampcore"), "info", "--json"], capture_output=True, text=True, check=True).stdout
    return {backend["name"] for backend in json.loads(out)["backends"]}


def conformance() -> list[str]:
    """Run the conformance suite for CONFORMANCE_RUNS (reports under reports/); the failed runs."""
    known, failed = installed_backends(), []
    for backend, dtype in CONFORMANCE_RUNS:
        name = f"{backend}-{dtype or 'all'}"
        if backend not in known:  # setup() installs every one of them: missing is a failure
            print(f"conformance: backend {backend!r} is not installed", flush=True)
            failed.append(name)
            continue
        command = [BIN / "ampcore", "conformance", "--backend", backend, "--report-dir", ROOT / "reports" / name]
        try:
            sh(*command, *(["--dtype", dtype] if dtype else []), "--", "-q")
        except subprocess.CalledProcessError:
            failed.append(name)
    return failed


def test(args: list[str]) -> None:
    """pytest on tests/ (with ``args``); without args, then the conformance runs (CI)."""
    setup()
    print("+", PY, "-m", "pytest", *args, flush=True)
    code = subprocess.run([str(PY), "-m", "pytest", *args], cwd=ROOT, check=False).returncode
    failed = [] if args else conformance()
    if failed:
        print(f"conformance failed: {', '.join(failed)} (see reports/<run>/report.md)", flush=True)
    if code or failed:
        sys.exit(code or 1)


def main() -> None:
    commands = {"demo": demo, "test": test}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python3 tasks.py {{{'|'.join(commands)}}} [args...]")
    try:
        commands[sys.argv[1]](sys.argv[2:])
    except subprocess.CalledProcessError as exc:
        sys.exit(exc.returncode)


if __name__ == "__main__":
    main()
