"""Whether a one-pass kernel runs in this process, and why: ``AMPCORE_O2_ONEPASS``, the build,
the first-use self-check.

Both one-pass kernels (``onepass.py``: torch's fused flavour; ``onepass_loop.py``: its
for-loop and foreach flavours) are chosen alike, once per process: ``auto`` (the default)
runs the kernel where torch's CPU capability is transcribed, a compiler is there, it builds
and its self-check finds it equal to torch here, else torch's path with one
:class:`OnePassWarning`; ``compiled`` raises where that fails; ``torch`` builds nothing.
A :class:`Kernel` says what differs between the two; a :class:`Chooser` decides for one.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Final, Literal, NamedTuple

import torch

from .._errors import AmpcoreError, AmpcoreWarning

__all__ = ["CHOICES", "ENV", "Choice", "Chooser", "Kernel", "OnePassWarning", "cpu_capability", "decide", "requested"]

ENV: Final = "AMPCORE_O2_ONEPASS"
CHOICES: Final = ("auto", "compiled", "torch")
#: torch's older names of a capability -> the name the layouts use (torch 2.8 calls its
#: DEFAULT build, the one without AVX, "NO AVX")
_ALIASES: Final = {"NO AVX": "DEFAULT"}


class OnePassWarning(AmpcoreWarning):
    """The one-pass CPU master update is not used (no build, or it differs from torch here)."""


class Choice(NamedTuple):
    """Whether the one-pass update runs in this process (``onepass`` or ``torch``) and why."""

    name: Literal["onepass", "torch"]
    reason: str


def requested(environ: Mapping[str, str] = os.environ) -> str:
    """The validated value of :data:`ENV` (``auto`` when unset)."""
    value = environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise AmpcoreError(f"{ENV}={environ[ENV]!r}: expected one of {', '.join(CHOICES)}")
    return value


def cpu_capability() -> str:
    """The CPU capability torch dispatched its kernels for, by the name the layouts use.

    Example::

        >>> cpu_capability() != "NO AVX"   # torch 2.8's name of DEFAULT
        True
    """
    found = torch.backends.cpu.get_cpu_capability()
    return _ALIASES.get(found, found)


class Kernel(NamedTuple):
    """One one-pass kernel, as its chooser needs it (the callables are looked up when called)."""

    name: str  #: what the messages call it
    against: str  #: the torch code its results must equal
    layouts: Mapping[str, Any]  #: torch's CPU capability -> how torch's code splits and rounds there
    build: Callable[[str], ModuleType]  #: the extension for a capability
    tools: Callable[[], str | None]  #: what the build lacks (None: nothing)
    check: Callable[[ModuleType, Any], str | None]  #: the self-check: a difference found, or None
    stacklevel: int  #: of the warning, from the first caller outside ampcore


def decide(wanted: str, problem: str | None, kernel: Kernel) -> Choice:
    """The choice for ``wanted`` (:data:`CHOICES`) given the first ``problem`` found
    (no tools, no layout, a failed build or self-check; None: none).

    Raises:
        AmpcoreError: ``wanted == "compiled"`` and there is a problem.
    """
    if wanted == "torch":
        return Choice("torch", f"{ENV}=torch")
    if problem is None:
        return Choice("onepass", f"compiled, self-checked against {kernel.against} ({ENV}={wanted})")
    if wanted == "compiled":
        raise AmpcoreError(f"{ENV}=compiled, but {kernel.name} is not available: {problem}")
    return Choice("torch", f"fallback: {problem}")


class Chooser:
    """A process's choice for one :class:`Kernel`, made at the first :meth:`choose`."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._lock = threading.Lock()
        self.choice: Choice | None = None
        self.module: ModuleType | None = None
        self.layout: Any = None

    def choose(self) -> Choice:
        made = self.choice  # set once, under the lock: read without it on every step after
        if made is not None:
            return made
        with self._lock:
            if self.choice is None:
                wanted = requested()
                problem = None if wanted == "torch" else self._prepare()
                self.choice = decide(wanted, problem, self.kernel)
                if self.choice.name == "torch" and wanted == "auto":
                    warnings.warn(
                        f"ampcore: {self.kernel.name} is not used ({problem}); O2 runs {self.kernel.against} "
                        f"with separate widening and refresh passes. Set {ENV}=torch to silence this.",
                        OnePassWarning,
                        stacklevel=self.kernel.stacklevel,
                    )
            return self.choice

    def loaded(self) -> tuple[ModuleType, Any] | None:
        """The built, self-checked module and its layout where the kernel runs (choosing at
        the first call), else None."""
        if self.choose().name != "onepass" or self.module is None or self.layout is None:
            return None
        return self.module, self.layout

    def _prepare(self) -> str | None:
        capability = cpu_capability()
        found = self.kernel.layouts.get(capability)
        if found is None:
            return f"torch's CPU capability {capability} is not transcribed"
        problem = self.kernel.tools()
        if problem is not None:
            return problem
        try:
            module = self.kernel.build(capability)
        except Exception as exc:  # a compiler error, a missing header, a broken toolchain
            return f"the build failed: {type(exc).__name__}: {str(exc).strip()[-600:]}"
        try:
            mismatch = self.kernel.check(module, found)
        except Exception as exc:  # a torch without the code transcribed (or another signature)
            return f"the self-check could not run: {type(exc).__name__}: {str(exc).strip()[-300:]}"
        if mismatch is not None:
            return f"it differs from {self.kernel.against} on this machine: {mismatch}"
        self.module, self.layout = module, found
        return None

    def describe(self) -> str:
        """One line for ``ampcore info`` (building nothing)."""
        made = self.choice
        if made is not None:
            return f"{made.name} ({made.reason})"
        try:
            wanted = requested()
        except AmpcoreError as exc:
            return f"invalid: {exc}"
        if wanted == "torch":
            return f"torch ({ENV}=torch)"
        capability = cpu_capability()
        if capability not in self.kernel.layouts:
            return f"torch at first use (torch's CPU capability {capability} is not transcribed)"
        problem = self.kernel.tools()
        if problem is not None:
            return f"torch at first use ({problem})"
        return f"onepass at first use, if it matches {self.kernel.against} here ({ENV}={wanted}; built once per torch)"
