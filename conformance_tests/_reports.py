"""The machine-readable (JSON) and human-readable (markdown) reports of a run.

JUnit XML is written by pytest itself (``--junitxml``, set by the plugin from the report
directory); these two carry what JUnit cannot: the backend's distribution and version,
the device name, per-test dtype and op, op-list coverage and the speed measurements.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import torch

import ampcore
from ampcore_conformance import SUITE_VERSION
from ampcore_conformance._context import SuiteContext, dtype_name

__all__ = [
    "JSON_NAME",
    "JUNIT_NAME",
    "MARKDOWN_NAME",
    "TestRecord",
    "build_report",
    "render_markdown",
    "summarize_speed",
    "write_reports",
]

JUNIT_NAME: Final = "junit.xml"
JSON_NAME: Final = "report.json"
MARKDOWN_NAME: Final = "report.md"
#: max/min speed-up over the rounds above which the report calls the numbers unreliable
UNRELIABLE_SPREAD: Final = 1.5
OUTCOMES: Final = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "not run")


@dataclass
class TestRecord:
    """One test of the run and what became of it."""

    id: str
    name: str
    dtype: str | None
    op: str | None
    outcome: str = "not run"
    duration_s: float = 0.0
    message: str | None = None

    def update(self, report: Any) -> None:
        """Fold one pytest ``TestReport`` (setup, call or teardown phase) into the record."""
        self.duration_s += float(report.duration)
        xfail = getattr(report, "wasxfail", None)
        if report.failed:
            self.outcome = "failed" if report.when == "call" else "error"
            crash = getattr(report.longrepr, "reprcrash", None)
            self.message = _short(crash.message if crash is not None else str(report.longrepr))
        elif report.skipped:
            self.outcome = "xfailed" if xfail is not None else "skipped"
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
            self.message = _short(xfail or reason.removeprefix("Skipped: "))
        elif report.when == "call":
            self.outcome = "xpassed" if xfail is not None else "passed"
            self.message = _short(xfail) if xfail else None


def _short(text: str | None, limit: int = 400) -> str | None:
    if not text:
        return text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_report(
    context: SuiteContext, records: list[TestRecord], exit_status: int, started: float, unmatched: list[str]
) -> dict[str, Any]:
    """The JSON report as a dict."""
    backend = context.backend
    counts = Counter(record.outcome for record in records)
    return {
        "suite": {"name": "ampcore-conformance", "version": SUITE_VERSION},
        "ampcore": ampcore.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "backend": {
            "name": context.backend_name,
            "device_type": backend.device_type if backend else None,
            "plugin": backend.plugin_name if backend else None,
            "distribution": backend.distribution if backend else None,
            "version": backend.version if backend else None,
            "declared_dtypes": [dtype_name(d) for d in backend.supported_dtypes] if backend else [],
            "device_name": context.device_name(),
            "available": context.usable,
        },
        "dtypes": [dtype_name(d) for d in context.dtypes],
        "problem": context.problem,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 3),
        "exit_status": exit_status,
        "summary": {outcome: counts.get(outcome, 0) for outcome in OUTCOMES},
        "manifest": {
            "path": context.manifest.path,
            "entries": [asdict(entry) for entry in context.manifest.entries],
            "unmatched": unmatched,
            "tolerances": asdict(context.tolerances),
        },
        "speed": context.speed,
        "tests": [asdict(record) for record in records],
    }


def render_markdown(report: dict[str, Any]) -> str:
    """The markdown summary: versions, counts, per-test table, speed table."""
    b = report["backend"]
    lines = [
        f"# ampcore conformance: backend `{b['name']}`",
        "",
        "| | |",
        "|---|---|",
        f"| backend | `{b['name']}` (device type `{b['device_type']}`, plugin `{b['plugin']}`) |",
        f"| distribution | {b['distribution']} {b['version']} |",
        f"| device | {b['device_name']} |",
        f"| dtypes | {', '.join(report['dtypes']) or '-'} |",
        f"| ampcore / torch / suite | {report['ampcore']} / {report['torch']} / {report['suite']['version']} |",
        f"| result | exit status {report['exit_status']}: "
        + ", ".join(f"{n} {k}" for k, n in report["summary"].items() if n)
        + f" in {report['duration_s']} s |",
    ]
    if report["problem"]:
        lines += ["", f"**The suite could not run:** {report['problem']}"]
    if report["manifest"]["unmatched"]:
        lines += [
            "",
            "**Stale manifest entries (match no test):** "
            + ", ".join(f"`{p}`" for p in report["manifest"]["unmatched"]),
        ]
    lines += ["", "| test | dtype | outcome | duration (s) | note |", "|---|---|---|---|---|"]
    for t in report["tests"]:
        note = (t["message"] or "").replace("|", "\\|")
        lines.append(f"| `{t['name']}` | {t['dtype'] or '-'} | {t['outcome']} | {t['duration_s']:.3f} | {note} |")
    if report["speed"]:
        lines += _speed_lines(report["speed"])
    return "\n".join(lines) + "\n"


def summarize_speed(fp32: list[float], low: list[float]) -> dict[str, Any]:
    """The report's numbers from per-round times: medians, ranges and the speed-up's spread.

    Example::

        >>> s = summarize_speed([0.002, 0.004, 0.002], [0.001, 0.001, 0.004])
        >>> s["speedup"], s["speedup_min"], s["speedup_max"], s["reliable"]
        (2.0, 0.5, 4.0, False)
    """
    ratios = [f / low_ for f, low_ in zip(fp32, low, strict=True)]
    spread = max(ratios) / min(ratios)
    return {
        "fp32_ms": round(statistics.median(fp32) * 1e3, 4),
        "fp32_ms_range": [round(min(fp32) * 1e3, 4), round(max(fp32) * 1e3, 4)],
        "autocast_ms": round(statistics.median(low) * 1e3, 4),
        "autocast_ms_range": [round(min(low) * 1e3, 4), round(max(low) * 1e3, 4)],
        "speedup": round(statistics.median(ratios), 3),
        "speedup_min": round(min(ratios), 3),
        "speedup_max": round(max(ratios), 3),
        "reliable": spread <= UNRELIABLE_SPREAD,
    }


def _peak(value: Any) -> str:
    return "unavailable" if value is None else f"{value:g}"


def _speed_lines(speed: dict[str, dict[str, Any]]) -> list[str]:
    """The informative speed section: medians with ranges, and a flag on unreliable runs."""
    lines = [
        "", "## Speed (informative: measured, never asserted)", "",
        "Median step time over interleaved rounds, its range in brackets; the speed-up is the median of the",
        "rounds' fp32/autocast ratios with their range. Peak memory: growth of the backend's peak use during",
        "one step (`unavailable` where the backend does not measure it).", "",
        "| dtype | workload | fp32 ms | autocast ms | speed-up | peak growth MiB fp32 / autocast |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for dtype, s in speed.items():
        fp32, low = s["fp32_ms_range"], s["autocast_ms_range"]
        flag = "" if s["reliable"] else " **unreliable: the rounds disagree (busy machine?)**"
        lines.append(
            f"| {dtype} | {s['workload']} | {s['fp32_ms']:.3f} [{fp32[0]:.3f}-{fp32[1]:.3f}] "
            f"| {s['autocast_ms']:.3f} [{low[0]:.3f}-{low[1]:.3f}] "
            f"| {s['speedup']:.2f}x [{s['speedup_min']:.2f}-{s['speedup_max']:.2f}x]{flag} "
            f"| {_peak(s['fp32_peak_growth_mib'])} / {_peak(s['autocast_peak_growth_mib'])} |"
        )
    return lines


def write_reports(directory: Path, report: dict[str, Any]) -> list[Path]:
    """Write ``report.json`` and ``report.md`` into ``directory``; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / JSON_NAME, directory / MARKDOWN_NAME
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    return [json_path, md_path]
