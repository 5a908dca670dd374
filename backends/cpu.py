"""CPU adapter: bfloat16 (default) and float16 autocast on the CPU.

Native bf16 needs AVX512-BF16 or AMX-BF16; native fp16 needs AVX512-FP16 or AMX-FP16.
Without them torch emulates the dtype, which is typically slower than float32: the
capability check warns once.  The flags come from ``torch.cpu.get_capabilities()`` (torch
>= 2.9), else from ``/proc/cpuinfo``; where neither answers, the check says it cannot tell.

O2 is ampcore's own, also where Intel Extension for PyTorch is installed: ``ipex.optimize``
breaks decorate's contract, so it is used only on request (``AMPCORE_CPU_IPEX=optimize``,
see ``ampcore_backends._ipex``); ``ampcore info`` shows IPEX's state.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable, Mapping
from typing import Final

import torch

from ampcore import BackendSpec, CapabilityIssue, hookimpl

from ._ipex import ipex_prepare_o2, ipex_state
from ._schedstat import run_delay_reader

#: The adapter contract this plugin targets (ampcore.hookspec).
AMPCORE_CONTRACT = 2

#: CPU feature flags (as ``torch.cpu.get_capabilities()`` names them) that run a dtype natively.
NATIVE_FEATURES: Final[Mapping[torch.dtype, tuple[str, ...]]] = {
    torch.bfloat16: ("avx512_bf16", "amx_bf16"),
    torch.float16: ("avx512_fp16", "amx_fp16"),
}


#: Elements per chunk of O2's own master-weight updates (``BackendSpec.master_update_chunk_elements``):
#: a 256K-element float32 chunk (1 MiB) of the master, each optimizer state and the widened
#: gradient stays in the last-level cache between torch's passes over it (docs/performance.md,
#: issues 17 and 31).
MASTER_UPDATE_CHUNK: Final = 1 << 18


#: Where Linux lists the CPU's feature flags (read when torch cannot report them).
CPUINFO: Final = "/proc/cpuinfo"


def capabilities_from_cpuinfo(text: str) -> dict[str, object]:
    """The :data:`NATIVE_FEATURES` flags and ``cpu_name`` from ``/proc/cpuinfo`` text, in
    ``torch.cpu.get_capabilities()``'s form (the kernel names these flags alike); ``{}``
    when the text lists no flags.

    Example::

        >>> caps = capabilities_from_cpuinfo("model name\\t: Xeon\\nflags\\t\\t: fpu avx512_bf16 sse2\\n")
        >>> caps["cpu_name"], caps["avx512_bf16"], caps["amx_bf16"]
        ('Xeon', True, False)
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:  # the first processor's entry
            fields[key.strip()] = value.strip()
    if "flags" not in fields:
        return {}
    flags = set(fields["flags"].split())
    wanted = {flag for features in NATIVE_FEATURES.values() for flag in features}
    caps: dict[str, object] = {"cpu_name": fields.get("model name", "")}
    caps.update({flag: flag in flags for flag in sorted(wanted)})
    return caps


def read_capabilities() -> dict[str, object]:
    """The CPU's feature flags: ``torch.cpu.get_capabilities()`` (torch >= 2.9), else
    ``/proc/cpuinfo`` (Linux), else ``{}`` (unknown)."""
    getter = getattr(torch.cpu, "get_capabilities", None)
    if getter is not None:
        try:
            return dict(getter())
        except Exception:  # an unusual build: fall back to the operating system
            pass
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as handle:
            return capabilities_from_cpuinfo(handle.read())
    except OSError:  # not Linux
        return {}


