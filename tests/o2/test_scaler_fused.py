"""GradScaler with ``fused=True`` Adam/AdamW on O2 master weights (issue 31).

GradScaler hands fused optimizers ``grad_scale`` and ``found_inf`` (torch's protocol): the
kernel divides the gradients and skips an overflowing step on the device.  At O2 the update
reads the low-precision gradients itself, so the scaler checks them read-only and no
float32 copy of every gradient is made; the results are torch's fused optimizer's on
float32 masters under torch's GradScaler, bit for bit, the skipped step and its step
counts included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from test_scaler_deferred_unscale import (
    BF16,
    FP16,
    OVERFLOW_AT,
    MasterGradWatch,
    assert_same,
    batches,
    first_weight,
    loss_of,
    make_model,
    masters_of,
    snapshot,
)
from test_scaler_deferred_unscale import (
    reference as scaled_reference,
)

import ampcore
from ampcore._o2 import adam_call, master_adam, onepass, onepass_loop
from ampcore._o2.master import master_weights_of
from ampcore._o2.update_walk import UpdateWalk

Params = Iterable[torch.Tensor]


class FloatAllocations(MasterGradWatch):
    """:class:`MasterGradWatch` counting only float32 tensors that own their memory (the
    chunked walk's views of a scratch buffer are not allocations)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.is_view:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


FUSED: dict[str, Callable[[Params], torch.optim.Optimizer]] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "adam-amsgrad-wd-maximize": lambda p: torch.optim.Adam(
        p, lr=1e-2, fused=True, amsgrad=True, weight_decay=0.01, maximize=True
    ),
    # fused SGD: ampcore runs torch's fused kernel itself too (master_sgd_torch.py)
    "sgd-nesterov-decay": lambda p: torch.optim.SGD(
        p, lr=1e-2, fused=True, momentum=0.9, nesterov=True, weight_decay=0.01
    ),
    "sgd-maximize": lambda p: torch.optim.SGD(p, lr=1e-2, fused=True, maximize=True),
}
Run = tuple[list[list[torch.Tensor]], list[float]]


def train(
    name: str,
    dtype: torch.dtype,
    *,
    norm: bool = True,
    wide: bool = False,
    whole: bool = False,
    watches: list[FloatAllocations] | None = None,
    scaler_options: dict[str, Any] | None = None,
    unscale: bool = False,
    master_grad: bool = False,
) -> Run:
    """Five scaled steps, an overflow at :data:`OVERFLOW_AT`; ``whole``: the whole-tensor
    walk (the GPU's) instead of the CPU's timed one; ``unscale``: an explicit
    ``scaler.unscale_`` first (as for clipping)."""
    model = make_model(norm, wide)
    opt = FUSED[name](model.parameters())
    model, opt = ampcore.decorate(model, opt, dtype=dtype, device="cpu", master_grad=master_grad)
    if whole:
        weights = master_weights_of(opt)
        assert weights is not None
        weights.walk = UpdateWalk(None)
    options = {"init_scale": 1024.0} if scaler_options is None else scaler_options
    scaler = ampcore.GradScaler("cpu", dtype=dtype, **options)
    states, scales = [], []
    for index, (x, y) in enumerate(batches()):
        opt.zero_grad()
        scaler.scale(loss_of(model, x.to(dtype), y)).backward()
        if index == OVERFLOW_AT:
            first_weight(model).grad[0, 0] = float("inf")
        if unscale:
            scaler.unscale_(opt)
        if watches is None:
            scaler.step(opt)
        else:
            own = {id(p) for p in model.parameters()}  # float32 parameters without a master
            watches.append(FloatAllocations([p for p in masters_of(opt) if id(p) not in own], floor=16))
            with watches[-1]:
                scaler.step(opt)
        scaler.update()
        states.append(snapshot(opt, model))
        scales.append(scaler.get_scale())
    return states, scales


def reference(name: str, dtype: torch.dtype, wide: bool = False, unscale: bool = False) -> Run:
    """torch's fused optimizer on float32 masters with torch's GradScaler (which hands it
    ``grad_scale``/``found_inf``), fed the widened low-precision gradients; bfloat16 needs
    no scaling."""
    return scaled_reference(name, dtype, factories=FUSED, wide=wide, unscale=unscale, scaling=dtype == FP16)


@pytest.mark.parametrize("whole", [False, True], ids=["timed-walk", "whole-tensors"])
@pytest.mark.parametrize("name", list(FUSED))
def test_fused_adam_under_gradscaler_makes_no_float32_gradient_copies(
    name: str, whole: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Today's path gave every master a float32 copy of its gradient (the scaler's check
    read the param groups); now the masters hold none, and the float32 gradients widened
    at a time stay within one slice (whole tensors: one tensor here) or, on the CPU's
    chunked walk, one chunk of scratch and one chunk's worth of small tensors."""
    monkeypatch.setattr(master_adam, "WIDEN_ELEMENTS", 1)
    watches: list[FloatAllocations] = []
    train(name, FP16, whole=whole, wide=not whole, watches=watches)
    assert [w.most_grad_bytes for w in watches] == [0] * len(watches)
    model = make_model(wide=not whole)
    largest = max(p.numel() * 4 for p in model.parameters())
    total = sum(p.numel() * 4 for p in model.parameters())
    chunk = ampcore.get_backend("cpu").master_update_chunk_elements
    assert isinstance(chunk, int)
    bound = largest if whole else 2 * chunk * 4
    # (the first step creates the Adam states: float32 tensors of parameter size); the CPU's
    # one-pass kernel (ampcore/_o2/onepass.py) widens no gradient at all
    least = 0 if onepass.choice().name == "onepass" else 1
    steps = [w.most_live for index, w in enumerate(watches) if index not in (0, OVERFLOW_AT)]
    assert all(least <= live <= bound < total for live in steps)
    assert least or steps == [0] * len(steps)
    assert all(w.host_reads == 0 for w in watches)  # found_inf stays on the device


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(FUSED))
def test_fused_adam_under_gradscaler_is_torchs_fused_optimizer_bit_for_bit(name: str, dtype: torch.dtype) -> None:
    got = train(name, dtype, norm=False)
    if dtype == FP16:
        assert got[1] == [1024.0, 1024.0, 512.0, 512.0, 512.0]  # the overflow backed off
    assert_same(got, reference(name, dtype))
    # the skipped step changed nothing, its step counts included
    assert all(torch.equal(a, b) for a, b in zip(got[0][OVERFLOW_AT - 1], got[0][OVERFLOW_AT], strict=True))


