"""The one-pass CPU master update of torch's default (for-loop) optimizer flavour
(``ampcore/_o2/onepass_loop.py``, issues 26 and 31): torch's ``_single_tensor_adam`` /
``_single_tensor_sgd`` from low-precision gradients in one pass per tensor, bit-identical to
torch's for-loop optimizer on float32 masters with the widened gradients, never assumed:
compared here on many sizes (lerp's vector runs and scalar tails, several thread chunks),
options, dtypes, thread counts, CPU capabilities, and against torch's foreach flavour.

The choice logic is tested as pure functions (no compiler needed); the kernel's tests skip
where it cannot be built.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from _onepass_testing import SGD_CASES, run_at_capability, threads  # noqa: F401 (a fixture, used by name)
from test_scaler_deferred_unscale import (
    OVERFLOW_AT,
    Params,
    batches,
    first_weight,
    loss_of,
    make_model,
    snapshot,
)
from test_scaler_deferred_unscale import reference as scaled_reference

import ampcore
from ampcore._o2 import onepass, onepass_choice, onepass_loop, onepass_loop_check
from ampcore._o2.master import master_weights_of
from ampcore._o2.onepass_loop_check import adam_case, sgd_case
from ampcore._o2.update_walk import UpdateWalk

BF16, FP16 = torch.bfloat16, torch.float16

# -- the choice, as pure functions ---------------------------------------------------------


def test_layouts_of_torchs_capabilities() -> None:
    assert onepass_loop.LAYOUTS["AVX512"] == (16, True)
    assert onepass_loop.LAYOUTS["AVX2"] == (16, True)
    assert onepass_loop.LAYOUTS["DEFAULT"] == (16, False)  # torch's DEFAULT kernels fuse nothing


def test_which_groups_the_kernel_may_take() -> None:
    adam = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "fused": None, "foreach": None}
    assert onepass_loop.takes(adam)
    assert onepass_loop.takes({**adam, "foreach": True})  # torch's CPU foreach: the same bits
    assert not onepass_loop.takes({**adam, "fused": True})  # onepass.py's kernel
    assert not onepass_loop.takes({**adam, "capturable": True})
    assert not onepass_loop.takes({**adam, "differentiable": True})
    assert not onepass_loop.takes({**adam, "lr": torch.tensor(1e-3)})
    assert not onepass_loop.takes({**adam, "betas": (torch.tensor(0.9), 0.999)})
    assert onepass_loop.takes({"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0})


def _chooser(monkeypatch: pytest.MonkeyPatch, wanted: str, mismatch: str | None) -> Any:
    monkeypatch.setenv(onepass.ENV, wanted)
    monkeypatch.setattr(onepass_loop, "missing_tools", lambda: None)
    monkeypatch.setattr(onepass_loop, "_build", lambda capability: ModuleType("stand_in"))
    monkeypatch.setattr(onepass_loop_check, "self_check", lambda module, layout: mismatch)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    return onepass_choice.Chooser(onepass_loop.LOOP)


def test_a_self_check_mismatch_warns_once_and_keeps_torchs_path(monkeypatch: pytest.MonkeyPatch) -> None:
    chooser = _chooser(monkeypatch, "auto", "for-loop Adam {...}: master differ")
    with pytest.warns(onepass.OnePassWarning, match="for-loop optimizers is not used .*differs from torch's for-loop"):
        assert chooser.choose().name == "torch"
    assert chooser.choose().name == "torch"  # decided once: no second warning
    assert chooser.module is None


def test_compiled_raises_where_it_cannot_and_torch_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ampcore.AmpcoreError, match="AMPCORE_O2_ONEPASS=compiled, but .* for-loop"):
        _chooser(monkeypatch, "compiled", "it differs").choose()
    chooser = _chooser(monkeypatch, "auto", None)
    assert chooser.choose().name == "onepass" and chooser.layout == (16, True)
    monkeypatch.setattr(onepass_loop, "_build", lambda capability: pytest.fail("built"))
    monkeypatch.setenv(onepass.ENV, "torch")
    assert onepass_choice.Chooser(onepass_loop.LOOP).choose() == ("torch", "AMPCORE_O2_ONEPASS=torch")


def test_describe_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onepass_loop, "_chooser", onepass_choice.Chooser(onepass_loop.LOOP))
    monkeypatch.setattr(onepass_loop, "_build", lambda capability: pytest.fail("built"))
    monkeypatch.setenv(onepass.ENV, "torch")
    assert onepass_loop.describe() == "torch (AMPCORE_O2_ONEPASS=torch)"
    monkeypatch.setenv(onepass.ENV, "auto")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "VSX")
    assert "capability VSX is not transcribed" in onepass_loop.describe()
    monkeypatch.setenv(onepass.ENV, "nope")
    assert onepass_loop.describe().startswith("invalid: AMPCORE_O2_ONEPASS='nope'")


def test_ampcore_info_names_both_flavours() -> None:
    from ampcore._cli.info import collect_info, format_info

    info = collect_info()
    assert "o2_cpu_update" in info and "o2_cpu_loop_update" in info
    assert "O2 for-loop/foreach CPU master update: " in format_info(info, width=None)


# -- the kernel against torch's -----------------------------------------------------------


@pytest.fixture(scope="module")
def kernel() -> Iterator[tuple[ModuleType, onepass_loop.LoopLayout]]:
    if onepass_loop.missing_tools() is not None:
        pytest.skip(f"the one-pass kernel is built at first use: {onepass_loop.missing_tools()}")
    if onepass_loop.loop_choice().name != "onepass":
        pytest.skip(f"the one-pass kernel is not used here: {onepass_loop.loop_choice().reason}")
    assert onepass_loop._chooser.module is not None and onepass_loop._chooser.layout is not None
    yield onepass_loop._chooser.module, onepass_loop._chooser.layout


#: lerp's vector run of 16 with tails of every length 0-15, several runs, more than a
#: thread grain (32768) so that two threads split it, and 2 threads' uneven halves
SIZES = (1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 31, 32, 33, 47, 100, 1000, 4099, 33_000, 70_001)
ADAM_CASES: list[dict[str, Any]] = [
    {"adamw": True, "weight_decay": 0.01, "amsgrad": False, "maximize": False, "betas": (0.9, 0.999)},
    {"adamw": False, "weight_decay": 0.0, "amsgrad": False, "maximize": False, "betas": (0.9, 0.999)},
    {"adamw": False, "weight_decay": 0.1, "amsgrad": True, "maximize": True, "betas": (0.8, 0.99)},
    {"adamw": True, "weight_decay": 0.1, "amsgrad": True, "maximize": False, "betas": (0.0, 0.5), "scale": 1024.0},
    {"adamw": False, "weight_decay": 0.05, "amsgrad": False, "maximize": True, "betas": (0.6, 0.9), "scale": 8.0},
    {"adamw": True, "weight_decay": 0.0, "amsgrad": False, "maximize": False, "betas": (0.95, 0.0)},
]


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.usefixtures("threads")
def test_adam_is_torchs_for_loop_adam_bit_for_bit(kernel: Any, dtype: torch.dtype) -> None:
    module, layout = kernel
    failures = [
        (n, index, differ)
        for n in SIZES
        for index, case in enumerate(ADAM_CASES)
        if (differ := adam_case(module, layout, n, dtype, case, seed=n + index))
    ]
    assert failures == []


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.usefixtures("threads")
def test_sgd_is_torchs_for_loop_sgd_bit_for_bit(kernel: Any, dtype: torch.dtype) -> None:
    module, layout = kernel
    failures = [
        (n, index, differ)
        for n in SIZES
        for index, case in enumerate(SGD_CASES)
        if (differ := sgd_case(module, layout, n, dtype, case, seed=n + index))
    ]
    assert failures == []


def test_torchs_cpu_foreach_flavour_gives_the_same_bits(kernel: Any) -> None:
    """torch's foreach Adam/SGD on the CPU runs the same per-tensor kernels in the same order:
    the kernel equals it too (so ``foreach=True`` groups run it)."""
    module, layout = kernel
    failures = [
        (n, kind, index, differ)
        for n in (1, 31, 1000, 70_001)
        for kind, cases, case_of in (("adam", ADAM_CASES, adam_case), ("sgd", SGD_CASES, sgd_case))
        for index, case in enumerate(cases)
        if (differ := case_of(module, layout, n, BF16, case, seed=n + index, foreach=True))
    ]
    assert failures == []


def test_the_square_root_is_torchs_not_a_correctly_rounded_one(kernel: Any) -> None:
    """torch's float32 sqrt (MKL's, where torch has it) rounds about 1 value in 200 away from
    the correctly rounded square root: the kernel's denominators are torch's."""
    from torch.optim.adam import _single_tensor_adam

    n = 20_000
    x = torch.rand(n) * torch.exp2(torch.randint(-30, 10, (n,)).float()) + 1e-30
    if torch.equal(x.sqrt(), x.double().sqrt().float()):
        pytest.skip("this torch's sqrt is correctly rounded here: nothing to tell apart")
    module, layout = kernel

    def start() -> list[torch.Tensor]:  # master, exp_avg, exp_avg_sq, step
        return [torch.zeros(n), torch.ones(n), x.clone(), torch.zeros(())]

    p, m, v, step = start()
    hyper = (0.5, 0.5, 0.5, 0.0, 0.0)  # lr, betas, no decay, eps 0: the denominator is sqrt(v) / sqrt(0.5)
    module.adam([p], [torch.zeros(n, dtype=BF16)], [p.to(BF16)], [m], [v], [], [step], *hyper, False, False, False,
                None, *layout)  # fmt: skip
    want = start()
    _single_tensor_adam(
        [want[0]], [torch.zeros(n)], [want[1]], [want[2]], [], [want[3]], None, None, amsgrad=False, has_complex=False,
        beta1=0.5, beta2=0.5, lr=0.5, weight_decay=0.0, eps=0.0, maximize=False, capturable=False,
        differentiable=False, decoupled_weight_decay=False,
    )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip((p, m, v, step), want, strict=True))
    exact = torch.zeros(n).addcdiv_(want[1], want[2].double().sqrt().float() / 0.5**0.5, value=-1.0)
    assert not torch.equal(exact, p)  # a correctly rounded square root would have differed


def test_wrong_tensors_are_refused_before_anything_is_written(kernel: Any) -> None:
    module, layout = kernel
    p, g = torch.randn(8), torch.randn(8).bfloat16()
    before = p.clone()
    with pytest.raises(RuntimeError, match="a gradient must be a contiguous CPU tensor of BFloat16"):
        module.sgd([p, p.clone()], [g, g[::2]], [p.bfloat16(), p.bfloat16()], [], [], 0.0, 0.0, 0.1, 0.0, False,
                   False, None, *layout)  # fmt: skip
    assert torch.equal(p, before)
    with pytest.raises(RuntimeError, match="a step count must be a float32 CPU tensor"):
        step = torch.zeros((), dtype=torch.float64)
        module.adam([p], [g], [p.bfloat16()], [torch.zeros(8)], [torch.zeros(8)], [], [step], 1e-3, 0.9, 0.999, 0.0,
                    1e-8, False, False, False, None, *layout)  # fmt: skip
    assert torch.equal(p, before)


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_other_capabilities_in_a_subprocess(kernel: Any, capability: str) -> None:
    """torch's AVX2 and DEFAULT kernels (DEFAULT fuses nothing): the kernel built for them
    against torch's for-loop optimizers at that capability."""
    script = textwrap.dedent(
        """
        import torch
        from ampcore._o2 import onepass_choice, onepass_loop
        from ampcore._o2.onepass_loop_check import adam_case, sgd_case
        import test_onepass_loop as t
        made = onepass_loop.loop_choice()
        print(onepass_choice.cpu_capability(), made.name)
        if made.name == "onepass":
            module, layout = onepass_loop._chooser.module, onepass_loop._chooser.layout
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for dtype in (torch.bfloat16, torch.float16):
                    for n in t.SIZES:
                        for i, case in enumerate(t.ADAM_CASES):
                            assert not adam_case(module, layout, n, dtype, case, seed=n + i), ("adam", n, dtype, case)
                        for i, case in enumerate(t.SGD_CASES):
                            assert not sgd_case(module, layout, n, dtype, case, seed=n + i), ("sgd", n, dtype, case)
        else:
            print(made.reason)
        """
    )
    run_at_capability(script, capability)


