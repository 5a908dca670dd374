"""Intel Extension for PyTorch (IPEX) on the CPU: its state in this process, and the opt-in.

``ampcore.decorate(level="O2")`` does **not** route through ``ipex.optimize`` by default.
Run for real with torch 2.8 and IPEX 2.8, ``ipex.optimize`` breaks what docs/o2.md promises:
it returns new objects instead of changing the model and optimizer in place, keeps no float32
master weights (the optimizer holds bfloat16 weights in IPEX's packed layout), needs an
optimizer in training mode, refuses float32 inputs outside autocast, accepts a second
decorate, and a resume is not exact.  It was 1.06x faster than ampcore's own O2 there.  So
the adapter leaves O2 to the core and ``ampcore info`` says what IPEX is doing
(:func:`ipex_state`).  ``AMPCORE_CPU_IPEX=optimize`` opts in to ``ipex.optimize`` for bfloat16
O2, outside decorate's contract (docs/backends.md lists what changes).

IPEX x.y supports torch x.y only, and importing a mismatched IPEX kills the import (IPEX 2.8
calls ``os.exit(127)``, which does not exist, so it raises ``AttributeError`` instead; a
script that does ``import intel_extension_for_pytorch`` exits with code 1).  The decision is
therefore made from the *installed* version (``importlib.metadata``), and ampcore imports
IPEX only when the user opted in and the versions match.  IPEX is archived at 2.8.

This module is a helper of the ``cpu`` adapter (``ampcore_backends.cpu``), not a plugin.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Final, Literal

import torch

from ampcore import AmpcoreError, AmpcoreWarning

#: The distribution name on PyPI (the import name is ``intel_extension_for_pytorch``).
DISTRIBUTION: Final = "intel-extension-for-pytorch"
MODULE: Final = "intel_extension_for_pytorch"
#: The environment variable that opts decorate's bfloat16 O2 in to ``ipex.optimize``.
ENV: Final = "AMPCORE_CPU_IPEX"
#: Its values: ``off`` (default, also unset or empty) and ``optimize``.
MODES: Final = ("off", "optimize")

#: Why decorate does not use ``ipex.optimize`` unless asked (shown by ``ampcore info``).
WHY_NOT_USED: Final = (
    f"ipex.optimize breaks decorate's contract (not in place, no fp32 masters, inexact resume); {ENV}=optimize opts in"
)

_MAJOR_MINOR: Final = re.compile(r"^\s*(\d+)\.(\d+)")
#: Packages whose frames a warning skips to reach the user's call.
_OWN_PACKAGES: Final = ("ampcore", "ampcore_backends", "pluggy")

IpexKind = Literal["compatible", "incompatible", "absent"]
IpexMode = Literal["off", "optimize"]
StateKind = Literal["absent", "incompatible", "not used", "used"]


@dataclass(frozen=True)
class IpexCompatibility:
    """The version rule's answer for an installed IPEX: ``kind`` and, unless ``"absent"``, a message."""

    kind: IpexKind
    message: str | None = None

    def __str__(self) -> str:
        return self.kind if self.message is None or self.kind == "compatible" else f"{self.kind}: {self.message}"


def ipex_compatibility(ipex_version: str | None, torch_version: str) -> IpexCompatibility:
    """Whether IPEX ``ipex_version`` (``None``: not installed) can run with ``torch_version``.

    A pure function of the two version strings, with IPEX's own rule: the major.minor
    versions must be equal (local tags such as ``+cpu``/``+xpu`` and the IPEX patch number
    do not matter).

    Example::

        >>> str(ipex_compatibility(None, "2.13.0+cpu"))
        'absent'
        >>> str(ipex_compatibility("2.8.0+cpu", "2.8.1"))
        'compatible'
        >>> ipex_compatibility("2.8.0", "2.13.0+cpu").kind
        'incompatible'
    """
    if ipex_version is None:
        return IpexCompatibility("absent")
    ipex = _MAJOR_MINOR.match(ipex_version)
    running = _MAJOR_MINOR.match(torch_version)
    if ipex is None or running is None:
        return IpexCompatibility(
            "incompatible",
            f"cannot compare intel-extension-for-pytorch {ipex_version!r} with torch {torch_version!r}: "
            "unrecognised version string",
        )
    wanted = f"{ipex.group(1)}.{ipex.group(2)}"
    if (ipex.group(1), ipex.group(2)) == (running.group(1), running.group(2)):
        return IpexCompatibility("compatible", f"intel-extension-for-pytorch {ipex_version} with torch {torch_version}")
    return IpexCompatibility(
        "incompatible",
        f"intel-extension-for-pytorch {ipex_version} supports torch {wanted}.* only, but torch "
        f"{torch_version} is running",
    )


def ipex_mode(environ: Mapping[str, str]) -> IpexMode:
    """The opt-in read from ``environ`` (:data:`ENV`): ``"off"`` unless it says ``optimize``.

    Raises:
        AmpcoreError: any other value, naming the valid ones.

    Example::

        >>> ipex_mode({}), ipex_mode({"AMPCORE_CPU_IPEX": "optimize"})
        ('off', 'optimize')
    """
    value = environ.get(ENV, "").strip().lower() or "off"
    if value == "off":
        return "off"
    if value == "optimize":
        return "optimize"
    raise AmpcoreError(f"{ENV}={environ[ENV]!r}: expected one of {', '.join(MODES)} (unset means off)")