@pytest.mark.parametrize("whole", [False, True], ids=["timed-walk", "whole-tensors"])
def test_tensors_larger_than_a_chunk_skip_and_count_steps_as_torch(whole: bool) -> None:
    """The CPU's chunked walk updates a large tensor chunk by chunk with copies of its step
    count; the real count goes back by found_inf after a skipped step, as torch's does."""
    got = train("adamw", FP16, norm=False, wide=True, whole=whole)
    assert_same(got, reference("adamw", FP16, wide=True))


@pytest.mark.skipif(not hasattr(torch.Tensor, "grad_dtype"), reason="master_grad=True needs torch >= 2.13")
def test_master_grad_under_gradscaler_is_torchs_too() -> None:
    """float32 gradients shared with the masters: nothing to widen; torch's fused kernel
    unscales them as it does a float32 model's."""
    assert_same(train("adamw", FP16, norm=False, master_grad=True), reference("adamw", FP16))


@pytest.mark.parametrize("name", list(FUSED))
def test_an_explicit_unscale_before_the_step_is_torchs_too(name: str) -> None:
    """After ``scaler.unscale_`` (float32 copies, unscaled, for clipping) the scaler hands
    the fused optimizer only ``found_inf``, as torch's does; the update reads the copies."""
    got = train(name, FP16, norm=False, unscale=True)
    assert got[1] == [1024.0, 1024.0, 512.0, 512.0, 512.0]
    assert_same(got, reference(name, FP16, unscale=True))


def test_a_step_hook_keeps_the_generic_path_and_its_results() -> None:
    """What ampcore does not run itself (a step hook) still gets torch's fused step with
    the scaler's tensors, on float32 copies."""
    model = make_model(norm=False)
    model, opt = ampcore.decorate(model, FUSED["adamw"](model.parameters()), dtype=FP16, device="cpu")
    calls: list[int] = []
    opt.register_step_pre_hook(lambda *_: calls.append(1))
    scaler = ampcore.GradScaler("cpu", dtype=FP16, init_scale=1024.0)
    for index, (x, y) in enumerate(batches()):
        opt.zero_grad()
        scaler.scale(loss_of(model, x.half(), y)).backward()
        if index == OVERFLOW_AT:
            first_weight(model).grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
    want = reference("adamw", FP16)
    for got_master, want_master in zip(masters_of(opt), want[0][-1], strict=False):
        assert torch.equal(got_master, want_master)
    assert len(calls) == len(batches())


def test_an_unfused_group_under_a_scaler_is_refused_as_torch_refuses_it() -> None:
    """torch's fused-optimizer protocol with a group that is not fused: torch's own
    error, not a silent update without the scale."""
    model = make_model(norm=False)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:], "fused": False}], lr=1e-2, fused=True)
    model, opt = ampcore.decorate(model, opt, dtype=FP16, device="cpu")
    assert not master_adam.fused_adam_applies(_with_scale(opt))
    del opt.grad_scale, opt.found_inf  # type: ignore[attr-defined]
    assert master_adam.fused_adam_applies(opt)


def _with_scale(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    opt.grad_scale = torch.ones(())  # type: ignore[attr-defined]
    opt.found_inf = torch.zeros(())  # type: ignore[attr-defined]
    return opt


def test_scaler_tensors_reach_torchs_adam_of_every_fused_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onepass, "_module", lambda: None)  # torch's kernels (the one-pass kernel: test_onepass.py)
    monkeypatch.setattr(onepass_loop, "_module", lambda: None)  # (and that of the for-loop flavour)
    seen: list[tuple[Any, Any]] = []
    real = adam_call.run_adam

    def spy(adam: Any, options: dict[str, Any], *rest: Any) -> None:
        seen.append((options["grad_scale"], options["found_inf"]))
        real(adam, options, *rest)

    for module in (adam_call, master_adam):  # every caller of torch's Adam
        monkeypatch.setattr(module, "run_adam", spy)
    model = make_model(norm=False)
    model, opt = ampcore.decorate(model, FUSED["adamw"](model.parameters()), dtype=FP16, device="cpu")
    scaler = ampcore.GradScaler("cpu", dtype=FP16, init_scale=1024.0)
    x, y = batches()[0]
    scaler.scale(loss_of(model, x.half(), y)).backward()
    scaler.step(opt)
    assert seen and all(isinstance(s, torch.Tensor) and float(s) == 1024.0 for s, _ in seen)
    assert all(isinstance(f, torch.Tensor) and float(f) == 0.0 for _, f in seen)
    assert not hasattr(opt, "grad_scale")  # the scaler's protocol: set for the step only