# -- O2 end to end ------------------------------------------------------------------------

DEFAULT: dict[str, Callable[[Params], torch.optim.Optimizer]] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adam-amsgrad-wd-maximize": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, weight_decay=0.01, maximize=True),
    "adam-beta1-0-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.0, 0.9), foreach=True),
    "sgd-decay": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.01),
    "sgd-nesterov-maximize": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, maximize=True),
    "sgd-dampening-foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, dampening=0.3, foreach=True),
}
Run = tuple[list[list[torch.Tensor]], list[float]]


@pytest.fixture
def calls(kernel: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the kernel ran (its functions wrapped)."""
    module, _ = kernel
    counted: dict[str, int] = {"adam": 0, "sgd": 0}
    wrapper = ModuleType("counted")
    for name in counted:
        original = getattr(module, name)

        def run(*args: Any, _name: str = name, _original: Any = original) -> Any:
            counted[_name] += 1
            return _original(*args)

        setattr(wrapper, name, run)
    monkeypatch.setattr(onepass_loop._chooser, "module", wrapper)
    return counted


def train(name: str, dtype: torch.dtype, *, scaler: bool = True, whole: bool = False) -> tuple[Run, Any]:
    """Five steps of a decorated model (a weight larger than a chunk), under ampcore's
    GradScaler with an overflow at :data:`OVERFLOW_AT` (``scaler``), or plain steps with a
    step with a non-finite gradient skipped by hand; ``whole``: the whole-tensor walk (the kept Adam plans'
    walk) instead of the CPU's timed one.  Also returns the optimizer."""
    model = make_model(norm=False, wide=True)
    opt = DEFAULT[name](model.parameters())
    model, opt = ampcore.decorate(model, opt, dtype=dtype, device="cpu")
    if whole:
        weights = master_weights_of(opt)
        assert weights is not None
        weights.walk = UpdateWalk(None)
    scaling = ampcore.GradScaler("cpu", dtype=dtype, init_scale=1024.0) if scaler else None
    states, scales = [], []
    for index, (x, y) in enumerate(batches()):
        opt.zero_grad()
        loss = loss_of(model, x.to(dtype), y)
        (loss if scaling is None else scaling.scale(loss)).backward()
        if index == OVERFLOW_AT:
            first_weight(model).grad[0, 0] = float("inf")
        if scaling is not None:
            scaling.step(opt)
            scaling.update()
        elif all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None):
            opt.step()  # (as the reference skips a step with a non-finite gradient)
        states.append(snapshot(opt, model))
        scales.append(1.0 if scaling is None else scaling.get_scale())
    return (states, scales), opt


