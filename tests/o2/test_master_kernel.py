"""The kernel of O2's Adam/AdamW master update (issue 31): torch's (the default), or
ampcore's one-pass Triton kernel for ``fused=True`` groups (``set_master_update_kernel``).

The Triton tests run the kernel in Triton's interpreter on the CPU (``TRITON_INTERPRET=1``,
NumPy arithmetic, no multiply-add contraction) against the formula it implements, written
out here in float64 torch ops; whether the compiled kernel matches torch's CUDA fused Adam
bit for bit is measured on a GPU (``benchmarks/bench_o2_update.py --check``)."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import math
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import ampcore
from ampcore._o2 import master_kernel

BF16, FP16 = torch.bfloat16, torch.float16
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (optional: pip install triton)")


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The Triton kernel module, compiled for Triton's interpreter (CPU tensors)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from ampcore._o2 import triton_adam

    yield importlib.reload(triton_adam)
    monkeypatch.delenv("TRITON_INTERPRET")
    importlib.reload(triton_adam)  # as the environment compiles it


def model_and_opt(dtype: torch.dtype = BF16, **options: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(37, 61), nn.LayerNorm(61), nn.Linear(61, 5))
    options.setdefault("lr", 1e-2)
    kind = torch.optim.AdamW if options.pop("adamw", True) else torch.optim.Adam
    return ampcore.decorate(model, kind(model.parameters(), **options), device="cpu", dtype=dtype)


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, first: int = 0) -> None:
    for seed in range(first, first + steps):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(8, 37, generator=gen)
        opt.zero_grad()
        with ampcore.autocast(device="cpu", level="O2"):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()


# -- the option --------------------------------------------------------------------------
def test_the_default_kernel_is_torchs() -> None:
    _, opt = model_and_opt(fused=True)
    assert ampcore.get_master_update_kernel(opt) == "torch"


def test_a_wrong_kernel_name_lists_the_choices_and_changes_nothing() -> None:
    _, opt = model_and_opt(fused=True)
    with pytest.raises(ampcore.AmpcoreError, match=r"kernel='cuda'.*expected one of torch, triton"):
        ampcore.set_master_update_kernel(opt, "cuda")  # type: ignore[arg-type]
    assert ampcore.get_master_update_kernel(opt) == "torch"


def test_an_optimizer_without_master_weights_is_refused() -> None:
    opt = torch.optim.AdamW(nn.Linear(2, 2).parameters())
    with pytest.raises(ampcore.AmpcoreError, match="has no ampcore master weights"):
        ampcore.set_master_update_kernel(opt, "torch")
    with pytest.raises(ampcore.AmpcoreError, match="has no ampcore master weights"):
        ampcore.get_master_update_kernel(opt)


def test_triton_without_triton_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    _, opt = model_and_opt(fused=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(ampcore.AmpcoreError, match="Triton is not installed.*stays 'torch'"):
        ampcore.set_master_update_kernel(opt, "triton")
    assert ampcore.get_master_update_kernel(opt) == "torch"


@needs_triton
def test_triton_on_a_device_triton_does_not_drive_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the interpreter, the CPU masters are no device of Triton's (whatever GPU
    the machine has)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _, opt = model_and_opt(fused=True)
    with pytest.raises(ampcore.AmpcoreError, match="kernel='triton'"):
        ampcore.set_master_update_kernel(opt, "triton")


# -- the Triton kernel -----------------------------------------------------------------------
def reference_step(
    group: dict[str, Any], state: dict[str, torch.Tensor], master: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """The kernel's formula (torch's CUDA fused Adam), in float64 torch ops rounded as
    documented in ``triton_adam.py``; updates ``state`` and returns the new master."""
    state["step"] += 1
    lr, (beta1, beta2), decay, eps = group["lr"], group["betas"], group["weight_decay"], group["eps"]
    count = float(state["step"])
    correction1 = torch.tensor(1 - beta1**count, dtype=torch.float64).float().double()
    correction2_sqrt = torch.tensor(math.sqrt(1 - beta2**count), dtype=torch.float64).float()
    step_size = (lr / correction1).float()
    g = -grad.float() if group["maximize"] else grad.float()
    p = master.clone()
    if decay and group["decoupled_weight_decay"]:
        p = (p.double() - lr * decay * p.double()).float()
    elif decay:
        g = (g.double() + p.double() * decay).float()
    state["exp_avg"] = (beta1 * state["exp_avg"].double() + (1 - beta1) * g.double()).float()
    state["exp_avg_sq"] = (beta2 * state["exp_avg_sq"].double() + (1 - beta2) * g.double() * g.double()).float()
    top = state["exp_avg_sq"]
    if group["amsgrad"]:
        top = state["max_exp_avg_sq"] = torch.maximum(state["max_exp_avg_sq"], top)
    root = top.double().sqrt().float()  # correctly rounded (torch's float sqrt on the CPU is not)
    denom = ((root / correction2_sqrt).double() + eps).float()
    return p - step_size * state["exp_avg"] / denom


def assert_refreshed(low: torch.Tensor, master: torch.Tensor) -> None:
    """``low`` is ``master`` rounded to nearest even (on a device: ``fptrunc``).  Triton's
    interpreter truncates float32 to bfloat16 instead (NumPy has no bfloat16): there,
    within one bfloat16 step, towards zero."""
    if low.dtype != BF16:
        assert torch.equal(low, master.to(low.dtype))
        return
    nearest = master.to(BF16)
    truncated = (master.view(torch.int32) & ~0xFFFF).view(torch.float32).to(BF16)
    assert bool(((low == nearest) | (low == truncated)).all())
    assert not torch.equal(low, torch.zeros_like(low))


CASES: dict[str, dict[str, Any]] = {
    "adamw": {"adamw": True, "weight_decay": 0.05},
    "adam-decay": {"adamw": False, "weight_decay": 0.05},
    "adam-amsgrad-maximize": {"adamw": False, "amsgrad": True, "maximize": True},
    "adamw-no-decay-fp16": {"adamw": True, "weight_decay": 0.0, "dtype": FP16},
}


@needs_triton
@pytest.mark.parametrize("case", list(CASES))
def test_the_triton_kernel_computes_its_formula_bit_for_bit(case: str, interpreted: Any) -> None:
    options = dict(CASES[case])
    dtype = options.pop("dtype", BF16)
    model, opt = model_and_opt(dtype, fused=True, **options)
    ampcore.set_master_update_kernel(opt, "triton")
    group = opt.param_groups[0]
    masters = list(dict.__getitem__(group, "params"))
    lows = [p for p in model.parameters()]
    expected = [m.detach().clone() for m in masters]
    states: list[dict[str, torch.Tensor]] = [{} for _ in masters]
    for step in range(3):
        train(model, opt, 1, first=step)
        for index, (low, master) in enumerate(zip(lows, masters, strict=True)):
            grad = low.grad if low.dtype != torch.float32 else master.grad
            state = states[index]
            if not state:
                state.update({k: torch.zeros_like(master) for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")})
                state["step"] = torch.zeros(())
            expected[index] = reference_step(group, state, expected[index], grad)
    for master, low, want, state in zip(masters, lows, expected, states, strict=True):
        if low.dtype == torch.float32:  # the LayerNorm: torch's own fused Adam, not the kernel
            continue
        assert torch.equal(master, want)
        assert torch.equal(opt.state[master]["exp_avg_sq"], state["exp_avg_sq"])
        assert_refreshed(low, master)
        assert opt.state[master]["step"].dtype == torch.float32 and float(opt.state[master]["step"]) == 3


@needs_triton
def test_the_triton_kernel_runs_once_per_tensor_and_only_for_fused_groups(
    interpreted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One launch per low-precision parameter of a ``fused=True`` group, no float32
    gradient copies; a foreach group keeps torch's kernels (and stays bit-identical)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(37, 61), nn.LayerNorm(61), nn.Linear(61, 5))
    params = list(model.parameters())
    torch_model = copy.deepcopy(model)

    def groups(ps: list[nn.Parameter]) -> list[dict[str, Any]]:
        return [{"params": ps[:2], "fused": True}, {"params": ps[2:], "foreach": True}]

    model, opt = ampcore.decorate(model, torch.optim.AdamW(groups(params), lr=1e-2), device="cpu")
    ampcore.set_master_update_kernel(opt, "triton")
    launches: list[int] = []
    launch = interpreted.launch_adam
    monkeypatch.setattr(interpreted, "launch_adam", lambda g, m, *rest: launches.append(len(m)) or launch(g, m, *rest))
    train(model, opt, 1)  # the same gradients as torch's run below: the step alone differs
    torch_model, torch_opt = ampcore.decorate(
        torch_model, torch.optim.AdamW(groups(list(torch_model.parameters())), lr=1e-2), device="cpu"
    )
    train(torch_model, torch_opt, 1)
    for got, want in zip(opt.param_groups[1]["params"], torch_opt.param_groups[1]["params"], strict=True):
        assert torch.equal(got, want)
    train(model, opt, 1, first=1)
    assert launches == [2, 2]  # the first Linear's weight and bias, each step
    masters = dict.__getitem__(opt.param_groups[0], "params")  # (a plain read would sync the gradients)
    assert all(master.grad is None for master in masters)  # no float32 gradient copies were made


@needs_triton
def test_state_dicts_are_interchangeable_with_torchs_kernel(interpreted: Any) -> None:
    model, opt = model_and_opt(fused=True, weight_decay=0.01)
    ampcore.set_master_update_kernel(opt, "triton")
    train(model, opt, 2)
    other_model, other = model_and_opt(fused=True, weight_decay=0.01)
    train(other_model, other, 2)
    ours, theirs = opt.state_dict(), other.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for key, state in ours["state"].items():
        assert state.keys() == theirs["state"][key].keys()
        for name, value in state.items():
            assert (value.dtype, value.shape, value.device) == (
                theirs["state"][key][name].dtype, theirs["state"][key][name].shape, theirs["state"][key][name].device,
            )  # fmt: skip
    other.load_state_dict(ours)  # and training goes on with torch's kernel from it
    other_model.load_state_dict(model.state_dict())
    for key, state in other.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(value, ours["state"][key][name])
    train(other_model, other, 1, first=2)
    assert all(torch.isfinite(p).all() for p in other_model.parameters())
    assert float(other.state_dict()["state"][0]["step"]) == 3


def test_what_the_kernel_cannot_take_keeps_torchs_kernel() -> None:
    """A tensor ``lr``, ``capturable``, a strided gradient, a float32 parameter without a
    low-precision one: left to torch's Adam (``triton_update`` returns them), before Triton is even imported."""
    state = {"step": torch.zeros(()), "exp_avg": torch.zeros(4), "exp_avg_sq": torch.zeros(4)}
    strided = torch.zeros(8, dtype=BF16)[::2]
    work: Any = [
        (torch.zeros(4), strided, torch.zeros(4, dtype=BF16), state),
        (torch.zeros(4), torch.zeros(4), None, state),
    ]
    group = {"lr": 0.1, "amsgrad": False}
    assert master_kernel.triton_update(group, work) == work
    assert master_kernel.triton_update({"lr": torch.tensor(0.1), "amsgrad": False}, work[:1]) == work[:1]
    assert master_kernel.triton_update({"lr": 0.1, "amsgrad": False, "capturable": True}, work[:1]) == work[:1]


