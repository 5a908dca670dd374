"""Intel Extension for PyTorch (IPEX) on the CPU: whether it can serve O2, and using it.

IPEX x.y supports torch x.y only; importing a mismatched IPEX prints an error and calls
``exit(127)``, so the decision is made from the *installed* version
(``importlib.metadata``), never by importing it.  IPEX is archived at 2.8 (it pins torch
2.8): with any later torch an installed IPEX is incompatible, and ampcore warns once per
process and uses stock PyTorch.

This module is a helper of the ``cpu`` adapter (``ampcore_backends.cpu``), not a plugin.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Final, Literal

import torch

from ampcore import AmpcoreWarning

#: The distribution name on PyPI (the import name is ``intel_extension_for_pytorch``).
DISTRIBUTION: Final = "intel-extension-for-pytorch"
MODULE: Final = "intel_extension_for_pytorch"

_MAJOR_MINOR: Final = re.compile(r"^\s*(\d+)\.(\d+)")

IpexKind = Literal["use", "incompatible", "absent"]


@dataclass(frozen=True)
class IpexCompatibility:
    """The decision about an installed IPEX: ``kind`` and, unless ``"absent"``, a message."""

    kind: IpexKind
    message: str | None = None

    def __str__(self) -> str:
        return self.kind if self.message is None or self.kind == "use" else f"{self.kind}: {self.message}"


def ipex_compatibility(ipex_version: str | None, torch_version: str) -> IpexCompatibility:
    """Whether IPEX ``ipex_version`` (``None``: not installed) can run with ``torch_version``.

    A pure function of the two version strings, with IPEX's own rule: the major.minor
    versions must be equal (local tags such as ``+cpu``/``+xpu`` and the IPEX patch number
    do not matter).

    Example::

        >>> str(ipex_compatibility(None, "2.13.0+cpu"))
        'absent'
        >>> str(ipex_compatibility("2.8.0+cpu", "2.8.1"))
        'use'
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
        return IpexCompatibility("use", f"intel-extension-for-pytorch {ipex_version} with torch {torch_version}")
    return IpexCompatibility(
        "incompatible",
        f"intel-extension-for-pytorch {ipex_version} supports torch {wanted}.* only, but torch "
        f"{torch_version} is running",
    )


def installed_ipex_version() -> str | None:
    """The installed IPEX version from package metadata (IPEX is not imported), or ``None``."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def ipex_for_o2() -> ModuleType | None:
    """The IPEX module when O2 on the CPU can use it, else ``None``.

    Decided once per process (cached): an installed but unusable IPEX (version mismatch,
    or an import failure such as a CPU without the instruction sets it needs) gives one
    :class:`ampcore.AmpcoreWarning`; then stock PyTorch is used.
    """
    decision = ipex_compatibility(installed_ipex_version(), torch.__version__)
    if decision.kind == "absent":
        return None
    if decision.kind == "incompatible":
        _warn(decision.message or "incompatible version")
        return None
    try:
        return importlib.import_module(MODULE)
    except Exception as exc:  # e.g. its CPU instruction-set check or missing libraries
        _warn(f"importing intel-extension-for-pytorch failed ({type(exc).__name__}: {exc})")
        return None


def _warn(problem: str) -> None:
    warnings.warn(
        f"ampcore.decorate(level='O2') on the CPU does not use Intel Extension for PyTorch: {problem}. "
        f"Using stock PyTorch O2 instead. Install intel-extension-for-pytorch matching your torch "
        f"version, or uninstall it to silence this warning",
        AmpcoreWarning,
        stacklevel=3,
    )


def ipex_prepare_o2(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, dtype: torch.dtype
) -> tuple[torch.nn.Module, torch.optim.Optimizer | None] | None:
    """``ipex.optimize(model, dtype=torch.bfloat16, optimizer=optimizer)`` when IPEX can serve,
    else ``None`` (float16 is left to the core: the issue asks IPEX for bf16 O2 only).

    Example::

        >>> ipex_prepare_o2(torch.nn.Linear(2, 2), None, torch.float16) is None
        True
    """
    if dtype != torch.bfloat16:
        return None
    ipex = ipex_for_o2()
    if ipex is None:
        return None
    if optimizer is None:
        return ipex.optimize(model, dtype=dtype), None
    prepared_model, prepared_optimizer = ipex.optimize(model, dtype=dtype, optimizer=optimizer)
    return prepared_model, prepared_optimizer
