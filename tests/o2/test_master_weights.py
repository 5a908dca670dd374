"""fp32 master weights: exact updates for torch optimizers, schedulers, GradScaler, gradients."""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Callable, Iterable, Iterator

import pytest
import torch
from torch import nn

import ampcore

#: torch < 2.13 has no ``Tensor.grad_dtype``: no master_grad, and the masters never share the
#: model's bf16 gradients (decorate then always copies them in float32).
needs_grad_dtype = pytest.mark.skipif(
    not hasattr(torch.Tensor, "grad_dtype"),
    reason=f"needs Tensor.grad_dtype (torch >= 2.13); torch {torch.__version__}",
)


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
Params = Iterable[torch.Tensor]


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*runs emulated", ampcore.AmpcoreWarning)
        warnings.filterwarnings("ignore", ".*GradScaler is enabled, but CUDA is not available")
        yield


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)) for _ in range(n)]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x).float(), y)


def reference(
    make_opt: Callable[[Params], torch.optim.Optimizer], steps: int, dtype: torch.dtype = BF16
) -> list[torch.Tensor]:
    """A hand-written master-weight loop: bf16 model, fp32 masters, a plain optimizer."""
    model = make_model()
    low = copy.deepcopy(model).to(dtype)
    masters = [p.detach().clone().requires_grad_() for p in model.parameters()]
    opt = make_opt(masters)
    for x, y in batches(steps):
        low.zero_grad()
        loss_of(low, x.to(dtype), y).backward()
        for master, param in zip(masters, low.parameters(), strict=False):
            master.grad = param.grad.float()
        opt.step()
        with torch.no_grad():
            for param, master in zip(low.parameters(), masters, strict=False):
                param.copy_(master)
    return masters


OPTIMIZERS: dict[str, Callable[[Params], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd-wd-maximize": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.01, maximize=True),
    "sgd-foreach": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.01, foreach=True),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd-nesterov-wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd-fused": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adam-single": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5),
}


def train_decorated(opt: torch.optim.Optimizer, model: nn.Module, steps: int) -> None:
    for x, y in batches(steps):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()


def train_scheduled(opt: torch.optim.Optimizer, model: nn.Module, sched: torch.optim.lr_scheduler.LRScheduler) -> None:
    for x, y in batches(3):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        sched.step()