@needs_triton
def test_float32_hyperparameters_round_them_first(interpreted: Any) -> None:
    """The bench's diagnostic variant: the same formula with lr, betas, decay and eps
    rounded to float32 (what a torch computing with float32 hyperparameters would use)."""
    group = {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.01, "eps": 1e-8}
    group.update({"amsgrad": False, "maximize": False, "decoupled_weight_decay": True})
    rounded = {**group, "lr": float(torch.tensor(1e-3)), "betas": tuple(float(torch.tensor(b)) for b in (0.9, 0.999))}
    rounded.update({"weight_decay": float(torch.tensor(0.01)), "eps": float(torch.tensor(1e-8))})
    torch.manual_seed(0)
    master, grad = torch.randn(3000), torch.randn(3000).to(FP16)
    low = master.to(FP16)
    state = {"step": torch.zeros(()), "exp_avg": torch.zeros(3000), "exp_avg_sq": torch.zeros(3000)}
    fresh = {name: value.clone() for name, value in state.items()}
    mirror = {name: value.clone() for name, value in state.items()}
    want = reference_step(rounded, mirror, master.clone(), grad)
    assert not torch.equal(want, reference_step(group, fresh, master.clone(), grad))  # the rounding shows
    interpreted.launch_adam(group, [master], [grad], [low], [state], precision="float32-hyperparameters")
    assert torch.equal(master, want) and torch.equal(state["exp_avg_sq"], mirror["exp_avg_sq"])


