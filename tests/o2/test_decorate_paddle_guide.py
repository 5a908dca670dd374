"""Paddle's AMP guide's O2 pattern (issue 30): the model decorated alone, after the optimizer."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import ampcore


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_guides_pattern_warns_and_says_what_to_do(dtype: str) -> None:
    model = _model()
    torch.optim.SGD(model.parameters(), lr=0.1)  # created first, as in the guide
    with pytest.warns(ampcore.NoMasterWeightsWarning, match=r"got no optimizer.*no float32 master weights") as info:
        ampcore.decorate(models=model, level="O2", dtype=dtype, device="cpu")
    message = str(info[0].message)
    assert "ampcore.decorate(model, optimizer, level='O2')" in message and "master_weight=False" in message
    assert info[0].filename == __file__  # points at the caller's decorate line


def test_float16_step_names_the_missing_optimizer_and_the_fix() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(ampcore.NoMasterWeightsWarning):
        model = ampcore.decorate(models=model, level="O2", dtype="float16", device="cpu")
    scaler = ampcore.GradScaler("cpu", dtype="float16")
    with ampcore.autocast(device="cpu", dtype="float16", level="O2"):
        loss = model(torch.randn(8, 4)).float().pow(2).mean()
    scaler.scale(loss).backward()
    with pytest.raises(
        ampcore.AmpcoreError,
        match=r"Attempting to unscale FP16 gradients.*called without its optimizer\. Fix: pass the optimizer.*"
        r"ampcore\.decorate\(model, optimizer, level='O2'\)",
    ):
        scaler.step(opt)


def test_float16_gradients_without_decorate_still_say_the_fix() -> None:
    p = nn.Parameter(torch.ones(2, dtype=torch.float16))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = ampcore.GradScaler("cpu", dtype="float16")
    scaler.scale(p.float().sum()).backward()
    with pytest.raises(ampcore.AmpcoreError, match=r"FP16 gradients.*Fix: for level O2, pass the optimizer"):
        scaler.step(opt)


def test_master_weight_false_marks_the_reason() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, level="O2", dtype="float16", device="cpu", master_weight=False)
    scaler = ampcore.GradScaler("cpu", dtype="float16")
    with ampcore.autocast(device="cpu", dtype="float16", level="O2"):
        loss = model(torch.randn(8, 4)).float().pow(2).mean()
    scaler.scale(loss).backward()
    with pytest.raises(ampcore.AmpcoreError, match=r"because decorate was called with master_weight=False"):
        scaler.step(opt)


@pytest.mark.parametrize(
    "kwargs",
    [{"master_weight": False}, {"level": "O1"}],
    ids=["no-masters-on-purpose", "O1"],
)
def test_no_warning_where_nothing_is_lost(kwargs: dict[str, object]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.NoMasterWeightsWarning)
        ampcore.decorate(_model(), **{"level": "O2", "device": "cpu", **kwargs})


def test_no_warning_for_frozen_parameters() -> None:
    model = _model().requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.NoMasterWeightsWarning)
        ampcore.decorate(model, level="O2", device="cpu")


def test_master_weight_none_is_paddles_default_masters_at_o2() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = ampcore.decorate(model, opt, level="O2", device="cpu", master_weight=None)
    assert model[0].weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for g in opt.param_groups for p in g["params"])


def test_the_fix_keeps_small_updates_that_bfloat16_loses() -> None:
    """1e-3 on a weight of 1.0: lost in bfloat16 without masters, kept in the fp32 master."""

    def trained(with_optimizer: bool) -> float:
        layer = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            layer.weight.fill_(1.0)
        opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
        if with_optimizer:
            layer, opt = ampcore.decorate(layer, opt, level="O2", device="cpu")
        else:
            with pytest.warns(ampcore.NoMasterWeightsWarning):
                layer = ampcore.decorate(layer, level="O2", device="cpu")
        for _ in range(3):
            opt.zero_grad()
            layer(torch.ones(1, 1, dtype=torch.bfloat16)).float().sum().backward()
            opt.step()
        return float(opt.param_groups[0]["params"][0].detach().float().reshape(()))

    assert trained(with_optimizer=False) == 1.0
    assert trained(with_optimizer=True) == pytest.approx(1.0 - 3e-3, abs=1e-6)


def test_master_weight_rejects_other_values() -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"master_weight=1\): expected True or False"):
        ampcore.decorate(_model(), level="O2", device="cpu", master_weight=1)  # type: ignore[arg-type]


def test_the_optimizer_holding_the_parameters_is_named_at_its_first_step() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # created first, as in the guide
    with pytest.warns(ampcore.NoMasterWeightsWarning):
        model = ampcore.decorate(models=model, level="O2", device="cpu")
    other = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1)  # unrelated: no warning
    model(torch.randn(2, 4, dtype=torch.bfloat16)).float().sum().backward()
    with pytest.warns(ampcore.NoMasterWeightsWarning, match=r"SGD\.step\(\): 4 of this optimizer's parameters"):
        opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.NoMasterWeightsWarning)
        opt.step()  # once per optimizer
        other.step()


def test_inference_in_eval_mode_gets_no_warning_until_an_optimizer_steps() -> None:
    model = _model().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.NoMasterWeightsWarning)
        model = ampcore.decorate(model, level="O2", device="cpu")
        with torch.no_grad():
            model(torch.randn(2, 4, dtype=torch.bfloat16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # training after all: named at its first step
    model(torch.randn(2, 4, dtype=torch.bfloat16)).float().sum().backward()
    with pytest.warns(ampcore.NoMasterWeightsWarning, match=r"SGD\.step\(\)"):
        opt.step()


def test_the_no_optimizer_watcher_leaves_decorated_optimizers_on_their_fast_path() -> None:
    """The step pre-hook that names an optimizer decorated without it is global; it returns
    at once for an optimizer with master weights, so such optimizers keep ampcore's own
    update (a foreign global hook still sends them to torch's step)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from ampcore._o2.master_sgd import step_hooks_free

    with pytest.warns(ampcore.NoMasterWeightsWarning):
        ampcore.decorate(torch.nn.Linear(4, 4), level="O2", device="cpu")  # installs the watcher
    model = torch.nn.Linear(4, 4)
    _, opt = ampcore.decorate(model, torch.optim.AdamW(model.parameters()), level="O2", device="cpu")
    assert step_hooks_free(opt)
    handle = register_optimizer_step_pre_hook(lambda *args: None)
    try:
        assert not step_hooks_free(opt)
    finally:
        handle.remove()
