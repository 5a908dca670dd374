"""GradScaler's watch for a collapsing loss scale: every step skipped, whatever the scale."""

from __future__ import annotations

import warnings

import pytest
import torch

import ampcore


def overflowing_step(scaler: ampcore.GradScaler, opt: torch.optim.Optimizer, p: torch.nn.Parameter) -> None:
    """An iteration whose gradient overflows at every scale (an op that overflows by itself)."""
    opt.zero_grad()
    scaler.scale((p * float("inf")).sum()).backward()
    scaler.step(opt)
    scaler.update()


def clean_step(scaler: ampcore.GradScaler, opt: torch.optim.Optimizer, p: torch.nn.Parameter) -> None:
    opt.zero_grad()
    scaler.scale(p.sum()).backward()
    scaler.step(opt)
    scaler.update()


def setup(**kwargs: object) -> tuple[ampcore.GradScaler, torch.optim.Optimizer, torch.nn.Parameter]:
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    return ampcore.GradScaler("cpu", dtype=torch.float16, **kwargs), opt, p  # type: ignore[arg-type]


def test_a_collapsing_scale_warns_once_with_a_hint_at_the_op() -> None:
    scaler, opt, p = setup(collapse_patience=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            overflowing_step(scaler, opt, p)
        assert not [w for w in caught if issubclass(w.category, ampcore.LossScaleCollapseWarning)]
        for _ in range(6):
            overflowing_step(scaler, opt, p)
    found = [w for w in caught if issubclass(w.category, ampcore.LossScaleCollapseWarning)]
    assert len(found) == 1  # once per run of skips
    message = str(found[0].message)
    assert "last 5 steps were all skipped" in message and "fell to 2048" in message
    assert "check_numerics" in message and "register_fp32_module" in message
    assert found[0].filename == __file__  # points at the caller's update()


def test_a_clean_step_resets_the_count() -> None:
    scaler, opt, p = setup(collapse_patience=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.LossScaleCollapseWarning)
        for _ in range(3):
            overflowing_step(scaler, opt, p)
            overflowing_step(scaler, opt, p)
            clean_step(scaler, opt, p)
    with pytest.warns(ampcore.LossScaleCollapseWarning):
        for _ in range(3):
            overflowing_step(scaler, opt, p)


def test_on_collapse_raise_raises_loss_scale_at_minimum_error() -> None:
    scaler, opt, p = setup(collapse_patience=2, on_collapse="raise")
    overflowing_step(scaler, opt, p)
    with pytest.raises(ampcore.LossScaleAtMinimumError, match="on_collapse='raise'"):
        overflowing_step(scaler, opt, p)


def test_the_watch_can_be_turned_off_and_bad_values_are_refused() -> None:
    scaler, opt, p = setup(collapse_patience=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.LossScaleCollapseWarning)
        for _ in range(12):
            overflowing_step(scaler, opt, p)
    with pytest.raises(ampcore.AmpcoreError, match="collapse_patience=0"):
        setup(collapse_patience=0)
    with pytest.raises(ampcore.AmpcoreError, match="on_collapse='ignore'.*'warn', 'raise'"):
        setup(on_collapse="ignore")


def test_a_bfloat16_scaler_that_does_not_scale_warns_without_a_scale() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = ampcore.GradScaler("cpu", dtype=torch.bfloat16, collapse_patience=2)
    with pytest.warns(ampcore.LossScaleCollapseWarning) as record:
        for _ in range(2):
            overflowing_step(scaler, opt, p)
    assert "fell to" not in str(record[0].message)