def assert_same(got: Run, want: Run) -> None:
    assert got[1] == want[1]
    for step, (mine, theirs) in enumerate(zip(got[0], want[0], strict=True)):
        assert len(mine) == len(theirs), f"step {step}"
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)), f"step {step}"


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(DEFAULT))
def test_o2_under_gradscaler_is_torchs_for_loop_optimizer(name: str, dtype: torch.dtype, calls: dict[str, int]) -> None:
    """decorate + ampcore.GradScaler (an overflow at the third step): torch's for-loop (or
    foreach) optimizer on float32 masters under torch's GradScaler, bit for bit, the kernel
    running every clean step (float16's deferred unscale done by the kernel as it reads the
    gradients, ``scaled_update.py``; bfloat16 needs no scaling)."""
    got, _ = train(name, dtype)
    assert_same(got, scaled_reference(name, dtype, factories=DEFAULT, wide=True, scaling=dtype == FP16))
    scales = got[1]
    clean = sum(after >= before for before, after in zip([scales[0], *scales], scales, strict=False))
    clean = clean if dtype == FP16 else len(scales) - 1  # (bfloat16: no scaling, the inf step skipped)
    assert calls["adam" if "adam" in name else "sgd"] == clean


@pytest.mark.parametrize("name", ["adamw", "sgd-nesterov-maximize"])
def test_float16_under_gradscaler_makes_no_float32_gradient(name: str, calls: dict[str, int]) -> None:
    """The deferred unscale of a float16 scaler step is the kernel's: no master holds a
    float32 gradient during the step, and no float32 tensor of a gradient's size is made."""
    from test_scaler_deferred_unscale import MasterGradWatch, masters_of

    model = make_model(norm=False, wide=True)
    opt = DEFAULT[name](model.parameters())
    model, opt = ampcore.decorate(model, opt, dtype=FP16, device="cpu")
    scaler = ampcore.GradScaler("cpu", dtype=FP16, init_scale=16.0)  # (no overflow: every step clean)
    watches = []
    for x, y in batches()[:3]:
        opt.zero_grad()
        scaler.scale(loss_of(model, x.to(FP16), y)).backward()
        watches.append(MasterGradWatch(masters_of(opt), floor=64))
        with watches[-1]:
            scaler.step(opt)
        scaler.update()
    assert calls["adam" if "adam" in name else "sgd"] == 3
    assert all(watch.most_grad_bytes == 0 for watch in watches)
    assert all(watch.most_live == 0 for watch in watches[1:])  # (the first step makes the state)


