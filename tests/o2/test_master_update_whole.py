"""O2's own master-weight updates on whole tensors (issue 31): an adapter that leaves
``BackendSpec.master_update_chunk_elements`` at its default (as the GPU adapters do) gets a
few ops per param group whatever the parameters' sizes, bit-identical to torch's optimizer
on float32 masters; the CPU adapter's chunks stay exact too.

The op count is the CPU-measurable proxy of the GPU defect: ops dispatched by one
``optimizer.step()`` are what a GPU launches kernels for (a foreach op is one multi-tensor
kernel per few tensors there), counted here with a dispatch mode."""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import torch
from conftest import make_adapter
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampcore
from ampcore._o2 import onepass, onepass_loop
from ampcore._o2.master import master_weights_of

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
WHOLE = "wholecpu"
MakeOpt = Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
#: ops that allocate or describe tensors: no kernel launch on any device
_NOT_KERNELS = (
    "empty",
    "empty_like",
    "empty_strided",
    "detach",
    "alias",
    "view",
    "slice",
    "as_strided",
    "_local_scalar_dense",
    "lift_fresh",
    "_record_function_enter_new",
    "_record_function_exit",
)


@pytest.fixture(scope="module", autouse=True)
def _whole_tensor_adapter() -> Iterator[None]:
    ampcore.register_plugin(make_adapter(WHOLE, dtypes=(BF16, FP16)), name=WHOLE)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*runs emulated", ampcore.AmpcoreWarning)
            yield
    finally:
        ampcore.unregister_plugin(WHOLE)


class _CountOps(TorchDispatchMode):
    """Counts the ops dispatched (by name, without overload) that run a kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name not in _NOT_KERNELS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def make_model(width: int, layers: int = 3) -> nn.Module:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.LayerNorm(width))


def decorated(
    make_opt: MakeOpt, width: int, device: str = WHOLE, dtype: torch.dtype = BF16, layers: int = 3
) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model(width, layers)
    opt = make_opt(model.parameters())
    return ampcore.decorate(model, opt, device=device, dtype=dtype, keep_norm_fp32=True)


def backward(model: nn.Module, device: str, seed: int = 1) -> None:
    width = model[0].in_features
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, width, generator=gen), torch.randn(8, width, generator=gen)
    with ampcore.autocast(device=device, level="O2"):
        loss = nn.functional.mse_loss(model(x).float(), y)
    loss.backward()


def ops_of_one_step(make_opt: MakeOpt, width: int, device: str = WHOLE, layers: int = 3) -> Counter[str]:
    model, opt = decorated(make_opt, width, device, layers=layers)
    for seed in (1, 2):  # the first step creates the state
        opt.zero_grad()
        backward(model, device, seed)
        if seed == 2:
            with _CountOps() as counter:
                opt.step()
            return counter.ops
        opt.step()
    raise AssertionError("unreachable")


FOREACH: dict[str, MakeOpt] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, foreach=True),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True, foreach=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01, foreach=True),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
    "adam-fused-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=0.1, amsgrad=True, fused=True),
}
#: optimizers on the generic path (float32 gradient copies, torch's own step)
GENERIC: dict[str, MakeOpt] = {
    "adagrad-fused": lambda p: torch.optim.Adagrad(p, lr=1e-2, fused=True),
    "adamax-foreach": lambda p: torch.optim.Adamax(p, lr=1e-3, foreach=True),
    "rmsprop-foreach": lambda p: torch.optim.RMSprop(p, lr=1e-3, foreach=True),
}


@pytest.mark.parametrize("name", list(FOREACH))
def test_whole_tensor_updates_dispatch_a_few_ops_per_group_whatever_the_size(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU defect (20,889 kernels per step): the chunked update's ops grow with the
    parameters' size; whole-tensor updates with a foreach or fused optimizer do not."""
    monkeypatch.setattr(onepass, "_module", lambda: None)  # torch's kernels (the one-pass kernel: test_onepass.py)
    monkeypatch.setattr(onepass_loop, "_module", lambda: None)  # (and that of the for-loop flavour)
    small = ops_of_one_step(FOREACH[name], 64)
    large = ops_of_one_step(FOREACH[name], 1031)  # 1M-element weights: 4 CPU chunks each
    deeper = ops_of_one_step(FOREACH[name], 64, layers=9)
    assert large == small == deeper, (small, large, deeper)
    assert sum(small.values()) <= 16, small  # one param group: widen, update, refresh
    assert all(op.startswith("_foreach") or op.startswith("_fused") for op in small), small
    chunked = ops_of_one_step(FOREACH[name], 1031, device="cpu")
    assert sum(chunked.values()) > 3 * sum(large.values())  # (the counter sees the chunks)


