"""Building ampcore's C++ extensions at first use (``torch.utils.cpp_extension``), shared by
the compiled policy kernel (``_policy/executor.py``) and the one-pass O2 master update
(``_o2/onepass.py``).

Nothing is built at install time: an extension is built the first time a process needs it,
under a name that carries the torch version and a hash of its source (torch adds the Python
version and the CUDA tag to its cache key), so only the first use per torch and source
builds; every later process loads the cached build.  Where no compiler (or ninja) is
available, :func:`missing_tools` says so and the caller keeps its pure-Python/torch path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Final

import torch

from ._errors import AmpcoreWarning

__all__ = ["STALE_LOCK_S", "build_extension", "clear_stale_lock", "extension_name", "missing_tools"]

#: A build lock older than this is a leftover of a killed build (a build takes 20-60 s).
STALE_LOCK_S: Final = 600.0


def missing_tools() -> str | None:
    """What a build at first use lacks here (a C++ compiler, ninja), or None."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None and shutil.which("g++") is None:
        return f"no C++ compiler ({compiler}) on PATH"
    if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
        return "ninja (needed by torch.utils.cpp_extension) is not installed"
    return None


def extension_name(stem: str, source: Path, *headers: Path) -> str:
    """An extension's name: one per torch version and source with the ampcore ``headers`` it
    includes (torch keys the rest of its cache), so installs of different ampcore versions
    sharing torch's extensions directory never load each other's build."""
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in (source, *headers))).hexdigest()[:10]
    return f"{stem}_{re.sub(r'[^0-9A-Za-z]+', '_', torch.__version__)}_{digest}"


def clear_stale_lock(
    lock: Path, max_age_s: float = STALE_LOCK_S, clock: Callable[[], float] = time.time, poll_s: float = 1.0
) -> bool:
    """Wait while another process builds (``lock`` exists and is younger than ``max_age_s``);
    remove a lock older than that, with a warning, and return True.

    torch's build lock (``<extensions dir>/<name>/lock``) has no owner recorded: a build
    killed with SIGKILL (an OOM kill, a job's time limit) leaves it behind, and torch then
    waits for it forever in every later process.  A build takes 20-60 s, so a lock older
    than :data:`STALE_LOCK_S` is no build in progress.
    """
    while True:
        try:
            age = clock() - lock.stat().st_mtime
        except FileNotFoundError:
            return False
        if age > max_age_s:
            break
        time.sleep(poll_s)
    lock.unlink(missing_ok=True)
    warnings.warn(
        f"ampcore: removed {lock}, a build lock {age:.0f} s old (left by a build that was killed); "
        f"building {lock.parent.name} now",
        AmpcoreWarning,
        stacklevel=2,
    )
    return True


def build_extension(name: str, source: Path, cflags: Sequence[str]) -> ModuleType:
    """Build (or load the cached build of) the extension ``name`` from ``source``, after
    clearing a stale lock of a killed build (:func:`clear_stale_lock`)."""
    from torch.utils import cpp_extension

    try:
        directory = Path(cpp_extension._get_build_directory(name, verbose=False))
    except Exception:  # noqa: BLE001 - a torch without the helper: torch's own wait applies
        directory = None
    if directory is not None:
        clear_stale_lock(directory / "lock")
    module: ModuleType = cpp_extension.load(name=name, sources=[str(source)], extra_cflags=list(cflags), verbose=False)
    return module
