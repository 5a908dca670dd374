"""Unit tests of the template's pure functions and hooks (no device needed)."""

from __future__ import annotations

import pytest
import torch
from ampcore_acme import plugin


@pytest.mark.parametrize("mode", ["none", "fallthrough", "generic"])
def test_modes_without_differences_declare_none(mode: str) -> None:
    assert plugin.adjustments_for(mode, torch.bfloat16) is None


def test_partial_kernels_are_declared() -> None:
    assert plugin.adjustments_for("partial", torch.float16) == {"black": ["dot"]}


def test_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.AUTOCAST_ENV, "partial")
    assert plugin.autocast_mode() == "partial"
    monkeypatch.delenv(plugin.AUTOCAST_ENV)
    assert plugin.autocast_mode() == "none"