@pytest.mark.parametrize("name", list(GENERIC))
def test_the_generic_path_copies_the_gradients_in_one_multi_tensor_op(name: str) -> None:
    """The float32 gradient copies of the generic path: one ``_foreach_copy_`` whatever the
    number of parameters (it was one ``_to_copy`` per parameter, O(tensors) launches)."""
    small = ops_of_one_step(GENERIC[name], 64)
    deeper = ops_of_one_step(GENERIC[name], 64, layers=9)
    assert small == deeper, (small, deeper)
    assert small["_foreach_copy_"] == 2 and "_to_copy" not in small, small  # widen, refresh


def test_the_op_count_grows_with_param_groups_only() -> None:
    def two_groups(params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        params = list(params)
        return torch.optim.AdamW([{"params": params[:3]}, {"params": params[3:]}], lr=1e-3, foreach=True)

    one = sum(ops_of_one_step(FOREACH["adamw"], 64).values())
    assert sum(ops_of_one_step(two_groups, 64).values()) == 2 * one


SGDS: dict[str, MakeOpt] = {
    "plain": lambda p: torch.optim.SGD(p, lr=0.05),
    "decay-maximize": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.01, maximize=True),
    "foreach-decay": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.01, foreach=True),
    "momentum-nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "momentum-foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, foreach=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
}


def reference(make_opt: MakeOpt, width: int, steps: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """torch's own optimizer on fp32 masters, fed the low-precision model's gradients upcast."""
    opt = reference_optimizer(make_opt, width, steps, dtype)
    return [p for group in opt.param_groups for p in group["params"]]


def reference_optimizer(
    make_opt: MakeOpt, width: int, steps: int, dtype: torch.dtype, device: str = WHOLE
) -> torch.optim.Optimizer:
    """:func:`reference`'s optimizer (its parameters are the fp32 masters, its state torch's)."""
    model = make_model(width)
    masters = [p.detach().clone().requires_grad_() for p in model.parameters()]
    low = ampcore.decorate(copy.deepcopy(model), device=device, dtype=dtype, master_weight=False, keep_norm_fp32=True)
    opt = make_opt(masters)
    for step in range(steps):
        low.zero_grad()
        backward(low, device, step)
        for master, param in zip(masters, low.parameters(), strict=True):
            master.grad = param.grad.to(master.dtype)
        opt.step()
        with torch.no_grad():
            for param, master in zip(low.parameters(), masters, strict=True):
                param.copy_(master)
    return opt


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(SGDS))
def test_whole_tensor_steps_are_bit_identical_to_torch_on_fp32_masters(name: str, dtype: torch.dtype) -> None:
    """Momentum-free SGD (ampcore's update, from the low-precision gradients), SGD with
    momentum and every other optimizer (the generic path): torch's values exactly."""
    model, opt = decorated(SGDS[name], 96, dtype=dtype)
    for step in range(3):
        opt.zero_grad()
        backward(model, WHOLE, step)
        opt.step()
    want = reference(SGDS[name], 96, 3, dtype)
    masters = [p for g in opt.param_groups for p in g["params"]]
    for master, expected, param in zip(masters, want, model.parameters(), strict=True):
        assert master.dtype == FP32 and torch.equal(master, expected)
        assert torch.equal(param, expected.to(param.dtype))


