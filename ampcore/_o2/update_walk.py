"""How O2's own master-weight updates walk large parameters: chunks or whole tensors.

A backend names its choice in ``BackendSpec.master_update_chunk_elements``.  ``None`` means
whole tensors (a few multi-tensor ops per param group: GPU-like devices, where a kernel
launch is what costs).  A number of elements means chunks, which keep the optimizer's
several passes over a chunk in the CPU's caches: faster on a quiet CPU, but every op on a
chunk is a parallel region, and with another busy process on the cores each region waits
for a descheduled thread, so thousands of small regions make the update several times
slower than whole tensors (issue 31: 4x at a load of 12 on 2 cores).

Both walks give bit-identical results (torch's elementwise kernels on the same values), so
where the backend asks for chunks, :class:`UpdateWalk` measures: it times ampcore's update
on the host clock (such backends' updates run synchronously on the host), times each walk
on the first steps, uses the faster one, and re-times the other now and then (after 16
steps, the interval doubling up to 256 while the choice holds), so that it follows the
machine's load.  Where the parameters are too small for chunks to change anything, the
two walks make the same calls (:func:`walks_differ`): the update then goes whole, untimed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

import torch

__all__ = ["CHUNK_ALIGN", "UpdateWalk", "walks_differ"]

#: a chunk is a multiple of this many elements (a backend's odd number is rounded up): torch's
#: CPU fused kernels split a tensor among threads in 64-byte units and run a vector body and
#: a scalar tail that round differently, so only chunks that start where a unit and a vector
#: of the whole tensor start compute its bits (256 bytes: vectors of up to 64 floats)
CHUNK_ALIGN: Final = 64
#: steps before the first re-timing of the walk not in use; doubled while the choice holds
FIRST_PROBE: Final = 16
LAST_PROBE: Final = 256
#: weight of the newest timing in the running mean of the walk in use
_NEWEST: Final = 0.5

T = TypeVar("T")


class UpdateWalk:
    """The walk of one optimizer's master-weight updates (see the module docstring).

    ``chunk``: the backend's elements per chunk (rounded up to a multiple of
    :data:`CHUNK_ALIGN`), or None (whole tensors, nothing measured).
    ``adaptive=False`` keeps ``chunk`` (benchmarks comparing the walks).

    Example::

        >>> walk = UpdateWalk(1 << 18)
        >>> for seconds in (9.0, 2.0, 1.0):  # the untimed first step, then one of each walk
        ...     walk.record(walk.next_chunk(), seconds)
        >>> walk.current is None  # whole tensors were faster
        True
    """

    def __init__(
        self, chunk: int | None, adaptive: bool = True, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        chunk = None if chunk is None else -(-chunk // CHUNK_ALIGN) * CHUNK_ALIGN
        self.chunk = chunk
        self.adaptive = adaptive and chunk is not None
        self._clock = clock
        self._mean: dict[int | None, float] = {}
        self._steps = 0
        self._since_probe = 0
        self._probe_every = FIRST_PROBE
        self._current: int | None = chunk
        self._probing = False

    @property
    def current(self) -> int | None:
        """The walk in use between re-timings (elements per chunk, or None)."""
        return self._current

    def next_chunk(self) -> int | None:
        """The walk of the coming update: elements per chunk, or None for whole tensors."""
        if not self.adaptive or self._steps < 1:  # the first step creates the state: not timed
            return self.chunk
        for walk in (self.chunk, None):
            if walk not in self._mean:  # a first timing of each walk, chunks first
                self._probing = walk is None
                return walk
        self._probing = self._since_probe >= self._probe_every
        other = None if self._current is not None else self.chunk
        return other if self._probing else self._current

    def run(self, update: Callable[[int | None], T], alike: bool = False) -> T:
        """``update(chunk)`` with the walk of :meth:`next_chunk`, timed where measured;
        ``alike``: both walks make the same calls (:func:`walks_differ`), so measured walks
        run whole tensors, untimed (a fixed walk keeps its chunk)."""
        if not self.adaptive:
            return update(self.chunk)
        if alike:
            return update(None)
        chunk = self.next_chunk()
        start = self._clock()
        result = update(chunk)
        self.record(chunk, self._clock() - start)
        return result

    def record(self, chunk: int | None, seconds: float) -> None:
        """An update with ``chunk`` took ``seconds``; choose the walk of the next ones."""
        self._steps += 1
        if self._steps == 1:
            return
        if not self._probing:
            old = self._mean.get(chunk)
            self._mean[chunk] = seconds if old is None else _NEWEST * seconds + (1 - _NEWEST) * old
            self._since_probe += 1
            return
        self._mean[chunk] = seconds  # the walk not in use: its older timings are stale
        self._since_probe = 0
        self._probing = False
        best = min(self._mean, key=self._mean.__getitem__)
        if best == self._current:
            self._probe_every = min(2 * self._probe_every, LAST_PROBE)
        else:
            self._current = best
            self._probe_every = FIRST_PROBE


def walks_differ(groups: Iterable[Mapping[str, Any]], chunk: int | None, batched: bool, slices: int = 0) -> bool:
    """Whether chunks of ``chunk`` elements walk an update of ``groups`` differently from
    whole tensors: where a parameter is larger than a chunk; for ``batched`` updates
    (Adam's: a chunk's worth of small parameters per widening, call of torch's Adam and
    refresh, where whole tensors do each for the whole group), also where a group holds
    more than a chunk's elements; with ``slices`` (GradScaler's deferred unscaling, which
    widens a ``slices``-th of all the elements at a time, at most a chunk on the chunked
    walk: ``scaled_update.py``), also where such a slice is larger than a chunk.  Otherwise
    both make the same calls on the same tensors."""
    if chunk is None:
        return False
    total = 0
    for group in groups:
        params: list[torch.Tensor] = dict.__getitem__(group, "params")  # type: ignore[index]  # no gradient sync
        sizes = [param.numel() for param in params]
        if (sum(sizes) if batched else max(sizes, default=0)) > chunk:
            return True
        total += sum(sizes)
    return bool(slices) and total // slices > chunk
