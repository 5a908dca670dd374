"""The pytest plugin that turns the suite's checks into a conformance run for one backend.

Load it with ``-p ampcore_conformance.plugin`` (``ampcore conformance`` does).  It adds
``--ampcore-backend``, ``--ampcore-dtype`` (repeatable; default: every declared dtype),
``--ampcore-manifest`` and ``--ampcore-report-dir``; generates cases over (check x dtype)
and (op x dtype); applies the vendor manifest; fails explicitly when the backend is
unknown or has no device; and writes the reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("ampcore_conformance._checks")  # detailed messages from shared checks

import torch  # noqa: E402

import ampcore  # noqa: E402
from ampcore_conformance import SUITE_VERSION  # noqa: E402
from ampcore_conformance._checks import white_ops  # noqa: E402
from ampcore_conformance._context import SuiteContext, UsageProblem, build_context  # noqa: E402
from ampcore_conformance._manifest import ManifestError, Tolerances, load_manifest  # noqa: E402
from ampcore_conformance._op_samples import OpSample  # noqa: E402
from ampcore_conformance._reports import JUNIT_NAME  # noqa: E402
from ampcore_conformance._session import AVAILABILITY_TEST, ConformanceSession, ConformanceWarning  # noqa: E402

__all__ = ["AVAILABILITY_TEST", "ConformanceSession", "ConformanceWarning"]

_CONTEXT = pytest.StashKey[SuiteContext]()
_SESSION = pytest.StashKey[ConformanceSession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ampcore", "ampcore conformance suite")
    group.addoption("--ampcore-backend", metavar="NAME", help="the backend under test (required)")
    group.addoption(
        "--ampcore-dtype", action="append", default=[], metavar="DTYPE",
        help="a low-precision dtype to test (repeatable); default: every dtype the backend declares",
    )  # fmt: skip
    group.addoption("--ampcore-manifest", metavar="FILE", help="vendor manifest (TOML or JSON) of skips and xfails")
    group.addoption("--ampcore-report-dir", metavar="DIR", help="write junit.xml, report.json and report.md here")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ampcore_ops(category, level='O1'): parametrize over the sample ops of a list category (or 'all')"
    )
    name = config.getoption("ampcore_backend")
    if not name:
        if config.getoption("help", False):
            return
        known = ", ".join(b.name for b in ampcore.list_backends()) or "none"
        raise pytest.UsageError(
            f"the ampcore conformance suite needs --ampcore-backend NAME; installed backends: {known}"
        )
    report_dir = config.getoption("ampcore_report_dir")
    try:
        manifest = load_manifest(config.getoption("ampcore_manifest"))
        context = build_context(
            name, config.getoption("ampcore_dtype"), manifest, Path(report_dir) if report_dir else None
        )
    except (ManifestError, UsageProblem) as exc:
        raise pytest.UsageError(str(exc)) from exc
    config.stash[_CONTEXT] = context
    session = config.stash[_SESSION] = ConformanceSession(context)
    config.pluginmanager.register(session, "ampcore-conformance-session")
    if context.report_dir is not None and not getattr(config.option, "xmlpath", None):
        config.option.xmlpath = str(context.report_dir / JUNIT_NAME)


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def amp_context(pytestconfig: pytest.Config) -> SuiteContext:
    """The run's :class:`SuiteContext`."""
    return pytestconfig.stash[_CONTEXT]


@pytest.fixture(scope="session")
def amp_backend(amp_context: SuiteContext) -> ampcore.Backend:
    """The backend under test (the test fails with the session's problem when unusable)."""
    return amp_context.require_backend()


@pytest.fixture(scope="session")
def amp_device(amp_context: SuiteContext) -> torch.device:
    """The torch device the backend drives."""
    return amp_context.device


@pytest.fixture(scope="session")
def amp_white_ops(amp_context: SuiteContext) -> list[OpSample]:
    """Sample ops on the white list for every dtype under test (the first is the region probe)."""
    return white_ops([amp_context.lists(dtype) for dtype in amp_context.dtypes])


@pytest.fixture(scope="session")
def amp_tolerances(amp_context: SuiteContext) -> Tolerances:
    """Tolerances (defaults, or the manifest's ``[tolerances]``)."""
    return amp_context.tolerances


@pytest.fixture(scope="session", autouse=True)
def _junit_properties(
    amp_context: SuiteContext, record_testsuite_property: Callable[[str, object], None]
) -> Iterator[None]:
    backend = amp_context.backend
    for key, value in (
        ("ampcore_backend", amp_context.backend_name),
        ("ampcore_distribution", backend.distribution if backend else None),
        ("ampcore_distribution_version", backend.version if backend else None),
        ("ampcore_version", ampcore.__version__),
        ("torch_version", torch.__version__),
        ("suite_version", SUITE_VERSION),
        ("device_name", amp_context.device_name()),
    ):
        record_testsuite_property(key, str(value))
    yield
