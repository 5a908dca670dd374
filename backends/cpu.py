"""CPU adapter: bfloat16 (default) and float16 autocast on the CPU.

Native bf16 needs AVX512-BF16 or AMX-BF16; native fp16 needs AVX512-FP16 or AMX-FP16.
Without them torch emulates the dtype, which is typically slower than float32: the
capability check warns once.

O2 in bfloat16 uses Intel Extension for PyTorch (``ipex.optimize``) when it is installed
and matches the running torch (see ``ampcore_backends._ipex``); an installed but
incompatible IPEX gives one warning and stock PyTorch.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from typing import Final

import torch

from ampcore import CapabilityIssue, hookimpl

from ._ipex import ipex_prepare_o2

#: CPU feature flags (as ``torch.cpu.get_capabilities()`` names them) that run a dtype natively.
NATIVE_FEATURES: Final[Mapping[torch.dtype, tuple[str, ...]]] = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}


def read_capabilities() -> dict[str, object]:
    """The CPU's feature flags, or ``{}`` where torch cannot report them."""
    getter = getattr(torch.cpu, "get_capabilities", None)
    if getter is None:
        return {}
    try:
        return dict(getter())
    except Exception:  # older or unusual builds: treat as unknown
        return {}


def cpu_capability_issues(capabilities: Mapping[str, object], dtype: torch.dtype) -> list[CapabilityIssue]:
    """Warn when ``dtype`` will run emulated on a CPU with ``capabilities``.

    A pure function of recorded flags.  Unknown capabilities (an empty mapping) give no
    finding: there is nothing to base a warning on.

    Example::

        >>> cpu_capability_issues({"cpu_name": "X", "avx512_bf16": False, "amx_bf16": False}, torch.bfloat16)[0].severity
        'warning'
    """
    features = NATIVE_FEATURES.get(dtype)
    if not capabilities or features is None:
        return []
    if any(bool(capabilities.get(flag)) for flag in features):
        return []
    cpu = capabilities.get("cpu_name") or "this CPU"
    return [
        CapabilityIssue(
            "warning",
            f"{dtype} on {cpu} runs emulated: it has none of {', '.join(features)}; "
            "expect mixed precision to be slower than float32 here",
        )
    ]


@hookimpl
def ampcore_backend_name() -> str:
    return "cpu"


@hookimpl
def ampcore_device_type() -> str:
    return "cpu"


@hookimpl
def ampcore_supported_dtypes() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


@hookimpl
def ampcore_backend_priority() -> int:
    return 0


@hookimpl
def ampcore_device_name(device_index: int) -> str:
    name = read_capabilities().get("cpu_name")
    return str(name or platform.processor() or platform.machine() or "cpu")


@hookimpl
def ampcore_check_capability(dtype: torch.dtype) -> list[CapabilityIssue]:
    return cpu_capability_issues(read_capabilities(), dtype)


@hookimpl
def ampcore_prepare_o2(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, dtype: torch.dtype
) -> tuple[torch.nn.Module, torch.optim.Optimizer | None] | None:
    return ipex_prepare_o2(model, optimizer, dtype)


# -- memory: the process's resident set, from Linux's /proc ------------------------------

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def parse_status_kib(status: str, field: str) -> int | None:
    """Read a ``kB`` field (``VmRSS``, ``VmHWM``) of ``/proc/<pid>/status`` text, in bytes.

    Example::

        >>> parse_status_kib("VmHWM:\\t  2048 kB\\nVmRSS:\\t 1024 kB\\n", "VmHWM")
        2097152
    """
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == field:
            number, _, unit = value.strip().partition(" ")
            return int(number) * 1024 if unit.strip() == "kB" else int(number)
    return None


def _status_field(field: str) -> int | None:
    try:
        with open(_STATUS) as handle:
            return parse_status_kib(handle.read(), field)
    except OSError:  # not Linux
        return None


@hookimpl
def ampcore_memory_in_use() -> int | None:
    return _status_field("VmRSS")


@hookimpl
def ampcore_reset_peak_memory() -> None:
    # Writing "5" resets the peak resident set size (VmHWM) to the current one (Linux >= 4.0).
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")
    except OSError:
        pass


@hookimpl
def ampcore_peak_memory() -> int | None:
    return _status_field("VmHWM")
