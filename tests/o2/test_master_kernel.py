"""The kernel of O2's Adam/AdamW master update (issue 31): torch's (the default), or
ampcore's one-pass Triton kernel for ``fused=True`` groups (``set_master_update_kernel``).

The Triton tests run the kernel in Triton's interpreter on the CPU (``TRITON_INTERPRET=1``,
NumPy arithmetic, its ``fma`` rounding once) against torch's CUDA fused Adam transcribed
operation by operation (``fused_adam_reference.py``, both versions of the source); that the
compiled kernel and the transcription match torch's CUDA kernel bit for bit is checked on
a GPU (``benchmarks/bench_o2_update.py --check``)."""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fused_adam_reference import interpreter_fma_unfused, reference_step
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
    monkeypatch.setattr(
        interpreted, "launch_adam", lambda g, m, *rest, **kw: launches.append(len(m)) or launch(g, m, *rest, **kw)
    )
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
def test_under_gradscaler_the_triton_kernel_runs_with_the_scalers_tensors(
    interpreted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ampcore.GradScaler hands fused optimizers its scale and found-inf flag, as torch's
    does: the Triton kernel takes them (no warning, no float32 gradient copies), every
    step is torch's CUDA fused Adam on those gradients (the transcription), the
    overflowing step skipped with its step count, the scale backed off."""
    # bit for bit where the interpreter's tl.fma rounds once; Triton 3.4's rounds twice, a
    # last-bit difference in some elements (masters off by < 1e-6 after 3 steps of lr 1e-2)
    exact = interpreter_fma_unfused() is None
    same = torch.equal if exact else functools.partial(torch.allclose, rtol=1e-5, atol=1e-6)
    launches: list[int] = []
    launch = interpreted.launch_adam
    monkeypatch.setattr(
        interpreted, "launch_adam", lambda g, m, *rest, **kw: launches.append(len(m)) or launch(g, m, *rest, **kw)
    )
    model, opt = model_and_opt(FP16, fused=True, weight_decay=0.01)
    ampcore.set_master_update_kernel(opt, "triton")
    group = opt.param_groups[0]
    masters = list(dict.__getitem__(group, "params"))
    lows = list(model.parameters())
    expected = [m.detach().clone() for m in masters]
    states: list[dict[str, torch.Tensor]] = [{} for _ in masters]
    scaler = ampcore.GradScaler(device="cpu", dtype=FP16, init_scale=1024.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", master_kernel.TritonKernelUnusedWarning)
        for seed in range(4):
            scale = torch.tensor(scaler.get_scale())
            x = torch.randn(8, 37, generator=torch.Generator().manual_seed(seed))
            opt.zero_grad()
            with ampcore.autocast(device="cpu", level="O2", dtype=FP16):
                loss = model(x).float().pow(2).mean() * (1e9 if seed == 1 else 1.0)  # step 1 overflows
            scaler.scale(loss).backward()
            grads = [low.grad.clone() for low in lows]
            found = torch.tensor(float(not all(bool(g.isfinite().all()) for g in grads)))
            scaler.step(opt)
            scaler.update()
            for index, (low, grad) in enumerate(zip(lows, grads, strict=True)):
                if low.dtype == torch.float32:
                    continue
                state = states[index]
                if not state:
                    state.update({k: torch.zeros_like(masters[index]) for k in ("exp_avg", "exp_avg_sq")})
                    state["step"] = torch.zeros(())
                reference_step(group, state, expected[index], grad, grad_scale=scale, found_inf=found)
    assert scaler.get_scale() == 512.0  # one overflow (seed 1) backed off
    assert launches == [4] * 4  # one call a step (the skipped one too: found_inf stays on the device)
    for master, low, want, state in zip(masters, lows, expected, states, strict=True):
        if low.dtype == torch.float32:  # the LayerNorm: torch's own fused Adam, not the kernel
            continue
        assert same(master, want)
        assert same(opt.state[master]["exp_avg_sq"], state["exp_avg_sq"])
        assert float(opt.state[master]["step"]) == float(state["step"]) == 3  # the skipped step not counted
        assert_refreshed(low, master)


@needs_triton
def test_a_step_ampcore_does_not_run_itself_says_once_that_torchs_kernel_ran(interpreted: Any) -> None:
    """A step hook: torch's fused kernel on float32 copies, one warning per optimizer."""
    model, opt = model_and_opt(fused=True)
    ampcore.set_master_update_kernel(opt, "triton")
    opt.register_step_pre_hook(lambda *_: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, opt, 2)
    unused = [w for w in caught if issubclass(w.category, master_kernel.TritonKernelUnusedWarning)]
    assert len(unused) == 1 and "step hooks" in str(unused[0].message)


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
