"""The wheels the GPU check carries to a machine without network (issue 24).

``python3 tasks.py gpu-wheels`` builds them where there is network: ampcore and the in-repo
plugins (without their dependencies), plus :data:`CHECK_DEPS` as pure-Python wheels; torch is
never among them (the GPU machine has its own).  ``python3 tasks.py gpu`` installs them on
the GPU machine with ``pip install --no-index --no-deps --target SITE`` (or unpacks them
where there is no pip) and puts ``SITE`` first on ``PYTHONPATH``: its ``*.dist-info`` folders
make the adapters' entry points visible to ``importlib.metadata``.

Standard library only: this runs before anything is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

#: Pure-Python distributions the check needs besides torch and ampcore: ampcore's pluggy,
#: pytest and hypothesis with their dependencies, pytest-xdist (the index's newest that suit
#: this Python and pip's constraints).
CHECK_DEPS: Final = (
    "pluggy", "pytest", "iniconfig", "packaging", "pygments", "exceptiongroup", "tomli",
    "hypothesis", "sortedcontainers", "attrs", "pytest-xdist", "execnet",
)  # fmt: skip

Run = Callable[[list[str]], None]


def _check_call(command: list[str]) -> None:
    subprocess.run(command, check=True)


def build_commands(wheels: Path, root: Path, plugins: Iterable[Path], python: str = sys.executable) -> list[list[str]]:
    """pip's commands: ampcore and ``plugins`` built without their dependencies, then
    :data:`CHECK_DEPS` downloaded as pure-Python wheels only."""
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    build = [*pip, "wheel", "--no-deps", "-w", str(wheels), str(root), *(str(p) for p in plugins)]
    fetch = [*pip, "download", "--no-deps", "--only-binary=:all:", "--platform", "any", "-d", str(wheels)]
    return [build, [*fetch, *CHECK_DEPS]]


def build(wheels: Path, root: Path, plugins: Iterable[Path], run: Run = _check_call) -> None:
    """Fill ``wheels`` (its old wheels removed first)."""
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    for command in build_commands(wheels, root, plugins):
        run(command)


def describe(wheels: Path) -> str:
    """'16 wheels, 2.8 MiB in dist/gpu-wheels'."""
    found = list(wheels.glob("*.whl"))
    return f"{len(found)} wheels, {sum(p.stat().st_size for p in found) / 2**20:.1f} MiB in {wheels}"


def install_command(wheels: Path, site: Path, python: str = sys.executable) -> list[str]:
    """pip's command that installs the carried wheels into ``site`` (no index, no deps)."""
    return [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-deps",
            "--target", str(site), *sorted(str(p) for p in wheels.glob("*.whl"))]  # fmt: skip


def install(wheels: Path, site: Path, run: Run = _check_call) -> None:
    """Install the wheels of ``wheels`` into ``site`` (emptied first); without pip, unpack
    them there (pure-Python wheels: the same files, dist-info included)."""
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False).returncode == 0:
        run(install_command(wheels, site))
        return
    print(f"gpu: no pip in {sys.executable}; unpacking the wheels into {site}", flush=True)
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)


def environment(site: Path, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``site`` first on ``PYTHONPATH``."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env
