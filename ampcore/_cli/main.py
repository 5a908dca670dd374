"""The ``ampcore`` command line (also ``python -m ampcore``).

Each sub-command lives in its own module exposing ``add_parser(subparsers)``, which adds
its parser and sets ``func`` (called with the parsed namespace, returning an exit code).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._errors import AmpcoreError
from .._version import __version__
from . import bench as _cli_bench
from . import conformance as _cli_conformance
from . import info as _cli_info
from . import oplists as _cli_oplists
from . import plan as _cli_plan
from . import run as _cli_run

__all__ = ["main"]

#: Modules that contribute a sub-command (``add_parser(subparsers) -> None``).
_COMMANDS = (_cli_info, _cli_bench, _cli_conformance, _cli_oplists, _cli_plan, _cli_run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ampcore", description="Automatic mixed precision for PyTorch on every accelerator."
    )
    parser.add_argument("--version", action="version", version=f"ampcore {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except AmpcoreError as exc:
        print(f"ampcore {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
