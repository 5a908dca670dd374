"""``ConformanceSession``: the per-run pytest hooks (registered by the plugin at configure).

It generates the cases, applies the manifest, turns "no device" into an explicit failure,
records every test's outcome and duration, and writes the JSON and markdown reports.
All state lives on the instance, one per pytest run.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, Final

import pytest
import torch

import ampcore
from ampcore_conformance import SUITE_VERSION
from ampcore_conformance._context import SuiteContext, dtype_name
from ampcore_conformance._lists import category, required_ops
from ampcore_conformance._op_samples import SAMPLES, OpSample
from ampcore_conformance._reports import TestRecord, build_report, write_reports

__all__ = ["AVAILABILITY_TEST", "ConformanceSession", "ConformanceWarning"]

#: The check that carries the failure when the backend is unknown or has no device.
AVAILABILITY_TEST: Final = "test_backend_is_available"
#: Marker categories whose ops come from torch's table for the device type (``required_ops``).
_REQUIRED: Final = ("required_white", "required_black")
_RAN: Final = ("passed", "xpassed", "failed", "error")
#: Check modules from the most basic to the most composite (the run order, and the report's).
MODULE_ORDER: Final = (
    "test_registration", "test_dtypes", "test_op_lists", "test_regions", "test_custom_lists",
    "test_levels", "test_scaler", "test_overflow", "test_decorate", "test_convergence", "test_speed",
)  # fmt: skip


class ConformanceWarning(ampcore.AmpcoreWarning):
    """Something about the run the vendor should fix (e.g. a stale manifest entry)."""


def _names(item: pytest.Item) -> tuple[str, ...]:
    """The ways a manifest may name ``item``."""
    module = Path(str(item.path)).name
    return (item.name, getattr(item, "originalname", item.name), f"{module}::{item.name}")


def _param(item: pytest.Item, key: str) -> Any:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(key) if callspec is not None else None


class ConformanceSession:
    """The hooks of one conformance run over ``context``."""

    def __init__(self, context: SuiteContext) -> None:
        self.context = context
        self.started = time.time()
        self.records: dict[str, TestRecord] = {}
        self.unmatched: list[str] = []
        self.written: list[Path] = []

    # -- collection --------------------------------------------------------------------
    def pytest_report_header(self) -> list[str]:
        c, b = self.context, self.context.backend
        origin = f"{b.distribution} {b.version}" if b else "not installed"
        return [
            f"ampcore conformance {SUITE_VERSION}: backend {c.backend_name!r} ({origin}), dtypes "
            f"{', '.join(dtype_name(d) for d in c.dtypes) or '-'}, "
            f"ampcore {ampcore.__version__}, torch {torch.__version__}",
            f"device: {c.device_name() or c.problem}",
        ]

    def _ops_for(self, wanted: str, dtype: torch.dtype, level: str) -> list[str]:
        if wanted in _REQUIRED:
            backend = self.context.backend
            return [op for op in required_ops(backend.device_type, wanted) if op in SAMPLES] if backend else []
        if wanted == "all":
            return sorted(SAMPLES)
        try:
            lists = self.context.lists(dtype, level)
        except Exception:  # failed by test_op_lists_are_valid with the adapter's error
            return []
        return sorted(op for op in SAMPLES if category(lists, op) == wanted)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        context = self.context
        dtypes = context.dtypes if context.usable else ()
        if "amp_op" in metafunc.fixturenames:
            marker = metafunc.definition.get_closest_marker("ampcore_ops")
            wanted = str(marker.args[0]) if marker else "white"
            level = str(marker.kwargs.get("level", "O1")) if marker else "O1"
            params = [
                pytest.param(dtype, SAMPLES[op], id=f"{dtype_name(dtype)}-{op}")
                for dtype in dtypes
                for op in self._ops_for(wanted, dtype, level)
            ]
            if not params:
                reason = f"no op of backend {context.backend_name!r}'s {wanted} list has a sample in the suite"
                params = [pytest.param(None, None, id="none", marks=pytest.mark.skip(reason=reason))]
            metafunc.parametrize(("amp_dtype", "amp_op"), params)
        elif "amp_dtype" in metafunc.fixturenames:
            metafunc.parametrize("amp_dtype", list(dtypes) or [None], ids=lambda d: dtype_name(d) if d else "none")

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        rank = {name: i for i, name in enumerate(MODULE_ORDER)}
        items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: keeps order within a module
        self._apply_manifest(items)
        if not self.context.usable:
            kept = [item for item in items if getattr(item, "originalname", item.name) == AVAILABILITY_TEST]
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept
        for item in items:
            dtype, op = _param(item, "amp_dtype"), _param(item, "amp_op")
            self.records[item.nodeid] = TestRecord(
                item.nodeid,
                item.name,
                dtype_name(dtype) if isinstance(dtype, torch.dtype) else None,
                op.name if isinstance(op, OpSample) else None,
            )

    def _apply_manifest(self, items: list[pytest.Item]) -> None:
        manifest = self.context.manifest
        matched: set[str] = set()
        for item in items:
            entry = manifest.find(_names(item))
            if entry is None:
                continue
            matched.add(entry.pattern)
            reason = f"manifest: {entry.reason}"
            strict_xfail = pytest.mark.xfail(reason=reason, strict=True)
            item.add_marker(pytest.mark.skip(reason=reason) if entry.action == "skip" else strict_xfail)
        for entry in manifest.entries:
            if entry.pattern not in matched and not any(entry.matches(_names(i)) for i in items):
                self.unmatched.append(entry.pattern)
                warnings.warn(
                    f"manifest {manifest.path}: [{entry.action}] entry {entry.pattern!r} matches no test of "
                    "the suite (a stale entry?)",
                    ConformanceWarning,
                    stacklevel=1,
                )

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            self.records.pop(item.nodeid, None)

    # -- running and reporting ---------------------------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = self.records.get(report.nodeid)
        if record is not None:
            record.update(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        records = list(self.records.values())
        if session.exitstatus == 0 and (self.context.problem or not self._any_passed()):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # zero checks passing never reads as green
        if self.context.report_dir is not None:
            report = build_report(self.context, records, int(session.exitstatus), self.started, self.unmatched)
            self.written = write_reports(self.context.report_dir, report)

    def _any_passed(self) -> bool:
        return any(record.outcome == "passed" for record in self.records.values())

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        write = terminalreporter.write_line
        terminalreporter.section("ampcore conformance")
        if self.context.problem:
            write(f"FAILED: {self.context.problem}", red=True)
        elif not self._any_passed():
            write("FAILED: no conformance check passed (all were skipped, deselected or failed)", red=True)
        else:
            counts = {o: sum(r.outcome == o for r in self.records.values()) for o in (*_RAN, "skipped", "xfailed")}
            write(
                "backend "
                + repr(self.context.backend_name)
                + ": "
                + ", ".join(f"{n} {o}" for o, n in counts.items() if n)
            )
        for pattern in self.unmatched:
            write(f"warning: manifest entry {pattern!r} matches no test", yellow=True)
        xml = getattr(config.option, "xmlpath", None)
        for path in [*self.written, *([Path(xml)] if xml else [])]:
            write(f"report: {path}")
