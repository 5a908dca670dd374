"""GradScaler under bad input (issue 12): non-finite ``new_scale`` tensors, objects that are
no optimizer, and failed calls that must leave the scaler as it was."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import ampcore


def _scaler(**kwargs: object) -> ampcore.GradScaler:
    return ampcore.GradScaler("cpu", enabled=True, init_scale=1024.0, **kwargs)  # type: ignore[arg-type]


def _stepped(scaler: ampcore.GradScaler) -> tuple[torch.nn.Linear, torch.optim.SGD]:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(opt)
    return model, opt


@pytest.mark.parametrize("bounds", [{"min_scale": 1.0, "max_scale": 2.0**20}, {"min_scale": None, "max_scale": None}])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), -4.0, 0.0])
def test_update_with_an_invalid_tensor_scale_keeps_the_scale(bounds: dict[str, float | None], bad: float) -> None:
    scaler = _scaler(**bounds)
    _stepped(scaler)
    scaler.update(new_scale=torch.tensor(bad))
    assert scaler.get_scale() == 1024.0
    state = scaler.state_dict()
    _scaler(**bounds).load_state_dict(state)  # its own state dict is always loadable


def test_update_with_an_infinite_tensor_scale_clamps_to_max_scale() -> None:
    scaler = _scaler(max_scale=2.0**20)
    _stepped(scaler)
    scaler.update(new_scale=torch.tensor(float("inf")))
    assert scaler.get_scale() == 2.0**20


def test_update_with_a_tensor_scale_in_bounds_is_taken_and_clamped() -> None:
    scaler = _scaler(min_scale=2.0, max_scale=4096.0)
    _stepped(scaler)
    scaler.update(new_scale=torch.tensor(8192.0))
    assert scaler.get_scale() == 4096.0
    _stepped(scaler)
    scaler.update(new_scale=torch.tensor(0.5))
    assert scaler.get_scale() == 2.0
    _stepped(scaler)
    scaler.update(new_scale=torch.tensor(64.0, dtype=torch.float64))
    assert scaler.get_scale() == 64.0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "2", None])
def test_update_with_an_invalid_float_scale_raises_and_keeps_the_iteration(value: object) -> None:
    scaler = _scaler()
    _stepped(scaler)
    if value is None:
        scaler.update(None)  # the ordinary update
        return
    with pytest.raises(ampcore.AmpcoreError, match="new_scale"):
        scaler.update(new_scale=value)  # type: ignore[arg-type]
    scaler.update()  # the iteration's records are still there: a normal update works
    assert scaler.get_scale() == 1024.0


@pytest.mark.parametrize("call", ["step", "unscale_"])
@pytest.mark.parametrize("not_an_optimizer", [torch.nn.Linear(2, 1), None, "sgd", [torch.nn.Parameter(torch.ones(1))]])
def test_step_or_unscale_of_a_non_optimizer_is_a_clear_error(call: str, not_an_optimizer: object) -> None:
    scaler = _scaler()
    scaler.scale(torch.ones((), requires_grad=True))
    with pytest.raises(ampcore.AmpcoreError, match=rf"GradScaler.{call}\(optimizer=.*expected a torch.optim.Optimizer"):
        getattr(scaler, call)(not_an_optimizer)
    copy.deepcopy(scaler)  # no half-made record blocks copies
    pickle.loads(pickle.dumps(scaler))


def test_failed_step_leaves_no_record_blocking_a_copy() -> None:
    scaler = _scaler()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ampcore.AmpcoreError):
        scaler.step(opt)  # no scale() yet
    with pytest.raises(ampcore.AmpcoreError, match="Closure"):
        scaler.step(opt, closure=lambda: None)
    copy.deepcopy(scaler)


def test_fp16_gradients_refused_by_unscale_leave_no_record() -> None:
    scaler = _scaler()
    param = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    opt = torch.optim.SGD([param], lr=0.1)
    param.grad = torch.ones(2, dtype=torch.float16)
    scaler.scale(torch.ones(()))
    with pytest.raises(ampcore.AmpcoreError, match="FP16"):
        scaler.step(opt)
    copy.deepcopy(scaler)
    with pytest.raises(ampcore.AmpcoreError, match="No inf checks"):
        scaler.update()


# -- issue 28, rows 8 and 9: numbers beyond what the scaler's tensors hold ----------------

#: (parameter, value, words of the message): refused up front, naming the parameter
HUGE_SETTINGS = [
    ("growth_interval", 10**20, "expected an int in [1, 2147483647]"),
    ("hysteresis", 10**20, "expected an int in [1, 2147483647]"),
    ("growth_interval", 2**31, "expected an int in [1, 2147483647]"),
    ("init_scale", 10**400, "init_scale=<a number too large for a float>"),
    ("init_scale", 1e39, "positive finite number up to 3.40282e+38"),  # beyond float32: the scale tensor would hold inf
    ("growth_factor", 10**400, "growth_factor=<a number too large for a float>"),
    ("backoff_factor", -(10**400), "backoff_factor=<a number too large for a float>"),
    ("min_scale", 10**400, "min_scale=<a number too large for a float>"),
    ("max_scale", 10**400, "max_scale=<a number too large for a float>"),
    ("growth_factor", float("inf"), "growth_factor=inf"),
]


@pytest.mark.parametrize(("name", "value", "words"), HUGE_SETTINGS)
def test_settings_too_large_for_the_scalers_tensors_are_refused_up_front(name: str, value: object, words: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=rf"ampcore\.GradScaler\({name}=") as info:
        ampcore.GradScaler("cpu", dtype=torch.float16, **{name: value})  # type: ignore[arg-type]
    assert words in str(info.value)


@pytest.mark.parametrize("name", ["growth_interval", "hysteresis"])
def test_the_largest_counter_limit_works_and_never_sticks(name: str) -> None:
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, **{name: 2**31 - 1})  # type: ignore[arg-type]
    for _ in range(2):
        _stepped(scaler)
        scaler.update()  # OverflowError here left the scaler stuck ("step() has already been called")
    assert scaler.get_scale() == 65536.0


@pytest.mark.parametrize("value", [10**400, float("nan"), "2", True, 1e400])
def test_set_growth_factor_refuses_numbers_a_float_cannot_hold(value: object) -> None:
    scaler = _scaler()
    with pytest.raises(ampcore.AmpcoreError, match=r"set_growth_factor\(growth_factor="):
        scaler.set_growth_factor(value)  # type: ignore[arg-type]
    assert scaler.get_growth_factor() == 2.0


@pytest.mark.parametrize(
    ("key", "value"),
    [("growth_interval", 10**30), ("hysteresis", 10**30), ("scale", 10**400), ("scale", 1e39), ("max_scale", 10**400)],
)
def test_a_state_dict_with_huge_numbers_is_refused_and_changes_nothing(key: str, value: object) -> None:
    scaler = _scaler()
    state = scaler.state_dict()
    with pytest.raises(ampcore.AmpcoreError, match=rf"load_state_dict\({key}=.*left unchanged"):
        scaler.load_state_dict({**state, key: value})
    assert scaler.state_dict() == state
    _stepped(scaler)
    scaler.update()  # not stuck


def test_update_with_a_huge_float_scale_is_refused() -> None:
    scaler = _scaler()
    _stepped(scaler)
    for value in (10**400, 1e39):
        with pytest.raises(ampcore.AmpcoreError, match=r"update\(new_scale="):
            scaler.update(new_scale=value)
    scaler.update()
