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

import os
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Final, Literal, NamedTuple

from .._cpp_build import STALE_LOCK_S, build_extension, clear_stale_lock, extension_name
from .._cpp_build import missing_tools as _missing_tools
from .._errors import AmpcoreError, AmpcoreWarning

__all__ = [
    "ENV",
    "EXECUTORS",
    "STALE_LOCK_S",
    "CompiledKernelWarning",
    "Executor",
    "clear_stale_lock",
    "compiled_module",
    "describe",
    "executor",
    "executor_chosen",
]

#: The environment variable that chooses the executor.
ENV: Final = "AMPCORE_POLICY_KERNEL"
EXECUTORS: Final = ("auto", "compiled", "python")
SOURCE: Final = Path(__file__).with_name("policy_kernel.cpp")


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
    """The extension's name: one per torch version and source (:func:`extension_name`)."""
    return extension_name("ampcore_policy_kernel", SOURCE)


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


def _build() -> ModuleType:
    return build_extension(build_name(), SOURCE, ["-O2"])


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
