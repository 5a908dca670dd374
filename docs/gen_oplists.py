#!/usr/bin/env python3
"""Generate the default op-list tables of docs/levels.md from ``ampcore.oplists``.

    python docs/gen_oplists.py           # rewrite the generated section in place
    python docs/gen_oplists.py --check   # exit 1 when the section is out of date

The section lies between the two ``GENERATED OP LISTS`` markers; the prose around it is
written by hand.  ``tests/policy/test_oplists.py`` fails when it is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

DOC: Final = Path(__file__).resolve().parent / "levels.md"
BEGIN: Final = "<!-- BEGIN GENERATED OP LISTS (python docs/gen_oplists.py; do not edit by hand) -->"
END: Final = "<!-- END GENERATED OP LISTS -->"
#: First-party backends, in the order the page shows them.
BACKENDS: Final = ("cpu", "cuda", "xpu", "npu")
#: The torch release the page shows the lists of (the project's pinned torch, tasks.py);
#: other releases' lists differ by ``ampcore._policy.torch_tables.TABLE_CHANGES``.
RELEASE: Final = (2, 13)


def generate() -> str:
    import ampcore
    from ampcore._cli.oplists import format_markdown

    parts = []
    for name in BACKENDS:
        backend = ampcore.get_backend(name)
        by_lists: dict[tuple[frozenset[str], ...], list[str]] = {}
        tables: dict[tuple[frozenset[str], ...], str] = {}
        for dtype in backend.supported_dtypes:
            lists = ampcore.oplists(name, dtype=dtype)
            key = (lists.white, lists.black, lists.promote, lists.fp32_with_dtype, lists.banned)
            by_lists.setdefault(key, []).append(str(dtype).removeprefix("torch."))
            tables.setdefault(key, format_markdown(lists))
        for key, dtypes in by_lists.items():
            title = f"### {name} ({', '.join(dtypes)})"
            parts.append(f"{title}\n\n{tables[key]}")
    return "\n\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the section is up to date")
    args = parser.parse_args()
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:start] + "\n\n" + generate() + "\n\n" + text[end:]
    if args.check:
        if new != text:
            print(f"{DOC} is out of date: run python docs/gen_oplists.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
