"""ampcore.GradScaler: the training loop, skipped steps, misuse errors, host syncs, settings."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ampcore

INF, NAN = float("inf"), float("nan")


def fp16_scaler(**kwargs: Any) -> ampcore.GradScaler:
    return ampcore.GradScaler("cpu", dtype=torch.float16, **kwargs)


def linear_problem(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.nn.Linear(8, 4), torch.randn(16, 8), torch.randn(16, 4)


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b, strict=True))


class HostReads(TorchDispatchMode):
    """Counts reads of tensor values by the host (``.item()``, ``bool()``, ``float()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


# -- the training loop ----------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_matches_torch_grad_scaler_step_for_step(optimizer: str) -> None:
    """With hysteresis 1 and no bounds the algorithm is torch's: same scales, same weights."""
    runs = []
    for make in (
        lambda: torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3),
        lambda: fp16_scaler(init_scale=2.0**10, growth_interval=3, max_scale=None),
    ):
        model, x, y = linear_problem()
        opt = (
            torch.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd" else torch.optim.Adam(model.parameters())
        )
        scaler = make()
        scales = []
        for step in range(12):
            opt.zero_grad()
            scaler.scale(loss_of(model, x, y)).backward()
            if step in (4, 5, 9):
                model.bias.grad[step % 4] = INF if step != 5 else NAN
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        runs.append((scales, snapshot(model)))
    assert runs[0][0] == runs[1][0]
    assert same_bits(runs[0][1], runs[1][1])


def test_one_inf_in_one_large_gradient_skips_the_step_bit_identically() -> None:
    big = torch.nn.Parameter(torch.randn(1 << 20))
    small = torch.nn.Parameter(torch.randn(10))
    opt = torch.optim.Adam([small, big], lr=0.1)
    scaler = fp16_scaler(init_scale=1024.0)
    scaler.scale((big.sum() + small.sum()) * 1e-3).backward()
    scaler.step(opt)
    scaler.update()
    before = [big.detach().clone(), small.detach().clone()]
    state_before = {k: v.clone() for k, v in opt.state[big].items()}
    opt.zero_grad()
    scaler.scale((big.sum() + small.sum()) * 1e-3).backward()
    big.grad[777_777] = INF
    scaler.step(opt)
    scaler.update()
    assert same_bits(before, [big.detach(), small.detach()])
    assert all(torch.equal(state_before[k], opt.state[big][k]) for k in state_before)
    assert scaler.get_scale() == 512.0


def test_gradient_accumulation_and_several_optimizers() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    scaler = fp16_scaler(init_scale=256.0)
    x = torch.randn(8, 4)
    scaled = []
    for micro in range(3):
        loss = b(a(x[micro : micro + 4])).pow(2).mean()
        scaled.append(scaler.scale(loss))
        scaled[-1].backward()
    expected = [p.grad.clone() / 256.0 for p in a.parameters()]
    scaler.unscale_(opt_a)
    assert all(torch.allclose(p.grad, e) for p, e in zip(a.parameters(), expected, strict=False))
    b.weight.grad[0, 0] = INF  # only the second optimizer overflows
    a_before, b_before = snapshot(a), snapshot(b)
    scaler.step(opt_a)
    scaler.step(opt_b)
    scaler.update()
    assert not same_bits(a_before, snapshot(a))  # opt_a's gradients were finite: it stepped
    assert same_bits(b_before, snapshot(b))
    assert scaler.get_scale() == 128.0  # one overflow anywhere backs the scale off


def test_clipping_between_unscale_and_step_sees_unscaled_gradients() -> None:
    model, x, y = linear_problem()
    reference = torch.nn.Linear(8, 4)
    reference.load_state_dict(model.state_dict())
    loss_of(reference, x, y).backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = fp16_scaler(init_scale=4096.0)
    scaler.scale(loss_of(model, x, y)).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    for p, r in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, r.grad)
    scaler.step(opt)
    scaler.update()


