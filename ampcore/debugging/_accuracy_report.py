"""What :func:`ampcore.debugging.compare_accuracy` returns: one row per module (or op call)
and the report that ranks them (``table()``, ``first_bad``)."""

from __future__ import annotations

from dataclasses import dataclass

from .._table import format_table

__all__ = ["AccuracyReport", "AccuracyRow"]


@dataclass(frozen=True)
class AccuracyRow:
    """The error of one module's outputs (or, with ``per_op``, of one op call).

    Attributes:
        module_path: ``"Net.blocks.2"`` (the root is its class name).
        op: None for a module row; the op name (``"exp"``) for an op row.
        op_index: which call of ``op`` inside ``module_path`` it is (0 for the first).
        max_rel_error / max_abs_error: see the module docstring; ``inf`` where AMP
            produced inf or nan and float32 did not.
        ref_dtype / amp_dtype: the dtype of the first floating output in each run.
        calls: how many calls were compared (a module called twice has 2).
        order: when its first call finished in the AMP run (0 first).
        note: why a row is suspect (outputs of different shapes or counts).
    """

    module_path: str
    op: str | None
    op_index: int
    max_rel_error: float
    max_abs_error: float
    ref_dtype: str
    amp_dtype: str
    calls: int
    order: int
    note: str = ""

    @property
    def name(self) -> str:
        """``"Net.blocks.2"`` or, for an op row, ``"Net.blocks.2/exp#0"``."""
        return self.module_path if self.op is None else f"{self.module_path}/{self.op}#{self.op_index}"


@dataclass(frozen=True)
class AccuracyReport:
    """Rows sorted by relative error, largest first (ties: the earlier one first);
    ``unmatched``: the op calls of the AMP run without a float32 counterpart (an op only that
    run dispatched), as ``"Module.path/op#k"``.

    Example::

        >>> row = AccuracyRow("Net.fc", None, 0, 0.5, 2.0, "float32", "float16", 1, 0)
        >>> report = AccuracyReport((row,), "O1", "float16", "cpu", threshold=0.1)
        >>> report.first_bad.name
        'Net.fc'
    """

    rows: tuple[AccuracyRow, ...]
    level: str
    dtype: str
    device: str
    threshold: float
    unmatched: tuple[str, ...] = ()

    @property
    def in_order(self) -> tuple[AccuracyRow, ...]:
        """The rows in the order their first call finished (inner modules before outer)."""
        return tuple(sorted(self.rows, key=lambda r: r.order))

    @property
    def first_bad(self) -> AccuracyRow | None:
        """The first row, in execution order, whose error exceeds ``threshold``."""
        return next((r for r in self.in_order if r.max_rel_error > self.threshold), None)

    def table(self, limit: int | None = 20) -> str:
        """The ``limit`` worst rows as a text table (all rows when None)."""
        rows = self.rows if limit is None else self.rows[:limit]
        first = self.first_bad
        header = ("rank", "module", "rel error", "abs error", "fp32 run", "AMP run", "calls")
        cells = [header] + [
            (
                str(rank),
                row.name,
                f"{row.max_rel_error:.3g}",
                f"{row.max_abs_error:.3g}",
                row.ref_dtype,
                row.amp_dtype,
                str(row.calls),
            )
            for rank, row in enumerate(rows, 1)
        ]
        table = format_table(cells, "rlrrrrr", rule=None, min_widths=(4, 0, 10, 10, 9, 9, 5))
        title = (
            f"compare_accuracy: float32 vs {self.level} {self.dtype} on {self.device} "
            f"(max relative error, threshold {self.threshold:g})"
        )
        lines = [title, table[0]]
        for line, row in zip(table[1:], rows, strict=True):
            mark = "  <- first over threshold" if row is first else ""
            note = f"  ({row.note})" if row.note else ""
            lines.append(f"{line}{mark}{note}")
        if limit is not None and len(self.rows) > limit:
            lines.append(f"... {len(self.rows) - limit} more rows (table(limit=None) shows all)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
