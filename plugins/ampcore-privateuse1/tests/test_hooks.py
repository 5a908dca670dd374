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


def test_fp16_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.FP16_ENV, "saturate")
    assert plugin.fp16_mode() == "saturate"
    monkeypatch.delenv(plugin.FP16_ENV)
    assert plugin.fp16_mode() == "ieee"


def test_the_capability_check_refuses_what_the_chip_does_not_list() -> None:
    (issue,) = plugin.capability_issues(torch.bfloat16, [torch.float16], "acme:0")
    assert issue.severity == "error" and "torch.bfloat16" in issue.message and "acme:0" in issue.message
    assert plugin.capability_issues(torch.float16, [torch.float16, torch.bfloat16], "acme:0") == []


def test_an_ieee_chip_needs_no_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.FP16_ENV, "ieee")
    assert plugin.ampcore_device_overflow_flag(torch.device("cpu")) is None
    plugin.ampcore_clear_device_overflow_flag(torch.device("cpu"))  # nothing to clear, no device touched
