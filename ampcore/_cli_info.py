"""``ampcore info``: versions, plugins and backends of this installation."""

from __future__ import annotations

import argparse
import json
import platform
import warnings
from collections.abc import Sequence
from typing import Any

import pluggy
import torch

from ._backend import Backend, dtype_name
from ._registry import get_manager
from ._version import __version__

__all__ = ["add_parser", "collect_info", "format_info"]


def _backend_info(backend: Backend) -> dict[str, Any]:
    reason = backend.unavailable_reason
    entry: dict[str, Any] = {
        "name": backend.name,
        "device_type": backend.device_type,
        "plugin": backend.plugin_name,
        "distribution": backend.distribution,
        "version": backend.version,
        "available": reason is None,
        "reason": reason,
        "priority": backend.priority,
        "dtypes": [dtype_name(d) for d in backend.supported_dtypes],
        "default_dtype": dtype_name(backend.default_dtype),
        "loss_scaling": [dtype_name(d) for d in backend.supported_dtypes if backend.needs_loss_scaling(d)],
        "device_name": None,
        "capability": {},
    }
    if reason is None:
        try:
            entry["device_name"] = backend.device_name(0)
            entry["capability"] = {
                dtype_name(d): [f"{i.severity}: {i.message}" for i in backend.capability_issues(d, 0)]
                for d in backend.supported_dtypes
            }
        except Exception as exc:  # a broken adapter must not break `ampcore info`
            entry["error"] = f"{type(exc).__name__}: {exc}"
    return entry


def collect_info() -> dict[str, Any]:
    """Everything ``ampcore info`` shows, as JSON-serialisable data."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = get_manager()
        plugins = manager.plugins()
    return {
        "ampcore": __version__,
        "torch": torch.__version__,
        "pluggy": pluggy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "plugins": [vars(p).copy() for p in plugins],
        "backends": [_backend_info(b) for b in manager.backends()],
        "load_warnings": [str(w.message) for w in caught],
    }


def format_info(info: dict[str, Any]) -> str:
    """Render :func:`collect_info` output as aligned text tables."""
    lines = [
        f"ampcore {info['ampcore']}  torch {info['torch']}  pluggy {info['pluggy']}  python {info['python']}",
        "",
        "Plugins:",
    ]
    rows: list[tuple[str, ...]] = [("name", "distribution", "version", "source", "status", "error")]
    for p in info["plugins"]:
        rows.append((p["name"], p["distribution"] or "-", p["version"] or "-", p["source"], p["status"], p["error"] or ""))
    lines += _table(rows)
    lines += ["", "Backends:"]
    rows = [("backend", "device type", "available", "device", "dtypes", "default", "from")]
    notes = []
    for b in info["backends"]:
        available = "yes" if b["available"] else f"no: {b['reason']}"
        rows.append(
            (b["name"], b["device_type"], available, b["device_name"] or "-", ",".join(b["dtypes"]), b["default_dtype"], b["distribution"] or b["plugin"])
        )
        for dtype, issues in b["capability"].items():
            notes += [f"  {b['name']} {dtype}: {issue}" for issue in issues]
        if b.get("error"):
            notes.append(f"  {b['name']}: adapter error: {b['error']}")
    lines += _table(rows)
    if notes:
        lines += ["", "Capability notes:", *notes]
    return "\n".join(lines)


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    out = ["  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    out.insert(1, "  " + "  ".join("-" * w for w in widths))
    return out


def _run(args: argparse.Namespace) -> int:
    info = collect_info()
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("info", help="show versions, plugins and backends")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.set_defaults(func=_run)
