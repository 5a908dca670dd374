"""``ampcore plan``: show, export, load-check and clear the plans of ``level="auto"``.

* ``ampcore plan show [FILE]``: the table of a plan file, or of this machine's cached plan
  (costs, their spread and number of runs, decision and source of every entry);
* ``ampcore plan export FILE``: write this machine's cached plan to FILE (for DDP ranks
  and resumed runs: ``ampcore.load_plan(FILE)``);
* ``ampcore plan check FILE``: whether FILE was made for this setting;
* ``ampcore plan clear``: delete this machine's cache file of a backend and dtype
  (``--all``: every cache file, of every setting).
"""

from __future__ import annotations

import argparse
import json

from .. import _dtypes
from .._auto import AutoPlan, auto_plan
from .._auto._cache import cache_file, cache_files, forget_plans
from .._auto._load import _this_process, read_plan
from .._errors import AmpcoreError

__all__ = ["add_parser"]


def _cached(args: argparse.Namespace) -> AutoPlan:
    dtype = None if args.dtype is None else _dtypes.parse_dtype(args.dtype, "ampcore plan", "--dtype")
    return auto_plan(args.device, dtype)


def _show(args: argparse.Namespace) -> int:
    plan = read_plan(args.file, "ampcore plan show") if args.file else _cached(args)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=1, sort_keys=True))
        return 0
    print(plan.table())
    if not args.file:
        where = cache_file(plan.fingerprint)
        print(f"cache file: {where if where else 'disk cache off (AMPCORE_AUTO_CACHE)'}")
    if not plan.entries:
        print("(no shape class measured yet: run a step under ampcore.autocast(level='auto'))")
    return 0


def _export(args: argparse.Namespace) -> int:
    plan = _cached(args)
    if not plan.entries:
        raise AmpcoreError(
            f"nothing to export for {plan.fingerprint['backend']} / {plan.fingerprint['dtype']}: no shape class "
            "is cached on this machine (run a training step under ampcore.autocast(level='auto') first)"
        )
    print(f"wrote {len(plan.entries)} decisions to {plan.save(args.file)}")
    return 0


def _check(args: argparse.Namespace) -> int:
    plan = read_plan(args.file, "ampcore plan check")
    here = _this_process(plan.fingerprint)
    diff = sorted(k for k in {*here, *plan.fingerprint} if here.get(k) != plan.fingerprint.get(k))
    if diff:
        for key in diff:
            print(f"{key}: plan {plan.fingerprint.get(key)!r}, here {here.get(key)!r}")
        print(
            f"{args.file}: made for another setting (load it with ampcore.load_plan(..., check=False) to use it anyway)"
        )
        return 1
    print(f"{args.file}: {len(plan.entries)} decisions, made for this setting")
    return 0


def _clear(args: argparse.Namespace) -> int:
    if args.all:
        paths = cache_files()
    else:
        path = cache_file(_cached(args).fingerprint)
        paths = [] if path is None or not path.exists() else [path]
    forget_plans()  # this process measures again too
    if cache_file({}) is None:
        print("disk cache off (AMPCORE_AUTO_CACHE): nothing to clear")
        return 0
    failed = 0
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # a directory in its place, a read-only directory
            failed += 1
            print(f"cannot remove {path}: {exc.strerror or exc} (remove it by hand)")
            continue
        print(f"removed {path}")
    if not paths:
        print("no cache file to remove")
    return 1 if failed else 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("plan", help="show, export, check or clear level='auto' plans", description=__doc__)
    actions = parser.add_subparsers(dest="plan_command", metavar="ACTION", required=True)
    for name, func, helptext in (
        ("show", _show, "print a plan's table (a FILE, or this machine's cached plan)"),
        ("export", _export, "write this machine's cached plan to FILE"),
        ("check", _check, "exit 1 when FILE was made for another setting"),
        ("clear", _clear, "delete this machine's cache file"),
    ):
        sub = actions.add_parser(name, help=helptext)
        if name in ("show",):
            sub.add_argument("file", nargs="?", help="a plan file (default: this machine's cached plan)")
            sub.add_argument("--json", action="store_true", help="print the plan as JSON")
        elif name in ("export", "check"):
            sub.add_argument("file", help="the plan file")
        if name == "clear":
            sub.add_argument("--all", action="store_true", help="every cache file, of every backend and setting")
        if name != "check":
            sub.add_argument("--device", default=None, help="backend name (default: the best available)")
            sub.add_argument("--dtype", default=None, help="low-precision dtype (default: the backend's)")
        sub.set_defaults(func=func)
