"""``ampcore info``: versions, plugins and backends of this installation."""

from __future__ import annotations

import argparse
import json
import os
import platform
import textwrap
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Final

import pluggy
import torch

from .._backends.backend import Backend, dtype_name
from .._backends.plugins import ENV_STRICT, PluginManager
from .._backends.registry import get_manager
from .._backends.support import device_dtypes
from .._errors import AmpcoreError
from .._o2.onepass import describe as describe_onepass
from .._o2.onepass_loop import describe as describe_onepass_loop
from .._policy.executor import describe as describe_executor
from .._policy.registration import has_native_autocast
from .._table import format_table
from .._version import __version__

__all__ = ["WIDTH", "add_parser", "collect_info", "format_info"]


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
        "autocast": None,
        # how the scaler sees an overflow: the device's flag (saturating arithmetic) or inf/nan
        "overflow": "flag" if backend.hook("ampcore_device_overflow_flag") is not None else "inf",
        "info": {},
    }
    if reason is None:
        try:
            entry["autocast"] = "native" if has_native_autocast(backend.device_type) else "ampcore"
            entry["device_name"] = backend.device_name(0)
            entry["device_dtypes"] = [dtype_name(d) for d in device_dtypes(backend, 0)]
            entry["capability"] = {
                dtype_name(d): [f"{i.severity}: {i.message}" for i in backend.capability_issues(d, 0)]
                for d in backend.supported_dtypes
            }
            extra = backend.hook("ampcore_backend_info")
            entry["info"] = {str(k): str(v) for k, v in dict(extra() if extra else {}).items()}
        except Exception as exc:  # a broken adapter must not break `ampcore info`
            entry["error"] = f"{type(exc).__name__}: {exc}"
    return entry


def _manager(caught: list[str]) -> PluginManager:
    """The process's manager; when strict mode makes loading raise, a lenient one, so that
    ``ampcore info`` still shows every plugin (the broken one as failed) and the rest."""
    try:
        return get_manager()
    except AmpcoreError as exc:
        caught.append(f"{ENV_STRICT} is set and loading raised (the plugins below loaded without it): {exc}")
        manager = PluginManager(environ={k: v for k, v in os.environ.items() if k != ENV_STRICT})
        manager.load_entry_points()
        return manager


def collect_info() -> dict[str, Any]:
    """Everything ``ampcore info`` shows, as JSON-serialisable data."""
    strict: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = _manager(strict)
        manager.plugins()  # load
        # backends first: a hook that breaks the contract while they are described marks
        # its plugin failed, which the plugin table must show
        backends = [_backend_info(b) for b in manager.backends()]
        plugins = manager.plugins()
    return {
        "ampcore": __version__,
        "torch": torch.__version__,
        "pluggy": pluggy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "plugins": [vars(p).copy() for p in plugins],
        "backends": backends,
        "load_warnings": strict + [str(w.message) for w in caught],
        "strict_error": strict[0] if strict else None,
        "policy_kernel": describe_executor(),
        "o2_cpu_update": describe_onepass(),
        "o2_cpu_loop_update": describe_onepass_loop(),
    }


#: Short dtype names for the backend table (the JSON output keeps torch's names).
_SHORT: Final = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}

#: The width the text output fits (``--wide`` lifts it).
WIDTH: Final = 100


def format_info(info: dict[str, Any], width: int | None = WIDTH) -> str:
    """Render :func:`collect_info` output as text tables that fit ``width`` columns.

    Long texts (why a backend is unavailable, plugin errors, capability findings) go below
    the tables as numbered notes; a long device name is shortened with ``...`` unless
    ``width`` is None.

    Example::

        >>> text = format_info(collect_info())
        >>> max(len(line) for line in text.splitlines()) <= WIDTH
        True
    """
    lines = [
        f"ampcore {info['ampcore']}  torch {info['torch']}  pluggy {info['pluggy']}  python {info['python']}",
        "",
        "Plugins:",
    ]
    notes: list[str] = []

    def note(text: str) -> str:
        notes.append(f"[{len(notes) + 1}] {text}")
        return f"[{len(notes)}]"

    if info.get("strict_error"):
        lines[-1] = "Plugins: " + note(info["strict_error"])
    lines += _table(_plugin_rows(info["plugins"], note), width)
    lines += ["", "Backends:"]
    rows, capability, extras = _backend_rows(info["backends"], note)
    lines += [
        *_table(rows, width),
        "  (dtypes: those device 0 runs, the default first; 'not': declared, refused by the device;",
        "   bf16 = bfloat16, fp16 = float16. autocast: 'native' = the device's own kernels,",
        "   ampcore's only in customised regions; 'ampcore' = ampcore's kernels provide it)",
        "",
        *_wrapped([f"Policy kernels (custom lists, OD, O2): {info.get('policy_kernel', '-')}"], width, hanging=2),
        *_wrapped([f"O2 fused CPU master update: {info.get('o2_cpu_update', '-')}"], width, hanging=2),
        *_wrapped([f"O2 for-loop/foreach CPU master update: {info.get('o2_cpu_loop_update', '-')}"], width, hanging=2),
    ]
    if notes:
        lines += ["", "Notes:", *_wrapped(notes, width, hanging=4)]
    if capability:
        lines += ["", "Capability notes:", *_wrapped(capability, width, hanging=4)]
    if extras:
        lines += ["", "Backend notes:", *_wrapped(extras, width, hanging=4)]
    return "\n".join(lines)