def cpu_capability_issues(capabilities: Mapping[str, object], dtype: torch.dtype) -> list[CapabilityIssue]:
    """Warn when ``dtype`` will run emulated on a CPU with ``capabilities``.

    A pure function of recorded flags.  Unknown capabilities (an empty mapping: torch has
    no ``torch.cpu.get_capabilities()`` and ``/proc/cpuinfo`` gives no flags) give a
    warning that says the check could not be made, rather than silently none.

    Example::

        >>> flags = {"cpu_name": "X", "avx512_bf16": False, "amx_bf16": False}
        >>> cpu_capability_issues(flags, torch.bfloat16)[0].severity
        'warning'
        >>> cpu_capability_issues({}, torch.bfloat16)[0].message.startswith("cannot tell")
        True
    """
    features = NATIVE_FEATURES.get(dtype)
    if features is None:
        return []
    if not capabilities:
        return [
            CapabilityIssue(
                "warning",
                f"cannot tell whether {dtype} runs natively on this CPU: torch {torch.__version__} has no "
                f"torch.cpu.get_capabilities() and {CPUINFO} gives no CPU flags; without any of "
                f"{', '.join(features)} mixed precision is slower than float32",
            )
        ]
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
def ampcore_backend() -> BackendSpec:
    return BackendSpec(
        name="cpu",
        device_type="cpu",
        dtypes=[torch.bfloat16, torch.float16],
        priority=0,
        master_update_chunk_elements=MASTER_UPDATE_CHUNK,
        master_update_onepass=True,
    )


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


@hookimpl
def ampcore_backend_info() -> dict[str, str]:
    return {"ipex": str(ipex_state())}


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


def reset_peak_rss() -> None:
    """Reset the peak resident set size (VmHWM) to the current one: writing "5" to
    ``/proc/self/clear_refs`` (Linux >= 4.0); nothing elsewhere."""
    try:
        with open(_CLEAR_REFS, "w") as handle:
            handle.write("5")
    except OSError:
        pass


@hookimpl
def ampcore_memory(reset_peak: bool) -> dict[str, int | None]:
    # The CPU computes in host memory: no "total", so `ampcore bench` picks scaled-down sizes.
    if reset_peak:
        reset_peak_rss()
    return {"in_use": _status_field("VmRSS"), "peak": _status_field("VmHWM")}


@hookimpl
def ampcore_auto_load() -> float | None:
    """Other work on the host: the 1-minute load average minus what this process's threads
    have put into it, over the cores this process may use (None where the OS has no load
    average)."""
    return host_load(torch.get_num_threads())


@hookimpl
def ampcore_auto_timer() -> Callable[[], float] | None:
    """The calling thread's CPU time while torch computes on one thread: all of a timed
    call's work then runs on the calling thread, so its CPU time is what a quiet machine's
    wall clock shows, without the time slices other processes hold the core for (on a busy
    machine: spikes of several milliseconds).  None with more threads: work spread over
    threads that clock does not see (the wall clock)."""
    return time.thread_time if torch.get_num_threads() == 1 else None


@hookimpl
def ampcore_auto_waited() -> Callable[[], float] | None:
    """With more than one thread, the run delay of this process's threads (Linux schedstat:
    time runnable but waiting for a core, ``ampcore_backends._schedstat``): a timed run's
    work spreads over torch's threads, the wall clock times it, and a run while which they
    waited was pre-empted by other work (timed again).  None with one thread (the thread's
    CPU time already leaves waits out) and where the kernel gives no run delay (each run
    timed once, on the wall clock)."""
    return None if torch.get_num_threads() == 1 else run_delay_reader()


def host_load(own_threads: int) -> float | None:
    """The others' share of this process's cores by the load average (see ampcore_auto_load).

    The load average follows runnable threads with a one-minute time constant, so a process
    that started ``t`` seconds ago has put ``own_threads * (1 - exp(-t / 60))`` into it, not
    all of ``own_threads`` (a young process subtracting all of it would hide a busy host).

    Example::

        >>> load = host_load(1)
        >>> load is None or load >= 0.0
        True
    """
    try:
        average = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0.0, average - own_threads * _own_share()) / max(1, cores)


def _own_share() -> float:
    """How much of one always-runnable thread of this process the load average holds now
    (1.0 where the process's age cannot be read)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            age = float(uptime.read().split()[0]) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return 1.0
    return 1.0 - math.exp(-max(0.0, age) / 60.0)
