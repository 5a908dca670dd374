"""Held-out sweep (issue 31), the edges of a training loop around O2's master-weight updates,
each against torch's optimizer on float32 copies of the masters, bit for bit after every
step (``o2_sweep_harness.py``): ``scaler.unscale_`` and clipping before the step,
``zero_grad(set_to_none=False)`` (gradients accumulated into zeroed tensors), an LR scheduler
changing a float ``lr`` every step, ``lr`` as a 0-dim tensor, ``add_param_group`` after
decorate, ``capturable`` on the CPU, SparseAdam.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from o2_sweep_harness import (
    CASES,
    INF_AT,
    OWN,
    Case,
    HeldAs,
    Options,
    Side,
    build,
    gradients,
    make_net,
    same_run,
    same_state,
    step,
    train_both,
    two_groups,
)

import ampcore
from ampcore._o2.master import master_weights_of

#: ampcore's own updates and a few of the generic path's
SOME = [*OWN, "adagrad-fused", "rmsprop-foreach", "nadam-loop", "adafactor-foreach", "rprop-loop", "asgd-foreach"]


@pytest.mark.parametrize("scaler", [None, "ampcore", "torch"], ids=["no-scaler", "ampcore-scaler", "torch-scaler"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", SOME)
def test_unscale_and_clip_before_the_step(name: str, dtype: str, scaler: str | None) -> None:
    train_both(CASES[name], Options(dtype=dtype, scaler=scaler, clip=True))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", SOME)
def test_zero_grad_keeping_the_tensors(name: str, dtype: str) -> None:
    train_both(CASES[name], Options(dtype=dtype, set_to_none=False, scaler="torch" if dtype == "fp16" else None))


def _every_step(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + 0.7 * i) + 0.01 * (i % 3))


@pytest.mark.parametrize("name", [*SOME, "lbfgs"])
def test_an_lr_scheduler_changes_a_float_lr_every_step(name: str) -> None:
    case = dataclasses.replace(CASES[name], scheduler=_every_step)
    train_both(case, Options(dtype="fp16", scaler=None if case.closure else "ampcore", steps=6))


_WITH_FUSED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad)
_TENSOR_LR = {
    f"{label}-{flavour}": (cls, {**extra, flag: True} if flag else {**extra, "foreach": False})
    for label, cls, extra in (
        ("sgd-momentum", torch.optim.SGD, {"momentum": 0.9}),
        ("sgd", torch.optim.SGD, {}),
        ("adam-amsgrad", torch.optim.Adam, {"amsgrad": True}),
        ("adamw", torch.optim.AdamW, {}),
        ("adagrad", torch.optim.Adagrad, {}),
        ("rmsprop", torch.optim.RMSprop, {}),
        ("nadam", torch.optim.NAdam, {}),
    )
    for flavour, flag in (("loop", None), ("foreach", "foreach"), ("fused", "fused"))
    if flavour != "fused" or cls in _WITH_FUSED
}


@pytest.mark.parametrize("scaler", [None, "torch"], ids=["no-scaler", "torch-scaler"])
@pytest.mark.parametrize("name", sorted(_TENSOR_LR))
def test_lr_as_a_0_dim_tensor(name: str, scaler: str | None) -> None:
    """As torch: the same steps where torch takes a tensor ``lr``, the same error where it does not."""
    cls, kwargs = _TENSOR_LR[name]
    case = Case(lambda g: cls(g, lr=torch.tensor(0.01), **kwargs), second={"lr": torch.tensor(0.02)})
    options = Options(dtype="fp16" if scaler else "bf16", scaler=scaler)
    try:
        ref = build(case, options)[1]
        for index in range(options.steps):
            step(ref, index, options, widen=True, closure=False)
    except (RuntimeError, ValueError, TypeError) as refused:
        with pytest.raises(type(refused), match=str(refused)[:40]):
            dec = build(case, options)[0]
            for index in range(options.steps):
                step(dec, index, options, widen=False, closure=False)
        return
    train_both(case, options)


ADDED = INF_AT + 1


@pytest.mark.parametrize("name", SOME)
def test_add_param_group_of_float32_parameters_after_decorate(name: str) -> None:
    """A group of float32 parameters added after decorate (its own learning rate) is updated
    as torch updates it, with the masters' groups, from the step after it was added.  (Not
    at the step of inf gradients: torch's fused SGD skipping its first step leaves its new
    momentum buffers uninitialised, ``torch.empty_like``.)"""
    case = CASES[name]
    if case.one_group:
        pytest.skip("LBFGS takes one param group")
    refused = _torch_refuses_an_added_group(case)
    if refused is not None:
        pytest.skip(f"torch {torch.__version__} itself cannot step a group added later ({refused})")
    options = Options(dtype="fp16", scaler="torch")
    dec, ref = build(case, options)
    for index in range(options.steps):
        if index == ADDED:
            torch.manual_seed(7)
            extra = torch.nn.Parameter(torch.randn(4, 3))
            for side, param in ((dec, extra), (ref, torch.nn.Parameter(extra.detach().clone()))):
                side.opt.add_param_group({"params": [param], "lr": 0.003})
                side.extra = param  # type: ignore[attr-defined]
        for side, widen in ((dec, False), (ref, True)):
            if index >= ADDED:
                side.extra.grad = torch.full((4, 3), 0.25 * index) * (side.scaler.get_scale() if side.scaler else 1)  # type: ignore[attr-defined]
            step(side, index, options, widen=widen, closure=False)
        same_run(dec, ref, f"step {index}")
        if index >= ADDED:
            assert torch.equal(dec.extra, ref.extra), f"step {index}: the added group"  # type: ignore[attr-defined]


def _torch_refuses_an_added_group(case: Case) -> str | None:
    """torch's own error when its optimizer steps a param group added after it was made
    (torch 2.8's Adagrad makes its state in ``__init__`` only: ``KeyError: 'sum'``), else None."""
    opt = case.make([{"params": [torch.nn.Parameter(torch.ones(2))]}])
    param = torch.nn.Parameter(torch.ones(2))
    opt.add_param_group({"params": [param]})
    param.grad = torch.ones(2)
    try:
        opt.step()
    except Exception as exc:  # whatever torch raises: the case cannot run on this torch
        return f"{type(exc).__name__}: {exc}"
    return None


def test_a_low_precision_group_added_after_decorate_is_refused_before_anything_changes() -> None:
    dec, _ = build(CASES["adam-fused"], Options())
    before = {k: v.clone() for k, v in dec.model.state_dict().items()}
    dec.opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]})
    dec.params["lin.weight"].grad = torch.ones(8, 8, dtype=torch.bfloat16)
    with pytest.raises(ampcore.AmpcoreError, match="added after ampcore.decorate holds low-precision parameters"):
        dec.opt.step()
    assert all(torch.equal(v, before[k]) for k, v in dec.model.state_dict().items())


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop, torch.optim.NAdam])
def test_capturable_on_the_cpu_as_torch(cls: type[torch.optim.Optimizer]) -> None:
    """torch refuses ``capturable=True`` for CPU parameters (graph capture is for devices);
    decorated, the same error, nothing updated."""
    case = Case(lambda g: cls(g, lr=0.01, capturable=True))  # type: ignore[call-arg]
    options = Options()
    dec, ref = build(case, options)
    with pytest.raises(Exception) as refused:  # noqa: PT011 - whatever torch raises
        step(ref, 0, options, widen=True, closure=False)
    before = {k: v.clone() for k, v in dec.model.state_dict().items()}
    with pytest.raises(type(refused.value), match="capturable"):
        step(dec, 0, options, widen=False, closure=False)
    assert all(torch.equal(v, before[k]) for k, v in dec.model.state_dict().items())


