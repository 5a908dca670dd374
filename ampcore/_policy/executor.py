"""Which executor carries out the policy kernels' action table, and building the compiled one.

Two executors read the same decisions (:func:`ampcore._policy.decisions.decide`, once per
policy): the *compiled* one, a C++ boxed kernel per operator (``policy_kernel.cpp``, shipped
in the package, carried out without Python per op: :mod:`ampcore._policy.compiled`), and the
*Python* one (:mod:`ampcore._policy.kernels`), which needs nothing but torch.

``AMPCORE_POLICY_KERNEL`` chooses: ``auto`` (default: compiled, built at first use with
``torch.utils.cpp_extension``; the Python kernels, with one warning naming why, where no
compiler is available or the build fails), ``compiled`` (an error when it cannot be built)
or ``python``.  The build is cached by torch in its extensions directory, under a name that
carries the torch version and a hash of the source (torch adds the Python version and the
CUDA tag), so only the first use per torch and source builds (20-60 s on 2 cores).  Nothing
is built at install time.  ``ampcore info`` prints :func:`describe`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Final, Literal, NamedTuple

import torch

from .._errors import AmpcoreError, AmpcoreWarning

__all__ = [
    "ENV",
    "EXECUTORS",
    "CompiledKernelWarning",
    "Executor",
    "compiled_module",
    "describe",
    "executor",
    "executor_chosen",
]

#: The environment variable that chooses the executor.
ENV: Final = "AMPCORE_POLICY_KERNEL"
EXECUTORS: Final = ("auto", "compiled", "python")
SOURCE: Final = Path(__file__).with_name("policy_kernel.cpp")
#: A build lock older than this is a leftover of a killed build (a build takes 20-60 s).
STALE_LOCK_S: Final = 600.0


class CompiledKernelWarning(AmpcoreWarning):
    """The compiled policy kernel could not be built: the Python kernels run (slower per op)."""


class Executor(NamedTuple):
    """The executor in use (``compiled`` or ``python``) and why."""

    name: Literal["compiled", "python"]
    reason: str


def requested() -> str:
    """The validated value of :data:`ENV` (``auto`` when unset)."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in EXECUTORS:
        raise AmpcoreError(f"{ENV}={os.environ[ENV]!r}: expected one of {', '.join(EXECUTORS)}")
    return value


def build_name() -> str:
    """The extension's name: one per torch version and source (torch keys the rest of its
    cache), so installs of different ampcore versions sharing torch's extensions directory
    never load each other's build."""
    source = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:10]
    return f"ampcore_policy_kernel_{re.sub(r'[^0-9A-Za-z]+', '_', torch.__version__)}_{source}"


class _Chooser:
    """The process's choice, made once (the kernels it registers stay for the process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.choice: Executor | None = None
        self.module: ModuleType | None = None

    def choose(self) -> Executor:
        with self._lock:
            if self.choice is None:
                self.choice = self._choose(requested())
            return self.choice

    def _choose(self, wanted: str) -> Executor:
        if wanted == "python":
            return Executor("python", f"{ENV}=python")
        problem = _missing_tools()
        if problem is None:
            try:
                self.module = _build()
            except Exception as exc:  # a compiler error, a missing header, a broken toolchain
                problem = f"the build failed: {type(exc).__name__}: {str(exc).strip()[-600:]}"
        if self.module is not None:
            return Executor("compiled", f"built with torch.utils.cpp_extension ({build_name()}; {ENV}={wanted})")
        if wanted == "compiled":
            raise AmpcoreError(f"{ENV}=compiled, but the compiled policy kernel is not available: {problem}")
        warnings.warn(
            f"ampcore: the compiled policy kernel is not available ({problem}); the Python kernels run "
            f"custom lists, OD and O2 (a few microseconds more per op). Set {ENV}=python to silence this.",
            CompiledKernelWarning,
            stacklevel=4,
        )
        return Executor("python", f"fallback: {problem}")


def _missing_tools() -> str | None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None and shutil.which("g++") is None:
        return f"no C++ compiler ({compiler}) on PATH"
    if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
        return "ninja (needed by torch.utils.cpp_extension) is not installed"
    return None


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
        "building the compiled policy kernel now",
        AmpcoreWarning,
        stacklevel=2,
    )
    return True


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    try:
        directory = Path(cpp_extension._get_build_directory(build_name(), verbose=False))
    except Exception:  # noqa: BLE001 - a torch without the helper: torch's own wait applies
        directory = None
    if directory is not None:
        clear_stale_lock(directory / "lock")
    module: ModuleType = cpp_extension.load(
        name=build_name(), sources=[str(SOURCE)], extra_cflags=["-O2"], verbose=False
    )
    return module


_chooser = _Chooser()


def executor() -> Executor:
    """The executor of this process (chosen, and built, at the first call)."""
    return _chooser.choose()


def executor_chosen() -> bool:
    """Whether this process has chosen its executor (without choosing it)."""
    return _chooser.choice is not None


def compiled_module() -> ModuleType | None:
    """The built extension when the compiled executor runs, else None."""
    return _chooser.module if executor().name == "compiled" else None


def describe() -> str:
    """One line for ``ampcore info``: the executor, and why (without building anything)."""
    choice = _chooser.choice
    if choice is not None:
        return f"{choice.name} ({choice.reason})"
    try:
        wanted = requested()
    except AmpcoreError as exc:
        return f"invalid: {exc}"
    if wanted == "python":
        return f"python ({ENV}=python)"
    problem = _missing_tools()
    if problem is not None:
        return f"python at first use ({problem})"
    return f"compiled at first use ({ENV}={wanted}; built once per torch version, then cached)"
