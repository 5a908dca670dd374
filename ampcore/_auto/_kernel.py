"""Which path carries out a settled ``level="auto"`` root call: the Python one of
:mod:`._roots` or the compiled one (``roots_kernel.cpp``), and building the compiled one.

The compiled path is the sentinel's settled call of a program that hooks no module (a
program whose modules all follow its default: a float32 model, a model whose every layer
runs low precision) for tensor arguments, and that root's post-hook: the same checks in
the same order, read through the same objects, without Python bytecodes; any other call,
and any check that does not hold, goes to the Python sentinel, which decides it from the
start.  It is plain CPython API (no torch headers), so its build takes a few seconds.

``AMPCORE_AUTO_KERNEL`` chooses: ``auto`` (default: built at the first ``level="auto"``
region in a background thread, with the Python path until it is ready; the Python path
for the process where no compiler is available or the build fails), ``compiled`` (built
at the first region, which waits for it; an error when it cannot be built) or ``python``.
The build is cached like the policy kernel's (:mod:`ampcore._cpp_build`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Final

from .._cpp_build import build_extension, choice_of, extension_name, missing_tools
from .._errors import AmpcoreError

__all__ = ["ENV", "KERNELS", "describe", "requested", "start", "wait"]

ENV: Final = "AMPCORE_AUTO_KERNEL"
KERNELS: Final = ("auto", "compiled", "python")
SOURCE: Final = Path(__file__).with_name("roots_kernel.cpp")


def requested() -> str:
    """The validated value of :data:`ENV` (``auto`` when unset)."""
    return choice_of(ENV, KERNELS)


def build_name() -> str:
    """The extension's name: one per torch version and source."""
    return extension_name("ampcore_auto_roots", SOURCE)


class _State:
    """The process's choice: started once; ``ready`` is called with the built module."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = False
        self.module: ModuleType | None = None
        self.reason = ""
        self.thread: threading.Thread | None = None


_state = _State()


def _build() -> ModuleType:
    return build_extension(build_name(), SOURCE, ["-O2"])


def _run(ready: Callable[[ModuleType], None]) -> None:
    try:
        module = _build()
    except Exception as exc:  # noqa: BLE001 - a compiler error: the Python path stays
        _state.reason = f"python (the build failed: {type(exc).__name__}: {str(exc).strip()[-300:]})"
        return
    ready(module)
    _state.module = module
    _state.reason = f"compiled ({build_name()})"


def start(ready: Callable[[ModuleType], None]) -> None:
    """Choose the path once (the first ``level="auto"`` region): ``ready(module)`` puts the
    compiled one in place, from a background thread (``auto``) or before returning
    (``compiled``)."""
    if _state.started:
        return
    with _state.lock:
        if _state.started:
            return
        wanted = requested()
        _state.started = True
        if wanted == "python":
            _state.reason = f"python ({ENV}=python)"
            return
        problem = missing_tools()
        if problem is not None:
            if wanted == "compiled":
                _state.started = False
                raise AmpcoreError(f"{ENV}=compiled, but the compiled auto path cannot be built: {problem}")
            _state.reason = f"python ({problem})"
            return
        if wanted == "compiled":
            _run(ready)
            if _state.module is None:
                _state.started = False
                raise AmpcoreError(f"{ENV}=compiled, but the compiled auto path could not be built: {_state.reason}")
            return
        _state.reason = "python until the background build is ready"
        thread = threading.Thread(target=_run, args=(ready,), name="ampcore-auto-kernel-build", daemon=True)
        _state.thread = thread
        thread.start()


def wait(timeout_s: float = 300.0) -> None:
    """Wait for a background build that is running (tests, benchmarks: a known path)."""
    thread = _state.thread
    if thread is not None:
        thread.join(timeout_s)


def describe() -> str:
    """One line for ``ampcore info``: the path settled auto root calls take, and why
    (without building anything)."""
    if _state.started:
        return _state.reason
    try:
        wanted = requested()
    except AmpcoreError as exc:
        return f"invalid: {exc}"
    if wanted == "python":
        return f"python ({ENV}=python)"
    problem = missing_tools()
    if problem is not None:
        return f"python ({problem})"
    when = "in the background" if wanted == "auto" else "before it runs"
    return f"compiled, built at the first level='auto' region {when} ({ENV}={wanted}; cached per torch version)"