def test_sparse_adam_with_dense_gradients_fails_as_torch() -> None:
    case = Case(lambda g: torch.optim.SparseAdam(g, lr=0.01), exclude=frozenset({"scalar", "empty"}))
    options = Options()
    dec, ref = build(case, options)
    with pytest.raises(RuntimeError) as refused:
        step(ref, 0, options, widen=True, closure=False)
    with pytest.raises(RuntimeError, match=str(refused.value).split(".")[0]):
        step(dec, 0, options, widen=False, closure=False)


@pytest.mark.parametrize("read", ["state_dict", "add_param_group"])
@pytest.mark.parametrize("name", ["adam-fused", "rmsprop-loop", "sgd-momentum-foreach"])
def test_reading_the_parameters_between_micro_batches_copies_no_gradient(name: str, read: str) -> None:
    """``optimizer.state_dict()`` and ``add_param_group`` read the param groups for the
    parameters only: no float32 gradient copy (memory), and none that would go stale as the
    next micro-batch's backward accumulates into the same gradients (it raised
    "changed in place after ampcore copied them" at the step)."""
    options = Options(dtype="fp16", set_to_none=False)
    dec, ref = build(CASES[name], options)
    for index in range(3):
        for side, widen in ((dec, False), (ref, True)):
            half = {n: None if g is None else g / 2 for n, g in gradients(side.held, index, 1.0).items()}
            side.set_grads(half, widen, accumulate=True)
            if read == "state_dict":
                side.opt.state_dict()
            else:
                side.opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
            if not widen:
                weights = master_weights_of(side.opt)
                assert weights is not None and all(master.grad is None for master in weights.masters)
            side.set_grads(half, widen, accumulate=True)
            side.opt.step()
            side.opt.zero_grad(set_to_none=False)
        same_run(dec, ref, f"step {index}")


@pytest.mark.parametrize("scaler", [None, "ampcore"])
def test_clipping_before_a_bfloat16_sgd_step_clips_float32_copies(scaler: str | None) -> None:
    """bfloat16, momentum-free for-loop SGD (whose step may read the low-precision
    gradients themselves): ``clip_grad_norm_`` over the optimizer's parameters before the
    step got those bfloat16 gradients, computed the norm and scaled them in bfloat16."""
    train_both(CASES["sgd-loop"], Options(dtype="bf16", scaler=scaler, clip=True))


class _AdamW(torch.optim.AdamW):
    """A subclass (its step may differ from torch's: ampcore runs it, on float32 copies)."""


