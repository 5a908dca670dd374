"""Paddle users' GradScaler (issue 30): Paddle's defaults, Paddle state dicts, option hints, closures."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ampcore
from ampcore._scaler.paddle import PADDLE_SCALER_DEFAULTS, paddle_defaults


def _paddle_state(scale: Any = 1024.0, **changes: Any) -> dict[str, Any]:
    """A state dict as ``paddle.amp.GradScaler.state_dict()`` writes it (scale as a 1-element array)."""
    state = {
        "scale": torch.tensor([scale], dtype=torch.float32).numpy(),
        "incr_ratio": 2.0,
        "decr_ratio": 0.5,
        "incr_every_n_steps": 1000,
        "decr_every_n_nan_or_inf": 2,
        "incr_count": 7,
        "decr_count": 1,
        "use_dynamic_loss_scaling": True,
    }
    state.update(changes)
    return state


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.2", (32768.0, 1000, 2)),
        ("2.4.2", (32768.0, 1000, 2)),
        ("2.5", (65536.0, 2000, 1)),
        ("3.0", (65536.0, 2000, 1)),
    ],
)
def test_paddle_switch_gives_paddles_defaults_of_the_version(version: str, expected: tuple[float, int, int]) -> None:
    scaler = ampcore.GradScaler.paddle("cpu", dtype="float16", version=version)
    got = (scaler.get_init_loss_scaling(), scaler.get_incr_every_n_steps(), scaler.get_decr_every_n_nan_or_inf())
    assert got == expected
    assert scaler.get_scale() == expected[0]
    assert scaler.state_dict()["max_scale"] is None  # Paddle has no upper bound


def test_paddle_switch_defaults_to_the_guides_values_and_given_options_win() -> None:
    scaler = ampcore.GradScaler.paddle("cpu", dtype="float16", init_loss_scaling=1024, hysteresis=3)
    assert (scaler.get_init_loss_scaling(), scaler.get_incr_every_n_steps(), scaler.get_hysteresis()) == (
        1024.0,
        1000,
        3,
    )
    assert paddle_defaults() == dict(PADDLE_SCALER_DEFAULTS["2.0"])


@pytest.mark.parametrize("version", ["1.8", "latest", 2.2, ""])
def test_paddle_switch_refuses_an_unknown_version(version: Any) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"version=.*expected a Paddle version string"):
        ampcore.GradScaler.paddle("cpu", dtype="float16", version=version)


def test_a_paddle_state_dict_loads() -> None:
    scaler = ampcore.GradScaler("cpu", dtype="float16")
    scaler.load_state_dict(_paddle_state())
    state = scaler.state_dict()
    assert (state["scale"], state["_growth_tracker"], state["_overflow_tracker"], state["hysteresis"]) == (
        1024.0,
        7,
        1,
        2,
    )
    assert state["growth_interval"] == 1000 and state["dynamic"] is True


@pytest.mark.parametrize("scale", [512.0, torch.tensor([512.0]), torch.tensor(512.0), [512.0]])
def test_paddle_scale_forms_and_the_loss_scaling_key(scale: Any) -> None:
    state = _paddle_state()
    del state["scale"]
    state["loss_scaling"] = scale
    scaler = ampcore.GradScaler("cpu", dtype="float16")
    scaler.load_state_dict(state)
    assert scaler.get_scale() == 512.0


def test_a_paddle_state_dict_continues_the_paddle_rule() -> None:
    """decr_count 1 of 2: one more overflow step backs off (Paddle's consecutive count)."""
    scaler = ampcore.GradScaler("cpu", dtype="float16")
    scaler.load_state_dict(_paddle_state())
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler.scale(p.sum() * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 512.0


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"incr_count": None}, "missing keys \\['incr_count'\\]"),
        ({"extra": 1}, "unexpected keys \\['extra'\\]"),
        ({"incr_count": 5000}, "_growth_tracker"),
        ({"incr_ratio": 0.5}, "growth factor"),
    ],
)
def test_a_broken_paddle_state_dict_raises_and_changes_nothing(changes: dict[str, Any], match: str) -> None:
    state = _paddle_state(**{k: v for k, v in changes.items() if v is not None})
    for key in [k for k, v in changes.items() if v is None]:
        del state[key]
    scaler = ampcore.GradScaler("cpu", dtype="float16", init_scale=8.0)
    before = scaler.state_dict()
    with pytest.raises(ampcore.AmpcoreError, match=match):
        scaler.load_state_dict(state)
    assert scaler.state_dict() == before


def test_a_paddle_misspelling_gets_the_paddle_name() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="did you mean 'decr_every_n_nan_or_inf'"):
        ampcore.GradScaler("cpu", decr_every_n_steps=2)
    with pytest.raises(ampcore.AmpcoreError, match="did you mean 'incr_every_n_steps'"):
        ampcore.GradScaler("cpu", incr_every_n_step=2)
    with pytest.raises(ampcore.AmpcoreError, match="did you mean 'growth_interval'"):
        ampcore.GradScaler("cpu", growth_intervall=2)


def _setup() -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
    p = torch.nn.Parameter(torch.ones(2))
    return p, torch.optim.SGD([p], lr=0.1)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, o, f: s.step(o, closure=f),
        lambda s, o, f: s.step(o, f),
        lambda s, o, f: s.minimize(o, f),
        lambda s, o, f: s.minimize(o, closure=f),
    ],
    ids=["step-keyword", "step-positional", "minimize", "minimize-keyword"],
)
def test_one_closure_rule_while_enabled(call: Any) -> None:
    p, opt = _setup()
    scaler = ampcore.GradScaler("cpu", dtype="float16")
    ran: list[int] = []
    scaler.scale(p.sum()).backward()
    with pytest.raises(ampcore.AmpcoreError, match=r"Closure use is not currently supported.*in any spelling"):
        call(scaler, opt, lambda: ran.append(1))
    assert not ran and torch.equal(p.detach(), torch.ones(2))
    scaler.step(opt)  # the refused call recorded nothing
    scaler.update()


@pytest.mark.parametrize("via", ["step", "minimize"])
def test_a_disabled_scaler_passes_the_closure(via: str) -> None:
    p, opt = _setup()
    scaler = ampcore.GradScaler("cpu", enabled=False)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = p.sum()
        loss.backward()
        return loss

    getattr(scaler, via)(opt, closure)
    assert torch.allclose(p.detach(), torch.full((2,), 0.9))


def test_paddles_positional_order() -> None:
    scaler = ampcore.GradScaler(True, 1024, 2.0, 0.5, 1000, 2, True, device="cpu", dtype="float16")
    assert (scaler.get_init_loss_scaling(), scaler.get_incr_every_n_steps(), scaler.get_hysteresis()) == (
        1024.0,
        1000,
        2,
    )
    assert ampcore.GradScaler(False, device="cpu").is_enable() is False


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((1024.0,), {}, r"GradScaler\(1024.0, ...\): the first positional argument is the device .* Paddle's order"),
        ((True, 1024), {"init_loss_scaling": 8}, r"'init_loss_scaling' was given twice"),
        ((True, 1, 2, 0.5, 4, 5, True, 7), {}, r"at most 7 positional arguments in Paddle's order"),
    ],
)
def test_bad_positional_calls_raise_clearly(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=match):
        ampcore.GradScaler(*args, **kwargs)
