"""GradScaler.step on O2 master weights makes no full-size float32 gradient copy (issue 31).

The update of momentum-free SGD, Adam and AdamW unscales the low-precision gradients as it
widens them (``ampcore/_o2/scaled_update.py``); the results are bit-identical to today's
path (an explicit ``unscale_``, which copies) and to torch's optimizer on float32 masters
with torch's GradScaler; an overflow skips the step and backs the scale off.
"""

from __future__ import annotations

import copy
import functools
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampcore
import ampcore._o2.scaled_update as scaled_update

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
Params = Iterable[torch.Tensor]

OPTIMIZERS: dict[str, Callable[[Params], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd-wd-maximize-foreach": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.01, maximize=True, foreach=True),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam-single-amsgrad-wd": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False, amsgrad=True, weight_decay=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
}
#: the optimizers whose update reads the low-precision gradients itself (SGD with momentum
#: too: ampcore runs torch's SGD on the masters, master_sgd_torch.py)
DEFERRING = ("sgd", "sgd-wd-maximize-foreach", "sgd-momentum", "adam", "adam-single-amsgrad-wd", "adamw")
STEPS = 5
OVERFLOW_AT = 2


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*runs emulated", ampcore.AmpcoreWarning)
        warnings.filterwarnings("ignore", ".*GradScaler is enabled, but CUDA is not available")
        yield


def _torchs_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests of the slices this module's deferred unscale widens run torch's optimizer: the
    one-pass kernel of the for-loop flavour unscales as it reads the low-precision gradients
    and widens nothing (``tests/o2/test_onepass_loop.py``)."""
    from ampcore._o2 import onepass_loop

    monkeypatch.setattr(onepass_loop, "_module", lambda: None)


def make_model(norm: bool = True, wide: bool = False) -> nn.Module:
    """Linear layers (masters), with ``norm`` around a BatchNorm (float32 parameters of
    the same param group, which decorate keeps); ``wide`` adds a weight larger than one
    chunk of the CPU's chunked update walk (ending in a partial chunk)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(8, 16), nn.BatchNorm1d(16) if norm else nn.Identity()]
    layers += [nn.Linear(16, 16) for _ in range(5)]
    if wide:
        chunk = ampcore.get_backend("cpu").master_update_chunk_elements
        assert isinstance(chunk, int)
        width = chunk // 16 + 37
        layers += [nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 16)]
    return nn.Sequential(*layers, nn.Linear(16, 4))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)) for _ in range(STEPS)]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x).float(), y)


def first_weight(model: nn.Module) -> torch.Tensor:
    return next(m.weight for m in model.modules() if isinstance(m, nn.Linear))


def masters_of(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in dict.__getitem__(g, "params")]


