"""``ampcore oplists``: the effective op lists of a backend, dtype, level and custom lists."""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Iterable
from typing import Any, Final

import torch

from .. import _dtypes
from .._policy.lists import OpLists, oplists

__all__ = ["add_parser", "format_markdown", "format_text", "parse_dtype"]


_SECTIONS: Final = (
    ("white", "white (run in the low-precision dtype)"),
    ("black", "black (run in float32)"),
    ("fp32_with_dtype", "  of which float32 through an output dtype (dtype=torch.float32)"),
    ("promote", "promote (run in the widest input dtype)"),
    ("banned", "banned (raise under autocast)"),
)


def parse_dtype(name: str | None) -> torch.dtype | None:
    """``"bf16"`` -> ``torch.bfloat16``; ``None`` stays ``None`` (the backend's default)."""
    if name is None:
        return None
    return _dtypes.parse_dtype(name, "ampcore oplists", "--dtype")


def _names(values: Iterable[str] | None) -> list[str] | None:
    if not values:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _wrap(names: Iterable[str]) -> list[str]:
    text = " ".join(sorted(names)) or "(none)"
    return textwrap.wrap(text, width=92, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)


def format_text(lists: OpLists, overloads: bool = False) -> str:
    """Human-readable lists."""
    lines = [
        f"backend {lists.backend} (device type {lists.device_type}, {lists.dispatch_key}, "
        f"native table {lists.table}), dtype {str(lists.dtype).removeprefix('torch.')}, level {lists.level}",
    ]
    if lists.custom_white or lists.custom_black:
        lines.append(f"custom white: {sorted(lists.custom_white)}  custom black: {sorted(lists.custom_black)}")
    if lists.adjustments:
        lines.append(f"adapter adjustments: { {k: sorted(v) for k, v in sorted(lists.adjustments.items())} }")
    for attr, title in _SECTIONS:
        names = getattr(lists, attr)
        if attr in ("fp32_with_dtype", "banned") and not names:
            continue
        lines += ["", f"{title}: {len(names)}", *_wrap(names)]
    lines += ["", f"every other op: {lists.unlisted}"]
    if overloads:
        lines += ["", "overloads:"]
        lines += [f"    {name:<44} {action}" for name, action in sorted(lists.overloads.items())]
    return "\n".join(lines)


def format_markdown(lists: OpLists) -> str:
    """A Markdown table of the lists (used to generate docs/levels.md)."""
    dtype = str(lists.dtype).removeprefix("torch.")
    rows = [
        f"**{lists.backend}** ({lists.dispatch_key}, native table `{lists.table}`), {dtype}, level {lists.level}",
        "",
        "| list | ops |",
        "|---|---|",
    ]
    for attr, title in _SECTIONS:
        names = getattr(lists, attr)
        if names:
            label = title.strip().split(" (")[0] if attr != "fp32_with_dtype" else "black, via dtype="
            rows.append(f"| {label} ({len(names)}) | {' '.join(f'`{n}`' for n in sorted(names))} |")
    rows.append(f"| every other op | {lists.unlisted} |")
    return "\n".join(rows)


def _run(args: argparse.Namespace) -> int:
    lists = oplists(
        args.device,
        dtype=parse_dtype(args.dtype),
        level=args.level,
        custom_white_list=_names(args.custom_white),
        custom_black_list=_names(args.custom_black),
    )
    if args.json:
        print(json.dumps(lists.as_dict(), indent=2))
    elif args.markdown:
        print(format_markdown(lists))
    else:
        print(format_text(lists, overloads=args.overloads))
    return 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "oplists",
        help="show the effective op lists (white/black/promote) of a backend",
        description="Show the op lists ampcore.autocast uses for a backend, dtype, level and custom lists.",
    )
    parser.add_argument("--device", default=None, help="backend name, e.g. cpu or cuda (default: best available)")
    parser.add_argument("--dtype", default=None, help="bfloat16/bf16 or float16/fp16 (default: the backend's)")
    parser.add_argument("--level", default="O1", help="O0, OD, O1, O2 or auto (auto: O1's lists) (default: O1)")
    parser.add_argument(
        "--custom-white", action="append", metavar="OPS", help="ops to run low (comma-separated, repeatable)"
    )
    parser.add_argument("--custom-black", action="append", metavar="OPS", help="ops to run in float32")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print machine-readable JSON")
    output.add_argument("--markdown", action="store_true", help="print a Markdown table")
    output.add_argument("--overloads", action="store_true", help="also list the action of every overload")
    parser.set_defaults(func=_run)
