"""Operator statistics: how many calls of each ATen op produced fp32, fp16, bf16 or other.

The counting happens in a ``TorchDispatchMode``, below autograd and after autocast has
cast the inputs: every ATen op is seen, also those inside composite modules such as
``nn.MultiheadAttention``, on any backend.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import torch

from .._errors import AmpcoreError
from .._table import format_table
from .._validate import check_bool
from ._ops import BUCKETS, Bucket, ObservingMode, op_name, result_bucket

__all__ = [
    "OperatorStats",
    "collect_operator_stats",
    "disable_operator_stats_collection",
    "enable_operator_stats_collection",
]

_HEADERS = {"fp32": "FP32 calls", "fp16": "FP16 calls", "bf16": "BF16 calls", "other": "other calls"}


class OperatorStats:
    """Per-op call counts by output dtype, filled by :func:`collect_operator_stats`.

    ``counts`` maps an op name (``"addmm"``; ``"ns::op"`` outside ATen) to
    ``{"fp32": n, "fp16": n, "bf16": n, "other": n}``.  An op call is put in the bucket of
    its first floating-point output (``"other"``: float64, integer or no tensor output).
    Casts count as the op ``_to_copy``, which is what autocast and ``Tensor.to`` dispatch.

    Example::

        >>> stats = OperatorStats()
        >>> stats.add("addmm", "bf16"); stats.add("addmm", "bf16")
        >>> stats.counts["addmm"]["bf16"], stats.total("bf16")
        (2, 2)
    """

    def __init__(self) -> None:
        self.counts: dict[str, dict[Bucket, int]] = {}
        self._lock = threading.Lock()

    def add(self, op: str, bucket: Bucket, calls: int = 1) -> None:
        """Count ``calls`` calls of ``op`` in ``bucket`` (thread-safe)."""
        with self._lock:
            row = self.counts.get(op)
            if row is None:
                row = self.counts[op] = dict.fromkeys(BUCKETS, 0)
            row[bucket] += calls

    def total(self, bucket: Bucket | None = None) -> int:
        """Calls in ``bucket``, or of every bucket when None."""
        buckets = BUCKETS if bucket is None else (bucket,)
        return sum(row[b] for row in self.counts.values() for b in buckets)

    def table(self) -> str:
        """The counts as a text table, one row per op sorted by name, with a total row."""
        ops = sorted(self.counts)
        rows = [("op", *(_HEADERS[b] for b in BUCKETS))]
        rows += [(op, *(str(self.counts[op][b]) for b in BUCKETS)) for op in ops]
        rows.append(("total", *(str(self.total(b)) for b in BUCKETS)))
        lines = format_table(
            rows, "l" + "r" * len(BUCKETS), sep=" | ", rule="line", min_widths=[0, *[12] * len(BUCKETS)]
        )
        return "\n".join(lines)

    def print(self, file: TextIO | None = None) -> None:
        """Print :meth:`table` (to stdout by default)."""
        print(self.table(), file=file or sys.stdout)

    def __repr__(self) -> str:
        return f"OperatorStats(ops={len(self.counts)}, calls={self.total()})"


class _CountingMode(ObservingMode):
    def __init__(self, stats: OperatorStats) -> None:
        super().__init__()
        self.stats = stats

    def observe(self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        self.stats.add(op_name(func), result_bucket(result))


@contextmanager
def collect_operator_stats() -> Iterator[OperatorStats]:
    """Count the ATen op calls of the region by output dtype.

    It sees every ATen op dispatched in the entering thread (forward and backward,
    inside composite modules too), on any backend.  Ops run in other threads are not
    seen: torch's dispatch modes are thread-local.  Every op goes through Python while it
    is active, so the region runs slower; it never synchronises with the device.

    Autocast's casts show as ``_to_copy``; a weight cast served from the autocast cache
    dispatches nothing and so is not counted.

    Example::

        >>> import torch, ampcore.debugging
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> with ampcore.debugging.collect_operator_stats() as stats:
        ...     with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
        ...         _ = net(torch.randn(2, 4))
        >>> stats.counts["addmm"]["bf16"], stats.counts["relu"]["bf16"]
        (1, 1)
    """
    stats = OperatorStats()
    with _CountingMode(stats):
        yield stats


class _Enabled(threading.local):
    def __init__(self) -> None:
        self.stack: list[tuple[Any, OperatorStats]] = []


_enabled = _Enabled()


def enable_operator_stats_collection() -> None:
    """Start counting op calls in this thread (Paddle's name); stop with
    :func:`disable_operator_stats_collection`.

    Example::

        >>> import torch, ampcore.debugging
        >>> ampcore.debugging.enable_operator_stats_collection()
        >>> _ = torch.ones(2) + 1
        >>> ampcore.debugging.disable_operator_stats_collection(print_table=False).counts["add"]["fp32"]
        1
    """
    context = collect_operator_stats()
    stats = context.__enter__()
    _enabled.stack.append((context, stats))


def disable_operator_stats_collection(print_table: bool = True, file: TextIO | None = None) -> OperatorStats:
    """Stop the collection the last :func:`enable_operator_stats_collection` of this
    thread started, print its table (unless ``print_table=False``) and return it.

    Raises:
        AmpcoreError: no collection is enabled in this thread.
    """
    check_bool("disable_operator_stats_collection", "print_table", print_table)
    if not _enabled.stack:
        raise AmpcoreError(
            "disable_operator_stats_collection(): no collection is enabled in this thread; call "
            "enable_operator_stats_collection() first (collections are per thread)"
        )
    context, stats = _enabled.stack.pop()
    context.__exit__(None, None, None)
    if print_table:
        stats.print(file)
    return stats
