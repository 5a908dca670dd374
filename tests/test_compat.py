"""What torch.amp and Paddle users reach for: dtype names wherever a dtype is taken,
Paddle's GradScaler methods, and ``is_float16_supported``/``is_bfloat16_supported``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore._dtypes import DTYPE_NAMES, parse_dtype

pytestmark = pytest.mark.usefixtures("no_emulation_warning")


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("float16", torch.float16), ("fp16", torch.float16), ("half", torch.float16), ("FP16", torch.float16),
        ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16), (" torch.bfloat16 ", torch.bfloat16),
        ("float32", torch.float32), ("fp32", torch.float32), ("float64", torch.float64),
        (torch.float16, torch.float16),
    ],
)  # fmt: skip
def test_parse_dtype_accepts_names_and_dtypes(name: object, dtype: torch.dtype) -> None:
    assert parse_dtype(name, "ampcore.x") is dtype


@pytest.mark.parametrize("bad", ["fp8", "int8", "bfloat61", torch.int32, 16, None])
def test_parse_dtype_refuses_with_the_call_param_and_valid_names(bad: object) -> None:
    with pytest.raises(ampcore.AmpcoreError) as info:
        parse_dtype(bad, "ampcore.decorate", "save_dtype")
    message = str(info.value)
    assert message.startswith("ampcore.decorate(save_dtype=")
    assert all(name in message for name in DTYPE_NAMES)


def test_parse_dtype_names_a_command_line_option_as_typed() -> None:
    with pytest.raises(
        ampcore.AmpcoreError,
        match=r"^ampcore conformance --dtype bfloat61: unknown dtype name \(did you mean 'bfloat16'\?\)",
    ):
        parse_dtype("bfloat61", "ampcore conformance", "--dtype")


@pytest.mark.parametrize("name", ["float16", "fp16", "half"])
def test_grad_scaler_takes_dtype_names(name: str) -> None:
    scaler = ampcore.GradScaler("cpu", dtype=name)
    assert scaler.is_enabled() and "dtype=torch.float16" in repr(scaler)


def test_grad_scaler_refuses_an_unknown_dtype_name() -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"ampcore.GradScaler\(dtype='f16'\).*valid: bfloat16"):
        ampcore.GradScaler("cpu", dtype="f16")


@pytest.mark.parametrize("name", ["bfloat16", "bf16"])
def test_decorate_takes_dtype_names(name: str) -> None:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, level="O2", dtype=name, device="cpu", save_dtype="float32")
    assert model.weight.dtype == torch.bfloat16
    assert model.state_dict()["weight"].dtype == torch.float32


def test_decorate_refuses_a_bad_name_before_changing_anything() -> None:
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ampcore.AmpcoreError, match=r"ampcore.decorate\(dtype='bfloat'\)"):
        ampcore.decorate(model, level="O2", dtype="bfloat", device="cpu")
    assert model.weight.dtype == torch.float32


# -- Paddle's GradScaler methods ---------------------------------------------------------------
def _paddle_scaler(**kwargs: object) -> ampcore.GradScaler:
    return ampcore.GradScaler("cpu", dtype="float16", init_loss_scaling=1024.0, **kwargs)  # type: ignore[arg-type]


def test_paddle_getters_read_the_settings() -> None:
    scaler = _paddle_scaler(incr_ratio=3.0, decr_ratio=0.25, incr_every_n_steps=7, decr_every_n_nan_or_inf=2)
    assert scaler.is_enable() and scaler.get_enable()
    assert scaler.is_use_dynamic_loss_scaling() and scaler.get_use_dynamic_loss_scaling()
    assert scaler.get_init_loss_scaling() == 1024.0
    assert (scaler.get_incr_ratio(), scaler.get_decr_ratio()) == (3.0, 0.25)
    assert (scaler.get_incr_every_n_steps(), scaler.get_decr_every_n_nan_or_inf()) == (7, 2)
    fixed = _paddle_scaler(use_dynamic_loss_scaling=False)
    assert not fixed.is_use_dynamic_loss_scaling()
    assert not ampcore.GradScaler("cpu", dtype="bf16").is_enable()  # bf16 needs no scaling, as in Paddle
    assert not ampcore.GradScaler("cpu", dtype="float16", enable=False).is_enable()  # Paddle's keyword


def test_paddle_setters_write_the_same_settings_as_torchs() -> None:
    scaler = _paddle_scaler()
    scaler.set_incr_ratio(4.0)
    scaler.set_decr_ratio(0.125)
    scaler.set_incr_every_n_steps(5)
    scaler.set_decr_every_n_nan_or_inf(3)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor()) == (4.0, 0.125)
    assert (scaler.get_growth_interval(), scaler.get_hysteresis()) == (5, 3)
    assert scaler.state_dict()["growth_factor"] == 4.0
    with pytest.raises(ampcore.AmpcoreError, match="growth factor must be > 1.0"):
        scaler.set_incr_ratio(0.5)
    assert scaler.get_incr_ratio() == 4.0  # unchanged after the refusal


def test_set_init_loss_scaling_sets_the_current_scale_too() -> None:
    scaler = _paddle_scaler(max_scale=4096.0)
    scaler.set_init_loss_scaling(256.0)
    assert scaler.get_init_loss_scaling() == 256.0 and scaler.get_scale() == 256.0
    _train_step(scaler)
    scaler.set_init_loss_scaling(512.0)  # after the scale tensors exist
    assert scaler.get_scale() == 512.0
    with pytest.raises(ampcore.AmpcoreError, match=r"set_init_loss_scaling\(init_scale=8192.0\)"):
        scaler.set_init_loss_scaling(8192.0)
    assert scaler.get_scale() == 512.0


def _train_step(scaler: ampcore.GradScaler, poison: bool = False) -> torch.nn.Linear:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(8, 4)).pow(2).mean() * (float("inf") if poison else 1.0)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(opt, scaled)
    return model


def test_minimize_is_step_and_update() -> None:
    scaler = _paddle_scaler(incr_every_n_steps=1)
    _train_step(scaler)
    assert scaler.get_scale() == 2048.0  # a clean step grew the scale: update() ran
    _train_step(scaler, poison=True)
    assert scaler.get_scale() == 1024.0  # the overflow step backed off


def test_minimize_refuses_a_closure() -> None:
    scaler = _paddle_scaler()
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    with pytest.raises(ampcore.AmpcoreError, match="closures are not supported while the scaler is enabled"):
        scaler.minimize(opt, lambda: 0.0)  # type: ignore[arg-type]


# -- is_float16_supported / is_bfloat16_supported ---------------------------------------------------
def test_supported_on_cpu() -> None:
    assert ampcore.is_bfloat16_supported("cpu") and ampcore.is_float16_supported("cpu")


def test_supported_follows_the_adapter(register: Callable[..., ampcore.Backend]) -> None:
    register(make_adapter("bfonly", dtypes=(torch.bfloat16,)))
    register(
        make_adapter(
            "fp16broken",
            dtypes=(torch.float16, torch.bfloat16),
            ampcore_check_capability=lambda dtype, device_index: (
                [ampcore.CapabilityIssue("error", "no fp16 units")] if dtype == torch.float16 else []
            ),
        )
    )
    register(make_adapter("gone", dtypes=(torch.float16,), ampcore_unavailable_reason=lambda: "no device"))
    assert ampcore.is_bfloat16_supported("bfonly") and not ampcore.is_float16_supported("bfonly")
    assert not ampcore.is_float16_supported("fp16broken") and ampcore.is_bfloat16_supported("fp16broken")
    assert not ampcore.is_float16_supported("gone")


def test_supported_refuses_an_unknown_backend() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="unknown backend 'tpu9'"):
        ampcore.is_float16_supported("tpu9")


@pytest.mark.parametrize("name", ["bfloat16", "bf16"])
def test_autocast_takes_dtype_names(name: str) -> None:
    with ampcore.autocast(device="cpu", dtype=name):  # type: ignore[arg-type]
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