@pytest.mark.parametrize("whole", [False, True], ids=["timed-walk", "whole-tensors"])
@pytest.mark.parametrize("name", list(DEFAULT))
def test_o2_runs_the_kernel_and_is_torchs_for_loop_optimizer(name: str, whole: bool, calls: dict[str, int]) -> None:
    """float16 without a scaler (a step with a non-finite gradient skipped by hand): the
    clean steps run the kernel, on either walk; the results, step counts and momentum
    buffers are torch's."""
    got, _ = train(name, FP16, scaler=False, whole=whole)
    assert_same(got, scaled_reference(name, FP16, factories=DEFAULT, wide=True, scaling=False))
    assert calls["adam" if "adam" in name else "sgd"] >= 3


def test_groups_the_kernel_takes_keep_no_adam_plan(calls: dict[str, int]) -> None:
    _, opt = train("adamw", BF16, scaler=False, whole=True)
    weights = master_weights_of(opt)
    assert weights is not None and calls["adam"] == 4
    assert not any(weights.adam_plans._plans)  # (the plans' walk would widen into a scratch)


def test_state_dicts_are_those_of_torchs_path(kernel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimizer's state dict with the kernel equals the one torch's path leaves: the
    same keys, tensors (dtypes, layouts, values) and step counts, so either resumes the other."""
    _, mine = train("adam-amsgrad-wd-maximize", BF16, scaler=False)
    monkeypatch.setattr(onepass_loop, "_module", lambda: None)
    _, theirs = train("adam-amsgrad-wd-maximize", BF16, scaler=False)
    a, b = mine.state_dict(), theirs.state_dict()
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for key, state in a["state"].items():
        assert state.keys() == b["state"][key].keys()
        for name, value in state.items():
            other = b["state"][key][name]
            assert value.dtype == other.dtype and value.stride() == other.stride() and torch.equal(value, other)


def test_a_mismatch_at_first_use_warns_and_trains_on_torchs_path(kernel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onepass_loop, "_chooser", onepass_choice.Chooser(onepass_loop.LOOP))
    monkeypatch.setattr(onepass_loop_check, "self_check", lambda module, layout: "for-loop SGD {...}: master differ")
    with pytest.warns(onepass.OnePassWarning, match="for-loop optimizers is not used"):
        got, _ = train("sgd-nesterov-maximize", BF16, scaler=False)
    assert onepass_loop.loop_choice().name == "torch"
    assert_same(got, scaled_reference("sgd-nesterov-maximize", BF16, factories=DEFAULT, wide=True, scaling=False))