def test_sparse_gradients_are_unscaled_and_checked() -> None:
    emb = torch.nn.Embedding(100, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    scaler = fp16_scaler(init_scale=64.0)
    scaler.scale(emb(torch.tensor([1, 2, 2])).sum()).backward()
    scaler.unscale_(opt)
    dense = emb.weight.grad.to_dense()
    assert torch.equal(dense[2], torch.full((4,), 2.0)) and torch.equal(dense[1], torch.ones(4))
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    scaler.scale(emb(torch.tensor([3])).sum() * INF).backward()
    before = emb.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(before, emb.weight) and scaler.get_scale() == 32.0


def test_fused_adam_needs_no_host_read_and_skips_on_the_device() -> None:
    results = []
    for make in (
        lambda: torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2),
        lambda: fp16_scaler(init_scale=2.0**8, growth_interval=2),
    ):
        model, x, y = linear_problem()
        opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
        scaler = make()
        for step in range(5):
            opt.zero_grad()
            scaler.scale(loss_of(model, x, y)).backward()
            if step == 2:
                model.weight.grad[1, 1] = INF
            if step == 3:
                scaler.unscale_(opt)  # the UNSCALED path: the optimizer must not unscale again
            with HostReads() as reads:
                scaler.step(opt)
            if isinstance(scaler, ampcore.GradScaler):
                assert reads.count == 0
            scaler.update()
        assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
        results.append((scaler.get_scale(), snapshot(model), opt.state[model.weight]["step"].item()))
    assert results[0][0] == results[1][0] and results[0][2] == results[1][2] == 4
    assert same_bits(results[0][1], results[1][1])


def test_host_reads_scale_unscale_update_none_step_one() -> None:
    model, x, y = linear_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = fp16_scaler(hysteresis=2, min_scale=1.0)
    counts = {}
    for _step in range(2):
        opt.zero_grad()
        with HostReads() as reads:
            loss = scaler.scale(loss_of(model, x, y))
        counts["scale"] = reads.count
        loss.backward()
        with HostReads() as reads:
            scaler.unscale_(opt)
        counts["unscale_"] = reads.count
        with HostReads() as reads:
            scaler.step(opt)
        counts["step"] = reads.count
        with HostReads() as reads:
            scaler.update()
        counts["update"] = reads.count
    assert counts == {"scale": 0, "unscale_": 0, "step": 1, "update": 0}


# -- misuse: torch's RuntimeErrors ----------------------------------------------------------


def _scaled_backward() -> tuple[ampcore.GradScaler, torch.optim.Optimizer]:
    model, x, y = linear_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = fp16_scaler()
    scaler.scale(loss_of(model, x, y)).backward()
    return scaler, opt


MISUSE: list[tuple[str, Callable[[ampcore.GradScaler, Any], Any], str]] = [
    (
        "unscale twice",
        lambda s, o: (s.unscale_(o), s.unscale_(o)),
        r"unscale_\(\) has already been called on this optimizer",
    ),
    ("unscale after step", lambda s, o: (s.step(o), s.unscale_(o)), r"unscale_\(\) is being called after step\(\)"),
    ("step twice", lambda s, o: (s.step(o), s.step(o)), r"step\(\) has already been called since the last update\(\)"),
    ("update before step", lambda s, o: s.update(), r"No inf checks were recorded prior to update"),
    ("closure", lambda s, o: s.step(o, closure=lambda: 0.0), r"Closure use is not currently supported"),
]


@pytest.mark.parametrize(("case", "misuse", "message"), MISUSE, ids=[m[0] for m in MISUSE])
def test_misuse_raises_torchs_runtime_errors(case: str, misuse: Callable[..., Any], message: str) -> None:
    scaler, opt = _scaled_backward()
    with pytest.raises(RuntimeError, match=message) as info:
        misuse(scaler, opt)
    assert isinstance(info.value, ampcore.AmpcoreError)


def test_step_without_scale_says_to_scale_the_loss() -> None:
    model, x, y = linear_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_of(model, x, y).backward()
    with pytest.raises(ampcore.AmpcoreError, match=r"did not use scaler.scale\(loss or outputs\)"):
        fp16_scaler().step(opt)