@needs_triton
def test_float32_arithmetic_is_float32_throughout(interpreted: Any) -> None:
    """The other diagnostic: every operation in float32 (rounded at each step)."""
    group = {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.01, "eps": 1e-8}
    group.update({"amsgrad": False, "maximize": False, "decoupled_weight_decay": True})
    torch.manual_seed(0)
    master, grad = torch.randn(3000), torch.randn(3000).to(FP16)
    low = master.to(FP16)
    state = {"step": torch.zeros(()), "exp_avg": torch.zeros(3000), "exp_avg_sq": torch.zeros(3000)}
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    lr, beta1, beta2, decay, eps = (f32(x) for x in (1e-3, 0.9, 0.999, 0.01, 1e-8))
    count = f32(1.0)
    correction1 = 1 - torch.pow(beta1, count)
    correction2_sqrt = (1 - torch.pow(beta2, count)).double().sqrt().float()
    p = master - lr * decay * master
    g = grad.float()
    m = (1 - beta1) * g  # + beta1 * 0
    v = (1 - beta2) * g * g
    denom = (v.double().sqrt().float() / correction2_sqrt) + eps
    want = p - (lr / correction1) * m / denom
    interpreted.launch_adam(group, [master], [grad], [low], [state], precision="float32")
    assert torch.equal(state["exp_avg"], m) and torch.equal(state["exp_avg_sq"], v)
    assert torch.equal(master, want)
    with pytest.raises(ValueError, match="precision='float16'"):
        interpreted.launch_adam(group, [master], [grad], [low], [state], precision="float16")


