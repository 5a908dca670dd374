"""Issue 28: every warning ampcore issues from a public entry point points at the caller's
line (its ``filename`` is this file), however deep inside ampcore it starts
(``ampcore._errors.warn_user``).  decorate's capability warning used to point one frame short,
at ampcore's own line."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore import CapabilityIssue


@pytest.fixture
def slow() -> Iterator[str]:
    """A backend on the CPU whose capability check warns for every dtype."""
    check = lambda dtype: [CapabilityIssue("warning", f"slow {dtype} here")]  # noqa: E731
    name = "slowcap"
    ampcore.register_plugin(
        make_adapter(name, dtypes=(torch.bfloat16, torch.float16), ampcore_check_capability=check), name=name
    )
    yield name
    ampcore.unregister_plugin(name)


def _caught(call: Callable[[], object]) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, ampcore.AmpcoreWarning)]


def test_decorates_capability_warning_points_at_the_caller(slow: str) -> None:
    (warning,) = _caught(
        lambda: ampcore.decorate(
            torch.nn.Linear(2, 2), level="O2", dtype=torch.float16, device=slow, master_weight=False
        )
    )
    assert "slow torch.float16 here" in str(warning.message)
    assert warning.filename == __file__, warning.filename


def test_autocasts_capability_warning_points_at_the_caller(slow: str) -> None:
    def enter() -> None:
        with ampcore.autocast(device=slow, dtype=torch.bfloat16):
            pass

    (warning,) = _caught(enter)
    assert warning.filename == __file__, warning.filename


def test_compare_accuracys_train_mode_warning_points_at_the_caller() -> None:
    model = torch.nn.Linear(4, 4)  # in train mode
    found = _caught(lambda: ampcore.debugging.compare_accuracy(model, torch.randn(2, 4), device="cpu"))
    assert found and all(w.filename == __file__ for w in found), [(w.filename, str(w.message)) for w in found]


def test_a_plugin_warning_without_a_file_points_at_the_caller() -> None:
    from ampcore._errors import warn_at

    (warning,) = _caught(lambda: warn_at("no file known", ampcore.AmpcoreWarning, None))
    assert warning.filename == __file__
