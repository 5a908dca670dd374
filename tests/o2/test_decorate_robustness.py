"""decorate and master weights under bad input (issue 12): a weight shared by two models
decorated with two optimizers, and garbage in an optimizer checkpoint."""

from __future__ import annotations

import copy

import pytest
import torch

import ampcore

pytestmark = pytest.mark.filterwarnings("ignore:.*runs emulated.*:ampcore.AmpcoreWarning")


def _tied() -> tuple[torch.nn.Linear, torch.nn.Linear]:
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    second.weight = first.weight
    return first, second


def test_shared_weight_decorated_with_a_second_optimizer_is_refused() -> None:
    first, second = _tied()
    opt1 = torch.optim.SGD(first.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(second.parameters(), lr=0.1)
    ampcore.decorate(first, opt1, device="cpu")
    before_params = [p for g in opt2.param_groups for p in g["params"]]
    bias = second.bias.detach().clone()
    with pytest.raises(
        ampcore.AmpcoreError,
        match=r"optimizers\[0\] \(SGD\).*shape \(4, 4\).*already has an fp32 master weight.*one decorate call",
    ):
        ampcore.decorate(second, opt2, device="cpu")
    # nothing changed: the second model and optimizer are as they were
    assert [p for g in opt2.param_groups for p in g["params"]] == before_params
    assert second.bias.dtype == torch.float32 and torch.equal(second.bias, bias)
    assert ampcore.decorate(second, device="cpu") is second  # without the optimizer it is fine


def test_shared_weight_in_one_call_is_refused_naming_both_optimizers() -> None:
    first, second = _tied()
    opt1 = torch.optim.SGD(first.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(second.parameters(), lr=0.1)
    with pytest.raises(ampcore.AmpcoreError, match=r"also in optimizers\[0\]"):
        ampcore.decorate([first, second], [opt1, opt2], device="cpu")
    assert first.weight.dtype == torch.float32


def test_shared_weight_with_one_optimizer_trains_one_master() -> None:
    first, second = _tied()
    model = torch.nn.Sequential(first, second)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    masters = [p for g in opt.param_groups for p in g["params"]]
    assert len(masters) == 3  # weight (shared), two biases
    with ampcore.autocast("cpu", level="O2"):
        model(torch.randn(2, 4)).float().sum().backward()
    opt.step()
    assert model[0].weight is model[1].weight


@pytest.mark.parametrize("garbage", ["garbage", 5, ["not", "a", "dict"], {0: "tensor?"}])
def test_optimizer_checkpoint_with_garbage_master_weights_is_refused(garbage: object) -> None:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    state = opt.state_dict()
    state["master_weights"] = garbage
    masters = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    groups = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    with pytest.raises(ampcore.AmpcoreError, match=r"SGD.load_state_dict\(\): .*master"):
        opt.load_state_dict(state)
    params = (p for g in opt.param_groups for p in g["params"])
    assert all(torch.equal(a, b) for a, b in zip(masters, params, strict=False))
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups


@pytest.mark.parametrize(
    ("garbage", "expected"),
    [
        ("garbage", "got 'garbage'"),
        ({}, r"lacks \['state', 'param_groups'\]"),
        ({"state": {}, "param_groups": "x"}, "'param_groups' a list"),
        ({"state": {}, "param_groups": [{"params": [0]}]}, r"hold \[1\] parameters, this optimizer's \[2\]"),
    ],
)
def test_decorated_optimizer_load_state_dict_checks_the_dict(garbage: object, expected: str) -> None:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    with pytest.raises(ampcore.AmpcoreError, match=expected):
        opt.load_state_dict(garbage)  # type: ignore[arg-type]
    opt.load_state_dict(opt.state_dict())  # the real thing still loads


# -- issue 28, row 11: decorate under torch.inference_mode() --------------------------------


def test_decorate_under_inference_mode_converts_as_outside_it_and_trains() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.inference_mode():
        model, opt = ampcore.decorate(model, opt, level="O2", device="cpu")
    tensors = [*model.parameters(), *(p for g in opt.param_groups for p in g["params"])]
    assert not any(t.is_inference() for t in tensors)
    assert model[0].weight.dtype == torch.bfloat16
    before = model[0].weight.detach().clone()
    scaler = ampcore.GradScaler("cpu")
    with ampcore.autocast("cpu", level="O2"):
        loss = (model(torch.randn(2, 4)).float() * torch.arange(4.0)).sum()
    scaler.scale(loss).backward()  # "Inference tensors cannot be saved for backward" before
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(model[0].weight, before)


def test_a_model_built_under_inference_mode_is_refused_and_left_unchanged() -> None:
    with torch.inference_mode():
        model = torch.nn.Linear(4, 4)
    with pytest.raises(ampcore.AmpcoreError, match=r"'weight' is an inference tensor .*torch\.inference_mode\(\)"):
        ampcore.decorate(model, level="O2", device="cpu")
    assert model.weight.dtype == torch.float32