def _plugin_rows(plugins: list[dict[str, Any]], note: Callable[[str], str]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [("name", "distribution", "version", "source", "status")]
    for p in plugins:
        status = p["status"] + (" " + note(f"plugin {p['name']}: {p['error']}") if p["error"] else "")
        rows.append((p["name"], p["distribution"] or "-", p["version"] or "-", p["source"], status))
    return rows


def _backend_rows(
    backends: list[dict[str, Any]], note: Callable[[str], str]
) -> tuple[list[tuple[str, ...]], list[str], list[str]]:
    """The backends table, the capability notes and the backends' own notes."""
    rows: list[tuple[str, ...]] = [("backend", "type", "avail", "from", "dtypes", "autocast", "device")]
    capability: list[str] = []
    extras: list[str] = []
    for b in backends:
        available = "yes" if b["available"] else "no " + note(f"{b['name']}: {b['reason']}")
        if b.get("error"):
            available += " " + note(f"{b['name']}: adapter error: {b['error']}")
        dtypes = [b["default_dtype"], *(d for d in b["dtypes"] if d != b["default_dtype"])]
        runs = b.get("device_dtypes")
        if runs is not None:  # the device's, the default first; a refused one after them
            dtypes = [*runs, *(f"not {_SHORT.get(d, d)}" for d in dtypes if d not in runs)]
        rows.append(
            (
                b["name"],
                b["device_type"],
                available,
                b["distribution"] or b["plugin"],
                ",".join(_SHORT.get(d, d) for d in dtypes),
                b.get("autocast") or "-",
                b["device_name"] or "-",
            )
        )
        for dtype, issues in b["capability"].items():
            capability += [f"{b['name']} {dtype}: {issue}" for issue in issues]
        if b.get("overflow") == "flag":
            extras.append(
                f"{b['name']} overflow: GradScaler reads the device's overflow flag (saturating arithmetic) "
                "besides inf/nan in the gradients"
            )
        extras += [f"{b['name']} {name}: {text}" for name, text in b.get("info", {}).items()]
    return rows, capability, extras


def _wrapped(items: Sequence[str], width: int | None, hanging: int) -> list[str]:
    """Each item indented under its number; a multi-line item (a plugin's traceback) keeps
    its lines, indented, so that nothing it says starts at the left margin."""
    out: list[str] = []
    indent = " " * (2 + hanging)
    for item in items:
        lines = [line.rstrip() for line in str(item).splitlines() if line.strip()] or [""]
        if width is None:
            out += ["  " + lines[0], *(indent + line.strip() for line in lines[1:])]
            continue
        first = textwrap.wrap(lines[0], width, initial_indent="  ", subsequent_indent=indent, break_on_hyphens=False)
        out += first
        for line in lines[1:]:
            out += textwrap.wrap(
                line.strip(), width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
            )
    return out


def _table(rows: Sequence[tuple[str, ...]], width: int | None = None) -> list[str]:
    """Aligned columns; the last column is shortened (``...``) to fit ``width``."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    if width is not None:
        room = width - 2 - sum(widths[:-1]) - 2 * (len(widths) - 1)
        if widths[-1] > room:
            widths[-1] = max(room, len(rows[0][-1]))
            rows = [(*row[:-1], _shorten(str(row[-1]), widths[-1])) for row in rows]
    cells = [[str(c) for c in row] for row in rows]
    return format_table(cells, "l" * len(widths), indent="  ", min_widths=widths, strip=True)


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def _run(args: argparse.Namespace) -> int:
    info = collect_info()
    print(json.dumps(info, indent=2) if args.json else format_info(info, None if args.wide else WIDTH))
    return 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("info", help="show versions, plugins and backends")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--wide", action="store_true", help=f"do not shorten device names to fit {WIDTH} columns")
    parser.set_defaults(func=_run)