def test_float16_gradients_are_refused_before_any_is_changed() -> None:
    p32, p16 = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    p32.grad, p16.grad = torch.full((3,), 8.0), torch.full((3,), 8.0, dtype=torch.float16)
    opt = torch.optim.SGD([p32, p16], lr=0.1)
    scaler = fp16_scaler(init_scale=8.0)
    scaler.scale(torch.ones(()))
    with pytest.raises(ampcore.AmpcoreError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(opt)
    assert torch.equal(p32.grad, torch.full((3,), 8.0))


# -- scale() outputs ------------------------------------------------------------------------


def test_scale_keeps_nested_structures() -> None:
    Pair = collections.namedtuple("Pair", "a b")
    scaler = fp16_scaler(init_scale=4.0)
    out = scaler.scale({"x": [torch.tensor(1.0), (torch.tensor(2.0),)], "p": Pair(torch.tensor(3.0), [])})
    assert out["x"][0].item() == 4.0 and out["x"][1][0].item() == 8.0
    assert isinstance(out["p"], Pair) and out["p"].a.item() == 12.0 and isinstance(out["x"][1], tuple)
    assert [t.item() for t in scaler.scale(t for t in [torch.tensor(1.0)])] == [4.0]
    with pytest.raises(ampcore.AmpcoreError, match="outputs must be a Tensor"):
        scaler.scale("loss")


# -- dtype awareness, enabled, dynamic ------------------------------------------------------


def test_bfloat16_default_is_a_transparent_no_op_that_still_skips(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ampcore"):
        scaler = ampcore.GradScaler("cpu")  # the CPU backend's default dtype is bfloat16
    records = [r for r in caplog.records if r.name == "ampcore" and "needs no loss scaling" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert not scaler.is_enabled() and scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    model, x, y = linear_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = loss_of(model, x, y)
    assert scaler.scale(loss) is loss
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.bias.grad[0] = NAN
    before = snapshot(model)
    scaler.step(opt)
    scaler.update()
    assert same_bits(before, snapshot(model)) and scaler.get_scale() == 1.0
    model.bias.grad.copy_(grads[1])
    scaler.step(opt)
    scaler.update()
    assert not same_bits(before, snapshot(model))


def test_enabled_true_forces_scaling_for_bfloat16_and_false_turns_everything_off() -> None:
    forced = ampcore.GradScaler("cpu", dtype=torch.bfloat16, enabled=True, init_scale=8.0)
    assert forced.is_enabled() and forced.scale(torch.tensor(1.0)).item() == 8.0
    off = ampcore.GradScaler("cpu", dtype=torch.float16, enabled=False)
    model, x, y = linear_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = loss_of(model, x, y)
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and not off.is_enabled()
    loss.backward()
    model.bias.grad[0] = INF
    off.step(opt)  # disabled: no check, the optimizer steps
    assert torch.isinf(model.bias[0])


def test_disabled_scaler_does_not_need_an_available_device(cuda_absent: ampcore.Backend) -> None:
    with pytest.raises(ampcore.BackendUnavailableError):
        ampcore.GradScaler("cuda")
    assert not ampcore.GradScaler("cuda", enabled=False).is_enabled()


def test_dynamic_false_keeps_the_scale_constant_but_skips() -> None:
    scaler = fp16_scaler(init_scale=32.0, dynamic=False, growth_interval=1)
    model, x, y = linear_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        scaler.scale(loss_of(model, x, y)).backward()
        if step == 1:
            model.bias.grad[0] = INF
        scaler.step(opt)
        scaler.update()
        assert scaler.get_scale() == 32.0


def test_raise_at_min_scale_raises_and_changes_nothing() -> None:
    scaler = fp16_scaler(init_scale=2.0, min_scale=1.0, raise_at_min_scale=True)
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = scaler.scale(torch.full((2,), INF))
    scaler.step(opt)
    scaler.update()  # 2.0 -> 1.0: backing off to the minimum is fine
    assert scaler.get_scale() == 1.0
    p.grad = scaler.scale(torch.full((2,), INF))
    scaler.step(opt)
    with pytest.raises(ampcore.LossScaleAtMinimumError, match="already at min_scale=1.0"):
        scaler.update()
    assert scaler.get_scale() == 1.0
    with pytest.raises(RuntimeError, match=r"step\(\) has already been called"):
        scaler.step(opt)  # the iteration was left as it was


def test_scale_stays_at_min_scale_without_raising() -> None:
    scaler = fp16_scaler(init_scale=4.0, min_scale=2.0)
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.1)
    for _ in range(3):
        p.grad = scaler.scale(torch.full((1,), NAN))
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 2.0


# -- update(new_scale), repr ---------------------------------------------------------------


def test_update_new_scale_float_and_tensor() -> None:
    scaler = fp16_scaler(init_scale=16.0, min_scale=1.0, max_scale=1024.0)
    scaler.scale(torch.ones(()))
    scaler.update(new_scale=8.0)
    assert scaler.get_scale() == 8.0
    scaler.update(new_scale=torch.tensor(4096.0))  # a tensor is clamped on the device
    assert scaler.get_scale() == 1024.0
    for bad in (0.5, -1.0, INF, "2", torch.ones(2)):
        with pytest.raises(ampcore.AmpcoreError, match="new_scale"):
            scaler.update(new_scale=bad)  # type: ignore[arg-type]
    assert scaler.get_scale() == 1024.0


def test_repr_names_backend_dtype_and_mode() -> None:
    assert repr(fp16_scaler()) == "ampcore.GradScaler(device='cpu', dtype=torch.float16, scaling)"
