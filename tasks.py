#!/usr/bin/env python3
"""Set-up-complete project commands: each creates ``.venv`` and installs what it needs.

    python3 tasks.py demo     # the main job: `ampcore info` + a short mixed-precision run
    python3 tasks.py test     # the whole test suite

Only Python >= 3.10 is needed.  torch is pinned (``AMPCORE_TORCH``, default
``torch==2.13.0``): pip must never resolve an open range on a fresh venv, which would pull a
multi-GB CUDA build.
"""

from __future__ import annotations

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
    setup()
    sh(BIN / "ampcore", "info")
    sh(PY, ROOT / "examples" / "train_o1.py", *args)


def test(args: list[str]) -> None:
    setup()
    sh(PY, "-m", "pytest", *args)


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