def masters_of(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_updates_equal_a_hand_written_master_weight_loop(name: str) -> None:
    make_opt = OPTIMIZERS[name]
    model = make_model()
    opt = make_opt(model.parameters())
    model, opt = ampcore.decorate(model, opt, device="cpu")
    train_decorated(opt, model, 5)
    expected = reference(make_opt, 5)
    for master, want, param in zip(masters_of(opt), expected, model.parameters(), strict=False):
        assert master.dtype == FP32 and torch.equal(master, want)
        assert param.dtype == BF16 and torch.equal(param, want.to(BF16))
    state = opt.state[masters_of(opt)[0]]
    assert all(v.dtype == FP32 for k, v in state.items() if k != "step")


@pytest.mark.parametrize("order", ["scheduler-first", "decorate-first"])
def test_lr_schedulers_drive_the_decorated_optimizer(order: str) -> None:
    def make_opt(params: Params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    model = make_model()
    opt = make_opt(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
        if order == "scheduler-first":
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            ampcore.decorate(model, opt, device="cpu")
        else:
            ampcore.decorate(model, opt, device="cpu")
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        train_scheduled(opt, model, sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    masters = [p.detach().clone().requires_grad_() for p in make_model().parameters()]
    ref_opt = make_opt(masters)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    low = make_model().to(BF16)
    for x, y in batches(3):
        low.zero_grad()
        loss_of(low, x.to(BF16), y).backward()
        for master, param in zip(masters, low.parameters(), strict=False):
            master.grad = param.grad.float()
        ref_opt.step()
        ref_sched.step()
        with torch.no_grad():
            for param, master in zip(low.parameters(), masters, strict=False):
                param.copy_(master)
    assert all(torch.equal(a, b) for a, b in zip(masters_of(opt), masters, strict=False))


def make_scaler(kind: str) -> ampcore.GradScaler | torch.amp.GradScaler:
    if kind == "ampcore":
        return ampcore.GradScaler("cpu", dtype=FP16, init_scale=1024.0)
    return torch.amp.GradScaler("cpu", init_scale=1024.0)


def snapshot_state(opt: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in opt.state[p].items()} for p in masters_of(opt)]


@pytest.mark.parametrize("kind", ["ampcore", "torch"])
@pytest.mark.parametrize("name", ["sgd-momentum", "adam-foreach", "adamw-fused"])
def test_grad_scaler_skipped_step_leaves_masters_and_state_untouched(kind: str, name: str) -> None:
    model = make_model()
    opt = OPTIMIZERS[name](model.parameters())
    model, opt = ampcore.decorate(model, opt, dtype=FP16, device="cpu")
    scaler = make_scaler(kind)
    data = batches(3)
    for index, (x, y) in enumerate(data):
        opt.zero_grad()
        if index == 1:
            masters = [m.detach().clone() for m in masters_of(opt)]
            params = [p.detach().clone() for p in model.parameters()]
            state = snapshot_state(opt)
        scaler.scale(loss_of(model, x, y)).backward()
        if index == 1:  # an overflow in backward
            model[0].weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        if index == 1:
            assert all(torch.equal(a, b) for a, b in zip(masters_of(opt), masters, strict=False))
            assert all(torch.equal(a, b) for a, b in zip(model.parameters(), params, strict=False))
            after = snapshot_state(opt)
            assert all(torch.equal(a[k], b[k]) for a, b in zip(after, state, strict=False) for k in a)
            assert scaler.get_scale() == 512.0
    assert all(torch.isfinite(m).all() for m in masters_of(opt))
    assert not torch.equal(masters_of(opt)[0], masters[0])  # the step after the skip updated


def test_scaled_fp16_gradients_are_unscaled_in_fp32() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, dtype=FP16, device="cpu")
    scaler = ampcore.GradScaler("cpu", dtype=FP16, init_scale=2.0**16)
    x, y = batches(1)[0]
    scaler.scale(loss_of(model, x, y) * 1e-6).backward()  # tiny gradients, ~1e-8
    low_grad = model[0].weight.grad.clone()
    assert low_grad.dtype == FP16 and (low_grad != 0).all()
    scaler.unscale_(opt)
    master_grad = masters_of(opt)[0].grad
    assert master_grad.dtype == FP32
    assert torch.equal(master_grad, low_grad.float() / 2.0**16)  # exact and non-zero
    assert ((low_grad.float() / 2.0**16).to(FP16) == 0).any()  # unscaled in fp16 they vanish


def test_master_grad_false_copies_on_read_and_releases_after_the_step() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    x, y = batches(1)[0]
    loss_of(model, x, y).backward()
    assert model[0].weight.grad.dtype == BF16
    master = masters_of(opt)[0]  # reading the group brings the masters' grads up to date
    assert master.grad.dtype == FP32 and torch.equal(master.grad, model[0].weight.grad.float())
    opt.step()
    assert master.grad is None and model[0].weight.grad is not None
    model.zero_grad()
    assert masters_of(opt)[0].grad is None


@needs_grad_dtype
def test_sgd_without_momentum_reads_the_bf16_gradients_without_a_copy() -> None:
    """torch's momentum-free SGD step reads the bfloat16 gradients themselves (its step, here
    torch's because of a step hook); a read before the step (clipping, ``unscale_``) gets a
    float32 copy, as it may change the gradients in place (in float32, as torch on masters)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    seen: list[torch.Tensor | None] = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(masters_of(o)[0].grad))
    x, y = batches(1)[0]
    loss_of(model, x, y).backward()
    opt.step()
    assert seen[-1] is model[0].weight.grad  # shared, bf16
    opt.zero_grad()
    loss_of(model, x, y).backward()
    assert masters_of(opt)[0].grad.dtype == FP32  # read before the step: a copy
    opt.step()
    assert seen[-1].dtype == FP32
    opt.zero_grad()
    opt.param_groups[0]["momentum"] = 0.9  # momentum would clone a bf16 buffer: copy again
    loss_of(model, x, y).backward()
    opt.step()
    assert seen[-1].dtype == FP32


@pytest.mark.parametrize("set_to_none", [True, False])
def test_optimizer_zero_grad_reaches_the_model_parameters(set_to_none: bool) -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    x, y = batches(1)[0]
    loss_of(model, x, y).backward()
    opt.zero_grad(set_to_none=set_to_none)
    for param, master in zip(model.parameters(), masters_of(opt), strict=False):
        assert param.grad is None if set_to_none else not param.grad.any()
        assert master.grad is None or not master.grad.any()


@pytest.mark.skipif(hasattr(torch.Tensor, "grad_dtype"), reason="this torch has Tensor.grad_dtype (master_grad runs)")
def test_master_grad_without_grad_dtype_is_refused_before_anything_changes() -> None:
    """torch 2.8-2.12: a clear error naming the version, the model and optimizer untouched."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        ampcore.AmpcoreError, match=rf"needs Tensor.grad_dtype, which torch {re.escape(torch.__version__)} lacks"
    ):
        ampcore.decorate(model, opt, device="cpu", master_grad=True)
    assert all(p.dtype == FP32 for p in model.parameters())
    model, opt = ampcore.decorate(model, opt, device="cpu")  # not half-decorated: decorate still works
    assert all(p.dtype == BF16 for p in model.parameters())


@needs_grad_dtype
def test_master_grad_accumulates_tiny_gradients_in_fp32() -> None:
    def accumulate(master_grad: bool) -> torch.Tensor:
        model = nn.Linear(1, 1, bias=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        model, opt = ampcore.decorate(model, opt, device="cpu", master_grad=master_grad)
        for value in [1.0] + [1e-3] * 8:  # gradient of y.sum() wrt the weight is x
            model(torch.full((1, 1), value)).sum().backward()
        return masters_of(opt)[0].grad.clone()

    exact = 1.0 + 8 * torch.tensor(1e-3, dtype=BF16).float()
    assert accumulate(master_grad=True).item() == pytest.approx(exact.item(), rel=1e-6)
    assert accumulate(master_grad=False).item() == 1.0  # 1 + 0.001 rounds back to 1 in bf16


def scaled_fp16_backward(master_grad: bool) -> tuple[nn.Module, torch.optim.Optimizer, ampcore.GradScaler]:
    """A decorated fp16 model after one scaled backward and ``scaler.unscale_``."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, dtype=FP16, device="cpu", master_grad=master_grad)
    scaler = ampcore.GradScaler("cpu", dtype=FP16, init_scale=1024.0)
    x, y = batches(1)[0]
    scaler.scale(loss_of(model, x, y)).backward()
    assert model[0].weight.grad.dtype == (FP32 if master_grad else FP16)
    scaler.unscale_(opt)
    return model, opt, scaler


@needs_grad_dtype
def test_master_grad_shares_one_fp32_gradient_so_clipping_the_model_works() -> None:
    model, opt, scaler = scaled_fp16_backward(master_grad=True)
    assert masters_of(opt)[0].grad is model[0].weight.grad
    nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    total = torch.linalg.vector_norm(torch.stack([m.grad.norm() for m in masters_of(opt)]))
    assert total.item() == pytest.approx(1e-3, rel=1e-3)
    scaler.step(opt)
    scaler.update()


def test_clipping_model_gradients_after_unscale_without_master_grad_is_refused() -> None:
    model, opt, scaler = scaled_fp16_backward(master_grad=False)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clips still-scaled fp16 copies
    with pytest.raises(ampcore.AmpcoreError, match=r"Clip the optimizer's parameters instead"):
        scaler.step(opt)


def test_clipping_the_optimizer_parameters_after_unscale_works() -> None:
    model, opt, scaler = scaled_fp16_backward(master_grad=False)
    before = masters_of(opt)[0].detach().clone()
    norm = nn.utils.clip_grad_norm_(masters_of(opt), 1e-3)
    assert norm > 1e-3
    step = masters_of(opt)[0].grad.clone()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(masters_of(opt)[0], before - 0.1 * step)


def test_changes_made_to_the_model_parameters_are_adopted_by_the_masters() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    with torch.no_grad():
        model[0].weight.fill_(0.5)  # e.g. a re-initialisation, or DDP's broadcast
    x, y = batches(1)[0]
    loss_of(model, x, y).backward()
    opt.step()
    assert (masters_of(opt)[0] == 0.5).all() and (model[0].weight == 0.5).all()


def test_lbfgs_with_a_closure_equals_a_hand_written_loop() -> None:
    x, y = batches(1)[0]

    def make_opt(params: Params) -> torch.optim.Optimizer:
        return torch.optim.LBFGS(params, lr=0.5, max_iter=4)

    model = make_model()
    opt = make_opt(model.parameters())
    model, opt = ampcore.decorate(model, opt, device="cpu")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        return loss

    for _ in range(2):
        opt.step(closure)

    low = make_model().to(BF16)
    masters = [p.detach().clone().requires_grad_() for p in make_model().parameters()]
    ref = make_opt(masters)

    def ref_closure() -> torch.Tensor:
        with torch.no_grad():
            for param, master in zip(low.parameters(), masters, strict=False):
                param.copy_(master)
        low.zero_grad()
        loss = loss_of(low, x.to(BF16), y)
        loss.backward()
        for master, param in zip(masters, low.parameters(), strict=False):
            master.grad = param.grad.float()
        return loss

    for _ in range(2):
        ref.step(ref_closure)
    assert all(torch.equal(a, b) for a, b in zip(masters_of(opt), masters, strict=False))


def test_state_from_before_decorate_moves_to_the_masters_in_fp32() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batches(1)[0]
    loss_of(model, x, y).backward()
    opt.step()
    buffer = opt.state[model[0].weight]["momentum_buffer"].clone()
    weight = model[0].weight
    ampcore.decorate(model, opt, device="cpu")
    assert weight not in opt.state
    assert torch.equal(opt.state[masters_of(opt)[0]]["momentum_buffer"], buffer)


def test_without_master_weights_the_optimizer_updates_low_precision_parameters() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, device="cpu", master_weight=False)
    assert masters_of(opt)[0] is model[0].weight and "step" not in opt.__dict__
    train_decorated(opt, model, 2)
    assert model[0].weight.dtype == BF16


def test_a_param_group_of_model_parameters_added_after_decorate_is_refused() -> None:
    model = make_model()
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    opt.add_param_group({"params": list(model[2].parameters())})
    x, y = batches(1)[0]
    loss_of(model, x, y).backward()
    with pytest.raises(ampcore.AmpcoreError, match="add every param group before decorating"):
        opt.step()


def _sgd_model(chunked: bool) -> nn.Module:
    """A BatchNorm (float32 parameters of the group) between small layers; ``chunked`` adds a
    weight of more than one chunk of the one-pass update (ending in a partial chunk)."""
    chunk = ampcore.get_backend("cpu").master_update_chunk_elements
    assert isinstance(chunk, int)
    torch.manual_seed(0)
    if not chunked:
        return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4))
    wide = chunk // 16 + 37
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, wide), nn.ReLU(), nn.Linear(wide, 4))


@needs_grad_dtype
@pytest.mark.parametrize("chunked", [False, True], ids=["small", "chunked"])
@pytest.mark.parametrize(
    "options", [{}, {"weight_decay": 0.01}, {"maximize": True}, {"weight_decay": 0.01, "maximize": True}]
)
def test_the_one_pass_sgd_update_equals_torchs_sgd_step(
    options: dict[str, object], chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain SGD runs ampcore's fused update; a step hook makes ampcore call torch's SGD."""
    import ampcore._o2.own_update as master_module

    calls: list[int] = []
    original = master_module.fused_sgd_update
    monkeypatch.setattr(master_module, "fused_sgd_update", lambda *a: calls.append(1) or original(*a))

    def run(fused: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model = _sgd_model(chunked)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, **options)  # type: ignore[arg-type]
        model, opt = ampcore.decorate(model, opt, device="cpu")
        if not fused:
            opt.register_step_pre_hook(lambda *args: None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the scheduler must see optimizer.step() called
            train_scheduled(opt, model, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
        return masters_of(opt), list(model.parameters())

    fused = run(True)
    assert len(calls) == 3
    plain = run(False)
    assert len(calls) == 3
    for got, want in zip(fused[0] + fused[1], plain[0] + plain[1], strict=False):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert fused[1][2].dtype == FP32 and not torch.equal(fused[1][2], torch.ones(16))  # BN trained


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sparse_embedding_gradients_take_the_copying_path(momentum: float) -> None:
    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Embedding(10, 4, sparse=True)

    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=momentum)
    ampcore.decorate(model, opt, device="cpu")
    reference = make()
    master = reference.weight.detach().clone().requires_grad_()
    torch_opt = torch.optim.SGD([master], lr=0.5, momentum=momentum)
    low = reference.to(BF16)
    for _ in range(2):
        model.zero_grad()
        model(torch.tensor([1, 2, 2])).float().sum().backward()
        opt.step()
        low.zero_grad()
        low(torch.tensor([1, 2, 2])).float().sum().backward()
        master.grad = low.weight.grad.float()
        torch_opt.step()
        with torch.no_grad():
            low.weight.copy_(master)
    assert torch.equal(masters_of(opt)[0], master)
