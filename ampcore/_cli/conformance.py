"""``ampcore conformance``: run the vendor conformance suite against one installed backend.

The suite is the ``ampcore_conformance`` package, run by pytest with its plugin; this
command only builds the pytest command line.  pytest is needed by this command alone (the
core depends on torch and pluggy only): ``pip install 'ampcore[conformance]'``.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from .._backends.registry import get_backend
from .._dtypes import parse_declared_dtype
from .._errors import AmpcoreError

__all__ = ["add_parser", "pytest_arguments"]

SUITE_PACKAGE: Final = "ampcore_conformance"
_INSTALL_HINT: Final = "install pytest (pip install 'ampcore[conformance]', or pip install 'ampcore[test]')"


def _suite_dir() -> Path:
    spec = importlib.util.find_spec(SUITE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AmpcoreError(
            f"ampcore conformance: the suite package {SUITE_PACKAGE!r} is not installed; reinstall ampcore"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def pytest_arguments(
    backend: str,
    dtypes: Sequence[str] = (),
    report_dir: str | Path | None = None,
    manifest: str | Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The pytest command line that runs the suite (also usable as ``pytest <args>``).

    Example::

        >>> args = pytest_arguments("cpu", ["bfloat16"], report_dir="out")
        >>> args[:5]
        ['--pyargs', 'ampcore_conformance', '-p', 'ampcore_conformance.plugin', '-p']
        >>> args[args.index("--ampcore-dtype") + 1]
        'bfloat16'
    """
    suite = _suite_dir()
    args = [
        "--pyargs", SUITE_PACKAGE,
        "-p", f"{SUITE_PACKAGE}.plugin",
        "-p", "no:cacheprovider",
        "-c", str(suite / "data" / "pytest.ini"),
        "--rootdir", str(suite),
        "--ampcore-backend", backend,
    ]  # fmt: skip
    for dtype in dtypes:
        args += ["--ampcore-dtype", dtype]
    if report_dir is not None:
        args += ["--ampcore-report-dir", str(Path(report_dir).resolve())]
    if manifest is not None:
        args += ["--ampcore-manifest", str(Path(manifest).resolve())]
    return [*args, *extra]


def _check_selection(name: str, dtypes: Sequence[str]) -> None:
    """Refuse an unknown backend (did-you-mean) and dtypes it does not declare, naming the
    options as typed.  A known backend without a device still runs: the suite reports that
    as an explicit failure."""
    try:
        backend = get_backend(name)
    except AmpcoreError as exc:
        raise AmpcoreError(f"--backend {name}: {str(exc).removeprefix(f'device={name!r}: ')}") from None
    for dtype in dtypes:
        parse_declared_dtype(dtype, backend.supported_dtypes, f"backend {backend.name!r}", "", "--dtype")


def _run(args: argparse.Namespace) -> int:
    try:
        import pytest
    except ImportError:
        raise AmpcoreError(f"the conformance suite runs on pytest, which is not installed: {_INSTALL_HINT}") from None
    _check_selection(args.backend, args.dtype)  # before pytest runs or a report folder appears
    extra = list(args.pytest_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    report_dir = args.report_dir or f"ampcore-conformance-{args.backend}"
    command = pytest_arguments(args.backend, args.dtype, report_dir, args.manifest, extra)
    return int(pytest.main(command))


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "conformance",
        help="run the vendor conformance suite against a backend",
        description=(
            "Run ampcore's conformance suite against an installed backend and write junit.xml, report.json "
            "and report.md. Exit status 0 only when no selected check failed (the manifest may waive some) "
            "and at least one passed. Arguments after `--` go to pytest (e.g. -- -k scaler -x)."
        ),
    )
    parser.add_argument("--backend", required=True, metavar="NAME", help="backend to test (see `ampcore info`)")
    parser.add_argument(
        "--dtype", action="append", default=[], metavar="DTYPE",
        help="dtype to test (repeatable; default: every dtype the backend declares)",
    )  # fmt: skip
    parser.add_argument(
        "--report-dir", metavar="DIR", help="where the reports go (default: ./ampcore-conformance-<backend>)"
    )
    parser.add_argument("--manifest", metavar="FILE", help="vendor manifest (TOML or JSON) of skips and xfails")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=_run)
