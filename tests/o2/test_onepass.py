"""The one-pass CPU master update (``ampcore/_o2/onepass.py``, issue 31): torch's CPU fused
Adam/AdamW/SGD from low-precision gradients in one pass, bit-identical to torch's own kernel
on float32 masters, never assumed: compared here on many sizes (vector bodies, both parts of
the tail, several thread chunks), options, dtypes, thread counts and CPU capabilities.

The choice logic is tested as pure functions (no compiler needed); the kernel's tests skip
where it cannot be built.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from _onepass_testing import SGD_CASES, run_at_capability, threads  # noqa: F401 (a fixture, used by name)
from test_scaler_fused import FUSED, OVERFLOW_AT, reference, train

import ampcore
from ampcore._o2 import onepass, onepass_check, onepass_choice
from ampcore._o2.master import master_weights_of
from ampcore._o2.onepass_check import adam_case, sgd_case

BF16, FP16 = torch.bfloat16, torch.float16

# -- the choice, as pure functions ---------------------------------------------------------


def test_layouts_of_torchs_capabilities() -> None:
    assert onepass.layout("AVX512") == (16, 8, True)
    assert onepass.layout("AVX2") == (8, 0, True)
    assert onepass.layout("DEFAULT") == (8, 0, False)
    assert onepass.layout("NEON") is None  # not transcribed: torch's path


def test_the_environment_variable_is_validated() -> None:
    assert onepass_choice.requested({}) == "auto"
    assert onepass_choice.requested({onepass.ENV: " Torch "}) == "torch"
    with pytest.raises(ampcore.AmpcoreError, match=r"AMPCORE_O2_ONEPASS='fast': expected one of auto, compiled, torch"):
        onepass_choice.requested({onepass.ENV: "fast"})


def test_decide_names_what_runs_and_why() -> None:
    assert onepass_choice.decide("torch", None, onepass.FUSED) == ("torch", "AMPCORE_O2_ONEPASS=torch")
    assert onepass_choice.decide("auto", None, onepass.FUSED).name == "onepass"
    assert onepass_choice.decide("auto", "no C++ compiler (c++) on PATH", onepass.FUSED) == (
        "torch",
        "fallback: no C++ compiler (c++) on PATH",
    )
    assert onepass_choice.decide("compiled", None, onepass.FUSED).name == "onepass"
    with pytest.raises(ampcore.AmpcoreError, match="AMPCORE_O2_ONEPASS=compiled, but .* not available: it differs"):
        onepass_choice.decide("compiled", "it differs", onepass.FUSED)


def _chooser(monkeypatch: pytest.MonkeyPatch, mismatch: str | None, wanted: str = "auto") -> Any:
    """A fresh chooser whose build and self-check are stand-ins (no compiler needed)."""
    monkeypatch.setenv(onepass.ENV, wanted)
    monkeypatch.setattr(onepass, "missing_tools", lambda: None)
    monkeypatch.setattr(onepass, "_build", lambda capability: ModuleType("stand_in"))
    monkeypatch.setattr(onepass_check, "self_check", lambda module, layout: mismatch)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    return onepass_choice.Chooser(onepass.FUSED)


def test_a_self_check_mismatch_warns_once_and_keeps_torchs_path(monkeypatch: pytest.MonkeyPatch) -> None:
    chooser = _chooser(monkeypatch, "Adam ..., 15 torch.bfloat16 elements: exp_avg_sq differ")
    with pytest.warns(onepass.OnePassWarning, match="differs from torch's fused kernels on this machine: Adam"):
        made = chooser.choose()
    assert made.name == "torch" and chooser.module is None
    assert chooser.choose() is made  # chosen once per process: no second warning


def test_a_passing_self_check_selects_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    chooser = _chooser(monkeypatch, None)
    assert chooser.choose().name == "onepass"
    assert chooser.layout == onepass.layout("AVX2")


def test_a_self_check_that_cannot_run_keeps_torchs_path(monkeypatch: pytest.MonkeyPatch) -> None:
    chooser = _chooser(monkeypatch, None)

    def broken(module: object, layout: object) -> None:
        raise AttributeError("module 'torch' has no attribute '_fused_sgd_'")

    monkeypatch.setattr(onepass_check, "self_check", broken)
    with pytest.warns(onepass.OnePassWarning, match="the self-check could not run: AttributeError"):
        assert chooser.choose().name == "torch"


def test_compiled_raises_where_the_self_check_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ampcore.AmpcoreError, match="compiled, but .* differs"):
        _chooser(monkeypatch, "SGD: master differ", wanted="compiled").choose()


def test_torch_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    chooser = _chooser(monkeypatch, None, wanted="torch")
    monkeypatch.setattr(onepass, "_build", lambda capability: pytest.fail("built"))
    assert chooser.choose() == ("torch", "AMPCORE_O2_ONEPASS=torch")


def test_describe_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onepass, "_chooser", onepass_choice.Chooser(onepass.FUSED))
    monkeypatch.setenv(onepass.ENV, "torch")
    assert onepass.describe() == "torch (AMPCORE_O2_ONEPASS=torch)"
    monkeypatch.setenv(onepass.ENV, "auto")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "VSX")
    assert "capability VSX is not transcribed" in onepass.describe()
    monkeypatch.setenv(onepass.ENV, "nope")
    assert onepass.describe().startswith("invalid: AMPCORE_O2_ONEPASS='nope'")


def test_the_cpu_adapter_offers_it_and_others_do_not() -> None:
    assert ampcore.get_backend("cpu").master_update_onepass is True
    assert ampcore.BackendSpec("x", "x", [BF16]).master_update_onepass is False


class _OnePassAdapter:
    AMPCORE_CONTRACT = 2

    def __init__(self, onepass: object) -> None:
        self.onepass = onepass

    @ampcore.hookimpl
    def ampcore_backend(self) -> ampcore.BackendSpec:
        return ampcore.BackendSpec("onepassy", "cpu", [BF16], master_update_onepass=self.onepass)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_wrong_master_update_onepass_fails_the_load(value: object) -> None:
    with pytest.raises(ampcore.PluginError, match=r"master_update_onepass=.*expected True or False"):
        ampcore.register_plugin(_OnePassAdapter(value), name="onepassy")
    assert "onepassy" not in {p.name for p in ampcore.list_plugins()}


# -- the kernel against torch's -----------------------------------------------------------


@pytest.fixture(scope="module")
def kernel() -> Iterator[tuple[ModuleType, onepass.Layout]]:
    if onepass.missing_tools() is not None:
        pytest.skip(f"the one-pass kernel is built at first use: {onepass.missing_tools()}")
    if onepass.choice().name != "onepass":
        pytest.skip(f"the one-pass kernel is not used here: {onepass.choice().reason}")
    assert onepass._chooser.module is not None and onepass._chooser.layout is not None
    yield onepass._chooser.module, onepass._chooser.layout


#: a vector body of one element, tails of every length 1-15 (8 of them vectorised by GCC
#: in torch's AVX512 build), several 64-byte units and thread chunks, more than one grain
SIZES = (1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 31, 33, 100, 1000, 4099, 70_001)
ADAM_CASES: list[dict[str, Any]] = [
    {"adamw": True, "weight_decay": 0.01, "amsgrad": False, "maximize": False, "betas": (0.9, 0.999)},
    {"adamw": False, "weight_decay": 0.0, "amsgrad": False, "maximize": False, "betas": (0.9, 0.999)},
    {"adamw": False, "weight_decay": 0.1, "amsgrad": True, "maximize": True, "betas": (0.8, 0.99)},
    {"adamw": True, "weight_decay": 0.1, "amsgrad": True, "maximize": False, "betas": (0.0, 0.5), "scale": 1024.0},
    {"adamw": False, "weight_decay": 0.05, "amsgrad": False, "maximize": True, "betas": (0.6, 0.9), "scale": 8.0},
    {"adamw": True, "weight_decay": 0.0, "amsgrad": False, "maximize": False, "betas": (0.95, 0.95)},
]


@pytest.fixture(params=[None, 0], ids=["large-streamed", "all-streamed"])
def stream_min(kernel: Any, request: pytest.FixtureRequest) -> Iterator[int]:
    """The size from which the AVX512 build streams the parameter (non-temporal stores): the
    default (these sizes: none), or 0 (every tensor); other builds stream nothing."""
    module, _ = kernel
    before = module.set_stream_min(0)
    module.set_stream_min(before if request.param is None else request.param)
    yield before if request.param is None else request.param
    module.set_stream_min(before)


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.usefixtures("threads")
def test_adam_is_torchs_fused_adam_bit_for_bit(kernel: Any, dtype: torch.dtype, stream_min: int) -> None:
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
def test_sgd_is_torchs_fused_sgd_bit_for_bit(kernel: Any, dtype: torch.dtype, stream_min: int) -> None:
    module, layout = kernel
    failures = [
        (n, index, differ)
        for n in SIZES
        for index, case in enumerate(SGD_CASES)
        if (differ := sgd_case(module, layout, n, dtype, case, seed=n + index))
    ]
    assert failures == []


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = torch.int32 if a.element_size() == 4 else torch.int16
    return bool(torch.equal(a.view(bits), b.view(bits)))


@pytest.mark.parametrize("offset", [1, 8, 16], ids=["2-bytes", "16-bytes", "32-bytes"])
def test_a_parameter_anywhere_in_memory_is_written_right(kernel: Any, stream_min: int, offset: int) -> None:
    """The parameter as a view ``offset`` elements into a larger tensor: streamed only where
    it is 32-byte aligned, bit-identical either way, nothing written outside it."""
    module, layout = kernel
    n, guard = 4099, 40
    generator = torch.Generator().manual_seed(offset)
    start = torch.randn(n, generator=generator)
    grad = _scaled_gradient(n, generator)
    buffer = torch.full((offset + n + guard,), 7.0).bfloat16()
    low = buffer[offset : offset + n]
    low.copy_(start.bfloat16())
    ref, mine = start.clone(), start.clone()
    ref_buf, buf = torch.zeros(n), torch.zeros(n)
    options = {"weight_decay": 0.01, "momentum": 0.9, "lr": 0.01, "dampening": 0.0, "nesterov": True}
    torch._fused_sgd_([ref], [grad.float()], [ref_buf], maximize=False, is_first_step=True, **options)
    module.sgd([mine], [grad], [low], [buf], 0.01, 0.9, 0.01, 0.0, True, False, True, None, None, *layout)
    assert _same(ref, mine) and _same(ref_buf, buf) and _same(ref.bfloat16(), low)
    m, v, ref_m, ref_v = (torch.zeros(n) for _ in range(4))
    step, ref_step = torch.ones(()), torch.ones(())
    torch._fused_adam_([ref], [grad.float()], [ref_m], [ref_v], [], [ref_step], lr=1e-3, beta1=0.9, beta2=0.999,
                       weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)  # fmt: skip
    module.adam([mine], [grad], [low], [m], [v], [], [step], 1e-3, 0.9, 0.999, 0.1, 1e-8, False, False, False,
                None, None, *layout)  # fmt: skip
    assert _same(ref, mine) and _same(ref_m, m) and _same(ref_v, v) and _same(ref.bfloat16(), low)
    outside = torch.cat([buffer[:offset], buffer[offset + n :]])
    assert torch.equal(outside, torch.full_like(outside, 7.0))


def _scaled_gradient(n: int, generator: torch.Generator) -> torch.Tensor:
    exponents = torch.randint(-8, 4, (n,), generator=generator).float()
    return (torch.randn(n, generator=generator) * torch.exp2(exponents)).bfloat16()


def test_the_self_check_checks_streamed_stores_too(kernel: Any) -> None:
    """The first-use self-check runs every problem with ordinary and with streamed stores,
    says which differed, and leaves the streaming size as it was."""
    module, layout = kernel
    default = module.set_stream_min(0)
    module.set_stream_min(default)
    assert onepass_check.self_check(module, layout) is None
    assert module.set_stream_min(default) == default

    class WrongWhereStreamed:
        def __init__(self) -> None:
            self.stream_min = default

        def set_stream_min(self, elements: int) -> int:
            before, self.stream_min = self.stream_min, elements
            return before

        def adam(self, *args: Any) -> None:
            module.adam(*args)

        def sgd(self, *args: Any) -> None:
            module.sgd(*args)
            if self.stream_min == 0:
                args[2][0].add_(1)  # the parameter

    wrong = WrongWhereStreamed()
    found = onepass_check.self_check(wrong, layout)
    assert found is not None and found.endswith("parameter differ (streamed stores)"), found
    assert wrong.stream_min == default


def test_the_streaming_size_is_validated(kernel: Any) -> None:
    module, _ = kernel
    with pytest.raises(RuntimeError, match="stream_min -1"):
        module.set_stream_min(-1)


def test_a_found_inf_skips_the_step(kernel: Any) -> None:
    module, layout = kernel
    p, m, v, step = torch.randn(33), torch.randn(33), torch.rand(33), torch.ones(())
    low, grad = p.bfloat16(), torch.randn(33).bfloat16()
    before = [t.clone() for t in (p, m, v, low)]
    module.adam([p], [grad], [low], [m], [v], [], [step], 1e-3, 0.9, 0.999, 0.0, 1e-8, False, False, True,
                torch.tensor(2.0), torch.tensor(1.0), *layout)  # fmt: skip
    module.sgd([p], [grad], [low], [], 0.0, 0.0, 0.1, 0.0, False, False, False, None, torch.tensor(1.0), *layout)
    assert all(torch.equal(a, b) for a, b in zip(before, (p, m, v, low), strict=True))


def test_wrong_tensors_are_refused(kernel: Any) -> None:
    module, layout = kernel
    p, g = torch.randn(8), torch.randn(8).bfloat16()
    with pytest.raises(RuntimeError, match="a gradient must be a contiguous CPU tensor of BFloat16"):
        module.sgd([p], [g[::2]], [p.bfloat16()[:4]], [], 0.0, 0.0, 0.1, 0.0, False, False, False, None, None, *layout)


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_other_capabilities_in_a_subprocess(kernel: Any, capability: str) -> None:
    """torch's AVX2 and DEFAULT kernels split and round otherwise (vector width 8; DEFAULT
    fuses nothing): the kernel built for them against torch's at that capability."""
    script = textwrap.dedent(
        """
        import torch
        from ampcore._o2 import onepass, onepass_choice
        from ampcore._o2.onepass_check import adam_case, sgd_case
        import test_onepass as t
        made = onepass.choice()
        print(onepass_choice.cpu_capability(), made.name)
        if made.name == "onepass":
            module, layout = onepass._chooser.module, onepass._chooser.layout
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
    monkeypatch.setattr(onepass._chooser, "module", wrapper)
    return counted


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(FUSED))
def test_o2_under_gradscaler_runs_the_kernel_and_is_torchs_fused_optimizer(
    name: str, dtype: torch.dtype, calls: dict[str, int]
) -> None:
    """decorate + ampcore.GradScaler (an overflow at the third step) with the kernel: torch's
    fused optimizer on float32 masters under torch's GradScaler, bit for bit."""
    got = train(name, dtype, norm=False, wide=True)
    assert calls["adam" if "adam" in name else "sgd"] >= 4  # every step but the first's state creation
    states, scales = reference(name, dtype, wide=True)
    assert got[1] == scales
    for step, (mine, theirs) in enumerate(zip(got[0], states, strict=True)):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)), f"step {step}"
    assert all(torch.equal(a, b) for a, b in zip(got[0][OVERFLOW_AT - 1], got[0][OVERFLOW_AT], strict=True))


def test_unfused_groups_and_float32_parameters_keep_torchs_path(calls: dict[str, int]) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(9, 17), torch.nn.LayerNorm(17))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the for-loop flavour
    model, opt = ampcore.decorate(model, opt, dtype=BF16, device="cpu")
    for _ in range(2):
        model(torch.randn(4, 9).to(BF16)).float().sum().backward()
        opt.step()
        opt.zero_grad()
    assert calls == {"adam": 0, "sgd": 0}
    weights = master_weights_of(opt)
    assert weights is not None and weights.onepass is True  # offered: this flavour's is test_onepass_loop.py


def test_torch_28s_name_of_the_default_build_reads_as_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.8 calls its DEFAULT build "NO AVX": the same layouts, and no space in a build's name."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "NO AVX")
    assert onepass_choice.cpu_capability() == "DEFAULT"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert onepass_choice.cpu_capability() == "AVX512"