def _hooked(make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]) -> Callable[..., torch.optim.Optimizer]:
    def hooked(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        opt = make(groups)
        opt.register_step_pre_hook(lambda o, args, kwargs: None)
        opt.register_step_post_hook(lambda o, args, kwargs: None)
        return opt

    return hooked


_FALLBACKS: dict[str, Case] = {
    "subclass": Case(lambda g: _AdamW(g, lr=0.01, fused=True)),
    "hooked-adam-fused": Case(_hooked(lambda g: torch.optim.Adam(g, lr=0.01, fused=True))),
    "hooked-sgd-loop": Case(_hooked(lambda g: torch.optim.SGD(g, lr=0.1))),
    "hooked-sgd-momentum-foreach": Case(_hooked(lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, foreach=True))),
}


@pytest.mark.parametrize("scaler", [None, "ampcore", "torch"], ids=["no-scaler", "ampcore-scaler", "torch-scaler"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(_FALLBACKS))
def test_what_takes_the_generic_path_is_torchs_step(name: str, dtype: str, scaler: str | None) -> None:
    """A subclass, step hooks: torch's own step on float32 copies."""
    train_both(_FALLBACKS[name], Options(dtype=dtype, scaler=scaler))


@pytest.mark.parametrize(
    "make",
    [
        lambda g: torch.optim.Adam(g, lr=0.01, differentiable=True),
        lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.5, differentiable=True),
        lambda g: torch.optim.SGD(g, lr=0.1, differentiable=True),
    ],
    ids=["adam", "sgd-momentum", "sgd"],
)
def test_differentiable_fails_as_torch(make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]) -> None:
    """``differentiable=True`` takes the generic path: torch's step, which refuses leaf
    parameters that require grad (in-place update); the same error, nothing changed."""
    options = Options()
    dec, ref = build(Case(make), options)
    with pytest.raises(RuntimeError) as refused:
        step(ref, 0, options, widen=True, closure=False)
    before = {key: value.clone() for key, value in dec.model.state_dict().items()}
    with pytest.raises(RuntimeError, match=str(refused.value)[:40]):
        step(dec, 0, options, widen=False, closure=False)
    assert all(torch.equal(value, before[key]) for key, value in dec.model.state_dict().items())


@pytest.mark.parametrize("name", ["adam-fused", "adamw-loop", "sgd-momentum-foreach", "sgd-loop", "rmsprop-loop"])
def test_an_lr_scheduler_made_before_decorate(name: str) -> None:
    """torch's scheduler wraps the instance's ``step`` before decorate does (torch_step.py)."""
    made: list[Any] = []
    case = CASES[name]
    options = Options(dtype="fp16", scaler="torch", steps=6)
    dec, ref = build(case, options, before=lambda model, opt: made.append(_every_step(opt)))
    dec.sched, ref.sched = made[0], _every_step(ref.opt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" would be wrong
        for index in range(options.steps):
            step(dec, index, options, widen=False, closure=False)
            step(ref, index, options, widen=True, closure=False)
            same_run(dec, ref, f"step {index}")


@pytest.mark.parametrize("scaler", [None, "torch"], ids=["no-scaler", "torch-scaler"])
def test_two_optimizers_of_one_model(scaler: str | None) -> None:
    """One model, two optimizers decorated in one call (fused AdamW on one param group's
    parameters, SGD with momentum on the other's), one GradScaler stepping both."""
    options = Options(dtype="fp16", scaler=scaler)
    sides = []
    for decorated in (True, False):
        model = make_net(0)
        first, second = two_groups(model, {})
        opts = [
            torch.optim.AdamW(first["params"], lr=0.01, fused=True),
            torch.optim.SGD(second["params"], lr=0.1, momentum=0.9),
        ]
        if decorated:
            model, opts = ampcore.decorate(model, opts, level="O2", dtype=torch.float16, device="cpu")
        scaler_of = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2) if scaler else None
        sides.append((model, opts, scaler_of))
    held = {}
    for index in range(options.steps):
        for (model, opts, scaler_of), widen in zip(sides, (False, True), strict=True):
            side = Side(model, opts[0], scaler_of, None, None)
            if not held:
                held = dict(side.params)
            side.held = held if not widen else {n: HeldAs(p, held[n].dtype) for n, p in side.params.items()}
            if scaler_of is not None:
                scaler_of.scale(torch.ones(()))
            scale = 1.0 if scaler_of is None else float(scaler_of.get_scale())
            side.set_grads(gradients(side.held, index, scale), widen, accumulate=False)
            for opt in opts:
                if scaler_of is not None:
                    scaler_of.step(opt)
                else:
                    opt.step()
                opt.zero_grad()
            if scaler_of is not None:
                scaler_of.update()
        (dec_model, dec_opts, _), (ref_model, ref_opts, _) = sides
        for key, value in ref_model.state_dict().items():
            assert torch.equal(dec_model.state_dict()[key], value), f"step {index}: {key}"
        for mine, theirs in zip(dec_opts, ref_opts, strict=True):
            same_state(mine.state_dict(), theirs.state_dict(), f"step {index}")
