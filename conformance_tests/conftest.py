"""Refuse to run the checks without the suite's plugin (they would fail on missing fixtures)."""

from __future__ import annotations

import pytest

_USAGE = (
    "the ampcore conformance suite runs through its plugin: `ampcore conformance --backend NAME`, or "
    "`pytest -p ampcore_conformance.plugin --pyargs ampcore_conformance --ampcore-backend NAME`"
)


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("ampcore_conformance.plugin"):
        raise pytest.UsageError(_USAGE)
