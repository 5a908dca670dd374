"""``ampcore bench``'s sizes against the memory there is, before anything is allocated.

``--size 1000000000`` asks for 9 weight matrices of 10**18 elements: without a check the
allocator fails minutes into the run (or a worker process dies), with a traceback naming
neither option.  :func:`bench_bytes` is a lower bound of what one mode holds at its peak,
:func:`check_bench_fits` compares it with the device's memory (the adapter's
``ampcore_memory`` total, else the host's RAM for host-memory backends), and
:func:`check_sizes` does so for one backend's device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from .._backends.backend import Backend
from .._backends.memory import device_memory
from .._errors import AmpcoreError

__all__ = ["BenchBytes", "bench_bytes", "check_bench_fits", "check_sizes", "host_memory"]

#: Layers of the guide's network (9 x Linear(size, size)).
LAYERS: Final = 9
#: Elements a torch tensor may hold (int64 sizes).
MAX_ELEMENTS: Final = 2**63 - 1


@dataclass(frozen=True)
class BenchBytes:
    """A lower bound of one mode's peak bytes, by what ``--size`` and ``--batch`` drive."""

    #: weights and their gradients: 8 bytes per parameter in every mode (fp32 weights and
    #: gradients; O2: low-precision weights and gradients plus fp32 masters)
    model: int
    #: the ``batches`` input and label batches (float32) and one low-precision activation
    #: per layer saved for backward
    data: int

    @property
    def total(self) -> int:
        return self.model + self.data


def bench_bytes(size: int, batch: int, batches: int) -> BenchBytes:
    """The lower bound of :class:`BenchBytes` for ``9 x Linear(size, size)`` at ``batch``.

    Example::

        >>> b = bench_bytes(1024, 64, 10)
        >>> b.model, b.data
        (75571200, 6422528)
    """
    params = LAYERS * size * (size + 1)
    return BenchBytes(model=8 * params, data=2 * 4 * batches * batch * size + 2 * LAYERS * batch * size)


def _gib(value: int) -> str:
    """``value`` bytes in the largest binary unit up to EiB (``64.0 EiB``, ``512.0 MiB``)."""
    for power, unit in ((60, "EiB"), (50, "PiB"), (40, "TiB"), (30, "GiB")):
        if value >= 2**power:
            return f"{value / 2**power:,.1f} {unit}"
    return f"{value / 2**20:,.1f} MiB"


def check_bench_fits(size: int, batch: int, batches: int, memory: int | None, where: str) -> None:
    """Raise :class:`AmpcoreError` naming the option to lower when the bench cannot fit in
    ``memory`` bytes (``where``: whose memory it is), or its tensors exceed torch's sizes.
    ``memory`` ``None`` (unknown) checks only torch's sizes.

    Example::

        >>> check_bench_fits(10**9, 4, 10, 2**34, "host RAM")
        Traceback (most recent call last):
        ...
        ampcore._errors.AmpcoreError: --size 1000000000: 9 x Linear(1000000000, 1000000000) needs at least 62.5 EiB for its weights and gradients alone, more than the 16.0 GiB of host RAM; lower --size
    """  # noqa: E501 - a doctest shows the whole one-line message
    if size * size > MAX_ELEMENTS or batches * batch * size > MAX_ELEMENTS:
        option = "--size" if size * size > MAX_ELEMENTS else "--batch"
        value = size if option == "--size" else batch
        raise AmpcoreError(
            f"{option} {value}: the network's tensors would exceed torch's largest tensor (2**63 - 1 "
            f"elements); lower {option}"
        )
    if memory is None:
        return
    need = bench_bytes(size, batch, batches)
    if need.model > memory:
        raise AmpcoreError(
            f"--size {size}: {LAYERS} x Linear({size}, {size}) needs at least {_gib(need.model)} for its "
            f"weights and gradients alone, more than the {_gib(memory)} of {where}; lower --size"
        )
    if need.total > memory:
        option = "--batch" if need.data > need.model else "--size"
        raise AmpcoreError(
            f"--size {size} --batch {batch}: needs at least {_gib(need.total)} (weights and gradients "
            f"{_gib(need.model)}, {batches} batches of data and the activations {_gib(need.data)}), more "
            f"than the {_gib(memory)} of {where}; lower {option}"
        )


def host_memory() -> int | None:
    """The host's physical memory in bytes (``None`` where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


def check_sizes(backend: Backend, index: int, size: int, batch: int, batches: int) -> None:
    """Refuse sizes the device's memory (host RAM for host backends) cannot hold, naming the option."""
    memory = device_memory(backend, index)
    where = f"{backend.name}:{index} ({backend.device_name(index)})" if memory is not None else "host RAM"
    check_bench_fits(size, batch, batches, memory if memory is not None else host_memory(), where)