@dataclass(frozen=True)
class IpexState:
    """What IPEX is doing in this process, for ``ampcore info``: ``kind`` and ``detail``."""

    kind: StateKind
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def describe_ipex(
    compatibility: IpexCompatibility, mode: IpexMode, imported: bool, import_error: str | None = None
) -> IpexState:
    """IPEX's state from the version rule, the opt-in, whether the program imported IPEX, and
    (opted in, versions matching) why ampcore's import of it failed.  A pure function.

    Example::

        >>> str(describe_ipex(IpexCompatibility("absent"), "off", False))
        'absent'
        >>> describe_ipex(ipex_compatibility("2.8.0", "2.8.0"), "off", False).kind
        'not used'
        >>> describe_ipex(ipex_compatibility("2.8.0", "2.8.0"), "optimize", True).kind
        'used'
    """
    if compatibility.kind == "absent":
        reason = f"{ENV}=optimize is set, but {DISTRIBUTION} is not installed" if mode == "optimize" else ""
        return IpexState("absent", reason)
    if compatibility.kind == "incompatible":
        return IpexState("incompatible", f"{compatibility.message}; importing it fails (AttributeError, exit code 1)")
    loaded = "imported by this program; " if imported else ""
    if mode == "off":
        return IpexState("not used", f"{compatibility.message}, {loaded}{WHY_NOT_USED}")
    if import_error is not None:
        return IpexState("incompatible", f"{compatibility.message}, but importing it failed ({import_error})")
    return IpexState(
        "used",
        f"{compatibility.message}; {ENV}=optimize: bfloat16 O2 calls ipex.optimize (outside decorate's contract)",
    )


def installed_ipex_version() -> str | None:
    """The installed IPEX version from package metadata (IPEX is not imported), or ``None``."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _import_ipex() -> tuple[ModuleType | None, str | None]:
    """Import IPEX once per process: ``(module, None)`` or ``(None, why it failed)``."""
    try:
        return importlib.import_module(MODULE), None
    except (Exception, SystemExit) as exc:  # its CPU check calls sys.exit (IPEX 2.8), missing libraries...
        return None, f"{type(exc).__name__}: {exc}"


def ipex_state() -> IpexState:
    """IPEX's state in this process (imports IPEX only when opted in and matching).

    Raises:
        AmpcoreError: :data:`ENV` has an invalid value.
    """
    compatibility = ipex_compatibility(installed_ipex_version(), torch.__version__)
    mode = ipex_mode(os.environ)
    error = _import_ipex()[1] if mode == "optimize" and compatibility.kind == "compatible" else None
    return describe_ipex(compatibility, mode, MODULE in sys.modules and sys.modules[MODULE] is not None, error)


@functools.lru_cache(maxsize=1)
def _warn_once(problem: str) -> None:
    """One :class:`ampcore.AmpcoreWarning` per process, attributed to the user's call."""
    warnings.warn(
        f"{ENV}=optimize: ampcore.decorate(level='O2') on the CPU does not use Intel Extension for PyTorch: "
        f"{problem}. Using ampcore's own O2 instead; unset {ENV} to silence this warning",
        AmpcoreWarning,
        stacklevel=user_stacklevel(),
    )


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller point at the first frame
    outside ampcore, its backends and pluggy (the user's ``decorate`` call)."""
    frame = sys._getframe(1)  # the function that will call warnings.warn
    level = 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _OWN_PACKAGES:
        frame = frame.f_back
        level += 1
    return level


def ipex_prepare_o2(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, dtype: torch.dtype
) -> tuple[torch.nn.Module, torch.optim.Optimizer | None] | None:
    """``ipex.optimize(model, dtype=torch.bfloat16, optimizer=optimizer)`` when the user opted
    in (``AMPCORE_CPU_IPEX=optimize``) and IPEX matches the running torch, else ``None``
    (ampcore's own O2).  float16 is always left to the core.  Opted in with an IPEX that
    cannot serve (absent, mismatched, failing to import, or ``ipex.optimize`` raising, as it
    does for bf16 on a CPU without AVX512): one warning per process, pointing at the user's
    call, and ``None``.

    Example::

        >>> ipex_prepare_o2(torch.nn.Linear(2, 2), None, torch.bfloat16) is None  # not opted in
        True
    """
    mode = ipex_mode(os.environ)
    if dtype != torch.bfloat16 or mode == "off":
        return None
    compatibility = ipex_compatibility(installed_ipex_version(), torch.__version__)
    if compatibility.kind == "absent":
        _warn_once(f"{DISTRIBUTION} is not installed")
        return None
    if compatibility.kind == "incompatible":
        _warn_once(compatibility.message or "incompatible version")
        return None
    ipex, error = _import_ipex()
    if ipex is None:
        _warn_once(f"importing intel-extension-for-pytorch failed ({error})")
        return None
    try:  # ipex.optimize works on a copy (inplace=False): a failure leaves the model as it was
        if optimizer is None:
            return ipex.optimize(model, dtype=dtype), None
        prepared_model, prepared_optimizer = ipex.optimize(model, dtype=dtype, optimizer=optimizer)
    except Exception as exc:  # e.g. bf16 weight prepacking on a CPU without AVX512 (an AssertionError)
        _warn_once(f"ipex.optimize failed ({type(exc).__name__}: {exc})")
        return None
    return prepared_model, prepared_optimizer
