"""The one text-table renderer of the CLI and the debugging tools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

__all__ = ["format_table"]


def format_table(
    rows: Sequence[Sequence[str]],
    align: str,
    *,
    sep: str = "  ",
    indent: str = "",
    rule: Literal["columns", "line"] | None = "columns",
    min_widths: Sequence[int] | None = None,
    strip: bool = False,
) -> list[str]:
    """``rows`` (the first is the header) as aligned lines.

    ``align`` has one letter per column, ``"l"`` (left) or ``"r"`` (right).  ``rule``: a
    dashed line under the header, one dash run per column (``"columns"``), one run as long
    as the header line (``"line"``), or none.  ``min_widths`` widens columns; ``strip``
    drops trailing spaces.

    Example::

        >>> print("\\n".join(format_table([("op", "calls"), ("mm", "3")], "lr")))
        op  calls
        --  -----
        mm      3
    """
    count = len(rows[0])
    widths = [max(len(row[i]) for row in rows) for i in range(count)]
    if min_widths is not None:
        widths = [max(w, m) for w, m in zip(widths, min_widths, strict=False)]

    def line(row: Sequence[str]) -> str:
        cells = (c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align, strict=False))
        text = indent + sep.join(cells)
        return text.rstrip() if strip else text

    lines = [line(row) for row in rows]
    if rule == "columns":
        lines.insert(1, indent + sep.join("-" * w for w in widths))
    elif rule == "line":
        lines.insert(1, "-" * len(lines[0]))
    return lines
