"""GradScaler settings: validation, Paddle's aliases, getters and setters."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ampcore

INF = float("inf")


INVALID: list[dict[str, Any]] = [
    {"growth_factor": 1.0},
    {"growth_factor": 0.5},
    {"backoff_factor": 1.0},
    {"backoff_factor": 0.0},
    {"backoff_factor": 1.5},
    {"growth_interval": 0},
    {"growth_interval": 2.5},
    {"hysteresis": 0},
    {"hysteresis": True},
    {"min_scale": 10.0, "max_scale": 5.0, "init_scale": 7.0},
    {"init_scale": 0.0},
    {"init_scale": INF},
    {"init_scale": 2.0**30},
    {"min_scale": -1.0},
    {"dynamic": "yes"},
    {"enabled": 1},
    {"raise_at_min_scale": True},
    {"dtype": "float8"},  # names are accepted (issue 14); an unknown one is not
    {"dtype": torch.float64},
]


@pytest.mark.parametrize("kwargs", INVALID, ids=[",".join(k) for k in INVALID])
def test_invalid_settings_raise_ampcore_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ampcore.AmpcoreError, match="ampcore.GradScaler"):
        ampcore.GradScaler("cpu", **kwargs)


def test_paddle_aliases_and_conflicts() -> None:
    scaler = ampcore.GradScaler(
        "cpu",
        enabled=True,
        init_loss_scaling=128.0,
        incr_ratio=4.0,
        decr_ratio=0.25,
        incr_every_n_steps=7,
        decr_every_n_nan_or_inf=3,
        use_dynamic_loss_scaling=True,
    )
    assert (scaler.get_scale(), scaler.get_growth_factor(), scaler.get_backoff_factor()) == (128.0, 4.0, 0.25)
    assert (scaler.get_growth_interval(), scaler.get_hysteresis()) == (7, 3)
    with pytest.raises(ampcore.AmpcoreError, match="'hysteresis' was given twice.*decr_every_n_nan_or_inf"):
        ampcore.GradScaler("cpu", hysteresis=1, decr_every_n_nan_or_inf=1)  # even when equal
    with pytest.raises(ampcore.AmpcoreError, match="did you mean 'incr_ratio'"):
        ampcore.GradScaler("cpu", incr_ration=2.0)


def test_setters_validate_and_leave_the_setting_unchanged() -> None:
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, growth_interval=5)
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.25)
    with pytest.raises(ampcore.AmpcoreError, match="growth factor must be > 1.0"):
        scaler.set_growth_factor(1.0)
    with pytest.raises(ampcore.AmpcoreError, match="backoff factor"):
        scaler.set_backoff_factor(2.0)
    with pytest.raises(ampcore.AmpcoreError, match="hysteresis"):
        scaler.set_hysteresis(0)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_hysteresis()) == (3.0, 0.25, 1)
    assert (scaler.get_min_scale(), scaler.get_max_scale()) == (None, 2.0**24)


def test_lowering_the_growth_interval_grows_at_the_next_clean_step() -> None:
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, init_scale=8.0, growth_interval=10)
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.1)

    def clean_step() -> None:
        p.grad = scaler.scale(torch.ones(1))
        scaler.step(opt)
        scaler.update()

    for _ in range(5):
        clean_step()
    scaler.set_growth_interval(3)
    clean_step()
    assert scaler.get_scale() == 16.0


def test_lowering_the_hysteresis_backs_off_at_the_next_overflow() -> None:
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, init_scale=8.0, hysteresis=3)
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.1)

    def overflow_step() -> None:
        p.grad = scaler.scale(torch.full((1,), INF))
        scaler.step(opt)
        scaler.update()

    overflow_step()
    overflow_step()
    assert scaler.get_scale() == 8.0 and scaler.state_dict()["_overflow_tracker"] == 2
    scaler.set_hysteresis(2)
    assert scaler.state_dict()["_overflow_tracker"] == 1
    overflow_step()
    assert scaler.get_scale() == 4.0 and scaler.state_dict()["_overflow_tracker"] == 0