def scaled_train(model: nn.Module, opt: torch.optim.Optimizer, scaler: ampcore.GradScaler, seeds: range) -> None:
    for seed in seeds:
        x = torch.randn(8, 37, generator=torch.Generator().manual_seed(seed))
        opt.zero_grad()
        with ampcore.autocast(device="cpu", level="O2", dtype=FP16):
            loss = model(x).float().pow(2).mean() * (1e9 if seed == 1 else 1.0)  # step 1 overflows
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


@needs_triton
def test_under_gradscaler_the_triton_kernel_is_not_used_and_says_so(
    interpreted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ampcore.GradScaler hands fused optimizers its scale (torch's fused kernel unscales
    inside): that step is torch's, on float32 gradient copies; one warning says so, and
    the results are torch's kernel's (the overflowing step skipped, the scale backed off)."""
    launches: list[int] = []
    launch = interpreted.launch_adam
    monkeypatch.setattr(interpreted, "launch_adam", lambda g, m, *rest: launches.append(len(m)) or launch(g, m, *rest))
    runs = []
    for kernel in ("torch", "triton"):
        model, opt = model_and_opt(FP16, fused=True)
        ampcore.set_master_update_kernel(opt, kernel)  # type: ignore[arg-type]
        scaler = ampcore.GradScaler(device="cpu", dtype=FP16, init_scale=1024.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scaled_train(model, opt, scaler, range(5))
        unused = [w for w in caught if issubclass(w.category, master_kernel.TritonKernelUnusedWarning)]
        assert len(unused) == (kernel == "triton")
        assert all("GradScaler handed the fused optimizer its scale" in str(w.message) for w in unused)
        assert scaler.get_scale() == 512.0  # one overflow (seed 1) backed off, no growth in 5 steps
        runs.append([m.detach().clone() for m in dict.__getitem__(opt.param_groups[0], "params")])
    assert launches == []
    for want, got in zip(*runs, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("kind", "options", "why"),
    [
        (torch.optim.SGD, {"momentum": 0.9}, "runs torch.optim.Adam and AdamW updates, not SGD's"),
        (torch.optim.AdamW, {"fused": False}, "param groups with fused=True, and this optimizer has none"),
    ],
)
def test_triton_for_an_update_it_never_runs_is_refused(kind: Any, options: dict[str, Any], why: str) -> None:
    model = nn.Linear(4, 4)
    model, opt = ampcore.decorate(model, kind(model.parameters(), lr=0.1, **options), device="cpu")
    with pytest.raises(ampcore.AmpcoreError, match=why):
        ampcore.set_master_update_kernel(opt, "triton")
    assert ampcore.get_master_update_kernel(opt) == "torch"