class MasterGradWatch(TorchDispatchMode):
    """After every op: the bytes of float32 gradients the masters hold, and the bytes of the
    float32 tensors of more than ``floor`` elements created since entering and still alive."""

    def __init__(self, masters: list[torch.Tensor], floor: int) -> None:
        super().__init__()
        self.masters, self.floor = masters, floor
        self.most_grad_bytes = 0
        self.host_reads = 0
        self.live = 0
        self.most_live = 0

    def _gone(self, size: int) -> None:
        self.live -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # (a view allocates nothing: the chunked walks slice their tensors)
            return out
        self.host_reads += func is torch.ops.aten._local_scalar_dense.default
        outs = out if isinstance(out, (list, tuple)) else [out]
        inputs = {id(t) for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in outs:
            if (
                isinstance(tensor, torch.Tensor)
                and id(tensor) not in inputs
                and tensor.dtype == FP32
                and tensor.numel() > self.floor
            ):
                size = tensor.numel() * 4
                self.live += size
                weakref.finalize(tensor, self._gone, size)
        self.most_live = max(self.most_live, self.live)
        held = sum(m.grad.numel() * 4 for m in self.masters if m.grad is not None and m.grad.dtype == FP32)
        self.most_grad_bytes = max(self.most_grad_bytes, held)
        return out


def snapshot(opt: torch.optim.Optimizer, model: nn.Module) -> list[torch.Tensor]:
    state = [v for p in masters_of(opt) for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
    return [t.detach().clone() for t in (*masters_of(opt), *model.parameters(), *state)]


def train(
    name: str,
    dtype: torch.dtype,
    how: str,
    scaler_options: dict[str, Any] | None = None,
    watches: list[MasterGradWatch] | None = None,
    norm: bool = True,
    wide: bool = False,
) -> tuple[list[list[torch.Tensor]], list[float]]:
    """Five scaled steps of a decorated model, an overflow at :data:`OVERFLOW_AT`.
    ``how``: "step" (scaler.step alone), "unscale" (explicit unscale_ first: today's copying
    path), "minimize" (Paddle's); with "scheduler" in it, an LR scheduler made after decorate."""
    model = make_model(norm, wide)
    opt = OPTIMIZERS[name](model.parameters())
    model, opt = ampcore.decorate(model, opt, dtype=dtype, device="cpu")
    options = {"enabled": True, "init_scale": 1024.0} if scaler_options is None else scaler_options
    scaler = ampcore.GradScaler("cpu", dtype=dtype, **options)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if "scheduler" in how else None
    states, scales = [], []
    for index, (x, y) in enumerate(batches()):
        opt.zero_grad()
        scaled = scaler.scale(loss_of(model, x.to(dtype), y))
        scaled.backward()
        if index == OVERFLOW_AT:
            first_weight(model).grad[0, 0] = float("inf")
        if "unscale" in how:
            scaler.unscale_(opt)
        if how == "minimize":
            scaler.minimize(opt, scaled)
        else:
            if watches is None:
                scaler.step(opt)
            else:
                own = {id(p) for p in model.parameters()}  # float32 ones that have no master
                watch = MasterGradWatch([p for p in masters_of(opt) if id(p) not in own], floor=16)
                watches.append(watch)
                with watch:
                    scaler.step(opt)
            scaler.update()
        if sched is not None:
            sched.step()
        states.append(snapshot(opt, model))
        scales.append(scaler.get_scale())
    return states, scales


def reference(
    name: str,
    dtype: torch.dtype,
    *,
    factories: Mapping[str, Callable[[list[torch.Tensor]], torch.optim.Optimizer]] | None = None,
    wide: bool = False,
    unscale: bool = False,
    scaling: bool = True,
) -> tuple[list[list[torch.Tensor]], list[float]]:
    """torch's optimizer (``factories[name]``, default :data:`OPTIMIZERS`) on float32 masters
    with torch's GradScaler, by hand (the model without its BatchNorm), fed the widened
    low-precision gradients; ``unscale``: an explicit ``unscale_`` before the step;
    ``scaling=False``: a scaler that does not scale (then a step with a non-finite gradient
    is skipped by hand, as ampcore's scaler skips it)."""
    model = make_model(norm=False, wide=wide)
    low = copy.deepcopy(model).to(dtype)
    masters = [p.detach().clone().requires_grad_() for p in model.parameters()]
    opt = (OPTIMIZERS if factories is None else factories)[name](masters)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=scaling)
    states, scales = [], []
    for index, (x, y) in enumerate(batches()):
        low.zero_grad()
        scaler.scale(loss_of(low, x.to(dtype), y)).backward()
        if index == OVERFLOW_AT:
            first_weight(low).grad[0, 0] = float("inf")
        for master, param in zip(masters, low.parameters(), strict=True):
            master.grad = param.grad.float()
        if scaling:
            if unscale:
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        elif all(bool(torch.isfinite(m.grad).all()) for m in masters):
            opt.step()
        with torch.no_grad():
            for param, master in zip(low.parameters(), masters, strict=True):
                param.copy_(master)
        state = [v for p in masters for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
        states.append([t.detach().clone() for t in (*masters, *low.parameters(), *state)])
        scales.append(scaler.get_scale() if scaling else 1.0)
    return states, scales


def assert_same(
    got: tuple[list[list[torch.Tensor]], list[float]], want: tuple[list[list[torch.Tensor]], list[float]]
) -> None:
    assert got[1] == want[1]
    for step, (a, b) in enumerate(zip(got[0], want[0], strict=True)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y), f"step {step}"


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_scaler_step_is_bit_identical_to_todays_path_and_to_torch(
    name: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    _torchs_kernels(monkeypatch)
    watches: list[MasterGradWatch] = []
    deferred = train(name, dtype, "step", watches=watches)
    assert deferred[1] == [1024.0, 1024.0, 512.0, 512.0, 512.0]  # the overflow backed off
    copying: list[MasterGradWatch] = []
    assert_same(deferred, train(name, dtype, "unscale", watches=copying))
    # host reads: the found-inf flag once (+ torch's Adam reading its CPU step counts), as before
    assert [w.host_reads for w in watches] == [w.host_reads for w in copying]
    assert watches[OVERFLOW_AT].host_reads == 1
    assert_same(train(name, dtype, "step", norm=False), reference(name, dtype))
    # the deferred path: the skipped step made no float32 gradient (today's made them all);
    # bf16 SGD shares its gradients with the masters: no copy either way
    copies = watches[OVERFLOW_AT].most_grad_bytes
    assert copies == 0 if name in DEFERRING or (dtype == BF16 and name == "sgd") else copies > 0


@pytest.mark.parametrize("name", ["sgd-wd-maximize-foreach", "adamw"])
def test_tensors_larger_than_a_chunk_are_widened_chunk_by_chunk_with_the_same_bits(name: str) -> None:
    """The CPU's chunked walk (the first steps) and whole tensors (the walk's probe after them)."""
    watches: list[MasterGradWatch] = []
    deferred = train(name, FP16, "step", watches=watches, wide=True)
    assert watches[OVERFLOW_AT].most_grad_bytes == 0
    assert_same(deferred, train(name, FP16, "unscale", wide=True))


@pytest.mark.parametrize("name", DEFERRING)
def test_no_float32_gradient_copy_exists_during_the_step(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _torchs_kernels(monkeypatch)
    monkeypatch.setattr(scaled_update, "SLICE_ELEMENTS", 1)  # one tensor widened at a time
    watches: list[MasterGradWatch] = []
    train(name, FP16, "step", watches=watches)
    largest = max(p.numel() * 4 for p in make_model().parameters())
    clean = [w for index, w in enumerate(watches) if index != OVERFLOW_AT]
    assert all(0 < w.most_grad_bytes <= largest for w in clean)
    assert watches[OVERFLOW_AT].most_grad_bytes == 0  # the skipped step widened nothing
    if name.startswith("sgd"):  # SGD keeps no state: one widened gradient (+ its negated, decayed step)
        total = sum(p.numel() * 4 for p in make_model().parameters())
        # (with momentum the first step creates the float32 momentum buffers)
        later = watches[1:] if "momentum" in name else watches
        assert all(w.most_live <= 3 * largest < total for w in later)


def test_explicit_unscale_keeps_the_float32_copies_for_clipping() -> None:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = ampcore.decorate(model, opt, dtype=FP16, device="cpu")
    scaler = ampcore.GradScaler("cpu", dtype=FP16, init_scale=1024.0)
    x, y = batches()[0]
    scaler.scale(loss_of(model, x.half(), y)).backward()
    low = first_weight(model).grad.clone()
    scaler.unscale_(opt)
    master = masters_of(opt)[0]
    assert master.grad is not None and master.grad.dtype == FP32
    assert torch.equal(master.grad, low.float() * (1 / 1024.0))
    scaler.step(opt)
    scaler.update()
    assert master.grad is None  # released after the step


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("how", ["minimize", "scheduler"])
def test_paddle_minimize_and_schedulers_made_after_decorate_defer_too(
    how: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    watches: list[MasterGradWatch] = []
    if how == "scheduler":
        _torchs_kernels(monkeypatch)
        deferred = train("adamw", dtype, how, watches=watches)
        assert all(0 < w.most_grad_bytes for index, w in enumerate(watches) if index != OVERFLOW_AT)
    else:
        deferred = train("adamw", dtype, how)
    assert_same(deferred, train("adamw", dtype, "unscale" if how == "minimize" else "scheduler-unscale"))


def test_a_scaler_that_does_not_scale_still_skips_non_finite_steps() -> None:
    options: dict[str, Any] = {}  # bf16 needs no loss scaling: scale 1, inf/nan still skip
    watches: list[MasterGradWatch] = []
    got = train("adamw", BF16, "step", options, watches)
    assert got[1] == [1.0] * STEPS
    assert_same(got, train("adamw", BF16, "unscale", options))
    assert all(torch.equal(a, b) for a, b in zip(got[0][OVERFLOW_AT - 1], got[0][OVERFLOW_AT], strict=True))


def test_copies_made_before_the_step_and_readers_during_it_see_unscaled_gradients() -> None:
    """Masters that already hold a copy (the param groups were read after backward) are
    unscaled in place as before; a wrapper of ``step`` that reads the gradients gets copies
    unscaled on creation."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, opt = ampcore.decorate(model, opt, dtype=FP16, device="cpu")
    seen: list[torch.Tensor] = []
    inner = opt.step

    @functools.wraps(inner)
    def logged(*args: Any, **kwargs: Any) -> Any:
        seen.extend(p.grad.clone() for p in opt.param_groups[0]["params"][-2:])
        return inner(*args, **kwargs)

    opt.step = logged  # type: ignore[method-assign]
    scaler = ampcore.GradScaler("cpu", dtype=FP16, init_scale=1024.0)
    x, y = batches()[0]
    scaler.scale(loss_of(model, x.half(), y)).backward()
    lows = [p.grad.clone() for p in model.parameters()]
    early = opt.param_groups[0]["params"][0].grad  # a copy, still scaled
    assert early is not None and torch.equal(early, lows[0].float())
    scaler.step(opt)
    assert torch.equal(early, lows[0].float() * (1 / 1024.0))  # unscaled in place
    assert [s.dtype for s in seen] == [FP32, FP32]
    assert all(torch.equal(s, low.float() * (1 / 1024.0)) for s, low in zip(seen, lows[-2:], strict=True))
