"""Shared fixture of the level-auto tests: a private plan cache, and no plans or roots
carried from one test to the next."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import ampcore
from ampcore._auto import _hooks, _kernel, _roots, _roots_kernel
from ampcore._auto._cache import forget_plans


@pytest.fixture
def auto_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A plan cache under ``tmp_path``, plans and roots forgotten before and after, ampcore's
    warnings (measurement notes) silenced, and the adapter's load not asked (the machine's
    load must not decide what a test sees: tests that need a load set ``_hooks.load_of``)."""
    monkeypatch.setenv("AMPCORE_AUTO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_hooks, "load_of", lambda region: None)
    _kernel.start(_roots_kernel.use_compiled)  # the settled path of this run: known from the first test
    _kernel.wait()
    forget_plans()
    _roots.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ampcore.AmpcoreWarning)
        yield
    forget_plans()
    _roots.forget()


def compiled_in_use() -> bool:
    """Whether auto's settled root calls take the compiled path (``ampcore._auto._kernel``)."""
    return _roots._hooks_now.pre is not _roots._sentinel


@pytest.fixture(params=["python", "compiled"])
def settled_path(request: pytest.FixtureRequest, auto_state: None) -> Iterator[str]:
    """The test once with the Python settled path, once with the compiled one (skipped in a
    run where it is not in use: ``AMPCORE_AUTO_KERNEL=python``, no compiler)."""
    kept = _roots_kernel.paths()
    if request.param == "python":
        _roots_kernel.use_python()
    elif not compiled_in_use():
        pytest.skip(f"the compiled settled path is not in use in this run: {_kernel.describe()}")
    yield str(request.param)
    _roots_kernel.use_paths(kept)
