"""Orders of candidates for timed rounds run back to back (the whole-call check, ``_verify``;
the benchmarks' modes, ``benchmarks/auto_procs.py``).

A timed run pays for what the run before it left behind (caches, the allocator's free
lists): on a CPU without bf16 instructions a float32 training step right after an
emulated-bfloat16 one takes about 10% longer than after another float32 step.  Rounds that
cycle through every permutation balance the neighbours *inside* rounds only: at a round's
boundary the last candidate is followed by the next round's first.  Over the whole-call
check's 7 rounds of ``(plan, low, fp32)`` in permutation order the program followed float32
4 times and the O1 lists 2 times, float32 followed the O1 lists 4 times and itself never,
the O1 lists followed themselves once; ``bench_auto.py``'s rounds put auto after
torch.autocast 8 times in 15, float32 4 times (issue 27, sixteenth stop: the steady gap of a
float32-decided auto over float32 on heldout-clip without bf16 instructions).

:func:`orders` gives ``n - 1`` orders whose runs, read one after another and from the last
back to the first, pass every ordered pair of different candidates exactly once: each
follows each other equally often and never itself (an Eulerian circuit of the complete
directed graph on the candidates, cut into rounds; found by a depth-first search, instant up
to 8 candidates).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["orders"]

T = TypeVar("T")


def orders(names: Sequence[T]) -> list[tuple[T, ...]]:
    """Rounds for ``names`` (each once a round) to run in a cycle, the first in the given order
    (see the module).

    Example::

        >>> orders(("plan", "low", "fp32"))
        [('plan', 'low', 'fp32'), ('plan', 'fp32', 'low')]
        >>> runs = [name for row in orders("abcd") for name in row]
        >>> sorted(zip(runs, runs[1:] + runs[:1])) == [(a, b) for a in "abcd" for b in "abcd" if a != b]
        True
    """
    n = len(names)
    if n < 3:  # one candidate, or two in alternation
        return [tuple(names)]
    seq = list(range(n))
    if not _extend(seq, set(itertools.pairwise(seq)), n):  # (found for every n tried, 3 to 8)
        raise ValueError(f"no cycle of rounds of {n} candidates with balanced neighbours found")
    return [tuple(names[i] for i in seq[k : k + n]) for k in range(0, n * (n - 1), n)]


def _extend(seq: list[int], used: set[tuple[int, int]], n: int) -> bool:
    """Extend ``seq`` (candidates' indices; ``used``: its neighbouring pairs) to the whole
    cycle of :func:`orders`; whether it could."""
    if len(seq) == n * (n - 1):
        return (seq[-1], seq[0]) not in used
    row = set(seq[len(seq) - len(seq) % n :]) if len(seq) % n else set()
    last = seq[-1]
    for m in range(n):
        if m == last or m in row or (last, m) in used:
            continue
        used.add((last, m))
        seq.append(m)
        if _extend(seq, used, n):
            return True
        seq.pop()
        used.discard((last, m))
    return False