@pytest.mark.parametrize("device", ["cpu", WHOLE], ids=["chunks", "whole"])
def test_momentum_free_sgd_makes_no_float32_gradient_copy(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also in a dtype that needs loss scaling (float16) and with foreach SGD (the default
    flavour on GPUs): the update reads the low-precision gradients."""
    import ampcore._o2.own_update as master_module

    calls: list[int] = []
    original = master_module.fused_sgd_update
    monkeypatch.setattr(master_module, "fused_sgd_update", lambda *a: calls.append(1) or original(*a))
    sgd: MakeOpt = lambda p: torch.optim.SGD(p, lr=0.05, foreach=True)  # noqa: E731
    model, opt = decorated(sgd, 1031, device=device, dtype=FP16)
    backward(model, device)
    with _CountOps() as counter:
        opt.step()
    assert calls == [1]
    assert counter.ops["_to_copy"] == 0  # (the generic path's copies are _to_copy calls)
    weights = master_weights_of(opt)
    assert weights is not None and all(p.grad is None for p in weights.masters)


def test_whole_tensor_adam_widens_the_gradients_in_bounded_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """No full-size float32 gradient copy: at most WIDEN_ELEMENTS (or one larger tensor)
    widened at a time; the slices give torch's values exactly."""
    import ampcore._o2.master_adam as master_adam

    monkeypatch.setattr(master_adam, "WIDEN_ELEMENTS", 1)  # every low-precision tensor a slice
    adamw: MakeOpt = lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True)  # noqa: E731
    model, opt = decorated(adamw, 96)
    for step in range(3):
        opt.zero_grad()
        backward(model, WHOLE, step)
        if step < 2:
            opt.step()
            continue
        with _CountOps() as counter:
            opt.step()
    assert counter.ops["_foreach_copy_"] == 2 * 6  # 3 weights + 3 biases: widened, refreshed
    masters = [p for g in opt.param_groups for p in g["params"]]
    for master, expected in zip(masters, reference(adamw, 96, 3, BF16), strict=True):
        assert torch.equal(master, expected)


class _ChunkAdapter:
    AMPCORE_CONTRACT = 2

    def __init__(self, chunk: object) -> None:
        self.chunk = chunk

    @ampcore.hookimpl
    def ampcore_backend(self) -> ampcore.BackendSpec:
        return ampcore.BackendSpec("chunky", "cpu", [BF16], master_update_chunk_elements=self.chunk)  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", [0, -4, True, 2.5, "262144"])
def test_a_wrong_master_update_chunk_fails_the_load(chunk: object) -> None:
    with pytest.raises(ampcore.PluginError, match=r"master_update_chunk_elements=.*expected None \(whole-tensor"):
        ampcore.register_plugin(_ChunkAdapter(chunk), name="chunky")
    assert "chunky" not in {p.name for p in ampcore.list_plugins()}


def test_an_adapter_chooses_the_walk_and_the_defaults_are_whole_tensors() -> None:
    assert ampcore.BackendSpec("x", "x", [BF16]).master_update_chunk_elements is None
    assert ampcore.get_backend(WHOLE).master_update_chunk_elements is None
    ampcore.register_plugin(_ChunkAdapter(4096), name="chunky")
    try:
        model, opt = decorated(FOREACH["adamw"], 64, device="chunky")
        weights = master_weights_of(opt)
        assert weights is not None and weights.walk.chunk == 4096 and weights.walk.adaptive
        whole = master_weights_of(decorated(FOREACH["adamw"], 64)[1])
        assert whole is not None and whole.walk.chunk is None and not whole.walk.adaptive
    finally:
        ampcore.unregister_plugin("chunky")
