"""The Triton kernel of O2's fused Adam/AdamW master update against torch's CUDA fused
Adam transcribed operation by operation (``fused_adam_reference.py``), bit for bit, in
Triton's interpreter on the CPU; and the transcription against what torch's kernels can be
checked against here (torch's CPU fused kernel, where its formula coincides).

On a GPU, ``benchmarks/bench_o2_update.py --check`` compares both with torch's CUDA kernel.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
import torch
from fused_adam_reference import fma32, interpreter_fma_unfused, reference_step

BF16, FP16, F32 = torch.bfloat16, torch.float16, torch.float32
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (optional: pip install triton)")
SIZE = 4099  # two programs of the kernel and a partial third


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The Triton kernel module, compiled for Triton's interpreter (CPU tensors)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from ampcore._o2 import triton_adam

    yield importlib.reload(triton_adam)
    monkeypatch.delenv("TRITON_INTERPRET")
    importlib.reload(triton_adam)


def group_of(**options: Any) -> dict[str, Any]:
    group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    group.update({"amsgrad": False, "maximize": False, "decoupled_weight_decay": True})
    group.update(options)
    return group


def fresh_state(size: int, amsgrad: bool) -> dict[str, torch.Tensor]:
    names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg", "exp_avg_sq")
    return {"step": torch.zeros(()), **{name: torch.zeros(size) for name in names}}


# -- the exact float32 fma of the transcription ------------------------------------------------
def exact_fma(a: float, b: float, c: float) -> float:
    """``a * b + c`` rounded once to float32, in rational arithmetic."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    low = float(torch.tensor(float(exact), dtype=torch.float64).float())  # a neighbour of the answer
    candidates = {low, *(float(torch.nextafter(torch.tensor(low), torch.tensor(d))) for d in (-1e39, 1e39))}
    best = min(candidates, key=lambda x: (abs(Fraction(x) - exact), int(torch.tensor(x).view(torch.int32)) & 1))
    return best


def test_fma32_rounds_once_also_where_float64_would_round_twice() -> None:
    torch.manual_seed(0)
    a, b, c = torch.randn(400), torch.randn(400), torch.randn(400) * 1e-3
    # crafted: (1 + 2**-12) ** 2 = 1 + 2**-11 + 2**-24 lies exactly halfway between two
    # float32 values, and an addend below float64's precision decides the rounding
    near = 1.0 + 2.0**-12
    a = torch.cat((a, torch.tensor([near, near, -near, 3.0])))
    b = torch.cat((b, torch.tensor([near, near, near, 1.0 / 3.0])))
    c = torch.cat((c, torch.tensor([2.0**-80, -(2.0**-80), -(2.0**-80), -1.0])))
    got = fma32(a, b, c)
    want = [exact_fma(float(x), float(y), float(z)) for x, y, z in zip(a, b, c, strict=True)]
    assert got.tolist() == want
    # where float64 then float32 rounds twice, wrongly
    naive = (a.double() * b.double() + c.double()).float()
    assert float(naive[-4]) == 1.0 + 2.0**-11 and float(got[-4]) == 1.0 + 2.0**-11 + 2.0**-23


# -- the kernel against the transcription, bit for bit ---------------------------------------
CASES: dict[str, dict[str, Any]] = {
    "adamw-decay": {"weight_decay": 0.05},
    "adam-decay": {"weight_decay": 0.05, "decoupled_weight_decay": False},
    "adam-amsgrad-maximize": {"amsgrad": True, "maximize": True, "decoupled_weight_decay": False},
    "adamw-betas-lr": {"lr": 3e-2, "betas": (0.8, 0.95), "eps": 1e-6},
}


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (optional: pip install triton)")
@pytest.mark.parametrize("low_dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("formula", ["opmath", "double"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_is_the_transcription_bit_for_bit(
    case: str, formula: str, low_dtype: torch.dtype, interpreted: Any
) -> None:
    if formula == "opmath" and (reason := interpreter_fma_unfused()):
        pytest.skip(reason)
    group = group_of(**CASES[case])
    torch.manual_seed(1)
    master = torch.randn(SIZE)
    low = master.to(low_dtype)
    state = fresh_state(SIZE, group["amsgrad"])
    mirror, expected = {k: v.clone() for k, v in state.items()}, master.clone()
    for step in range(4):
        grad = (torch.randn(SIZE) * (10.0 ** (step - 2))).to(low_dtype)
        interpreted.launch_adam(group, [master], [grad], [low], [state], formula=formula)
        reference_step(group, mirror, expected, grad, formula)
    for name, value in mirror.items():
        assert torch.equal(state[name], value), name
    assert torch.equal(master, expected)
    assert state["step"].dtype == F32 and float(state["step"]) == 4
    if low_dtype == FP16:  # (the interpreter truncates to bfloat16 instead of rounding: docs/o2.md)
        assert torch.equal(low, master.to(FP16))


@needs_triton
@pytest.mark.parametrize("formula", ["opmath", "double"])
def test_the_kernel_takes_the_scalers_tensors_as_torchs_fused_kernel(formula: str, interpreted: Any) -> None:
    """``grad_scale`` divides the gradient; ``found_inf == 1`` skips the update and the
    step count goes back; several tensors in one launch, each with its own step count."""
    if formula == "opmath" and (reason := interpreter_fma_unfused()):
        pytest.skip(reason)
    group = group_of(weight_decay=0.01, amsgrad=True)
    torch.manual_seed(2)
    sizes = (SIZE, 7, 2048)
    masters = [torch.randn(n) for n in sizes]
    lows = [m.to(FP16) for m in masters]
    states = [fresh_state(n, True) for n in sizes]
    states[1]["step"] += 5  # a tensor that joined later: another step count, other corrections
    mirrors = [{k: v.clone() for k, v in s.items()} for s in states]
    expected = [m.clone() for m in masters]
    for found in (0.0, 1.0, 0.0):
        scale, flag = torch.tensor(2.0**12), torch.tensor(found)
        grads = [(torch.randn(n) * 4096).to(FP16) for n in sizes]
        before = [m.clone() for m in masters]
        interpreted.launch_adam(group, masters, grads, lows, states, formula=formula, grad_scale=scale, found_inf=flag)
        for mirror, want, grad in zip(mirrors, expected, grads, strict=True):
            reference_step(group, mirror, want, grad, formula, grad_scale=scale, found_inf=flag)
        if found:
            assert all(torch.equal(a, b) for a, b in zip(masters, before, strict=True))
    for state, mirror, master, want in zip(states, mirrors, masters, expected, strict=True):
        assert all(torch.equal(state[name], mirror[name]) for name in state)
        assert torch.equal(master, want)
    assert [float(s["step"]) for s in states] == [2.0, 7.0, 2.0]


@needs_triton
def test_an_unknown_formula_is_refused(interpreted: Any) -> None:
    master = torch.zeros(4)
    with pytest.raises(ValueError, match="formula='float16'"):
        interpreted.launch_adam(
            group_of(), [master], [master.half()], [master.half()], [fresh_state(4, False)], "float16"
        )


def test_the_two_formulas_differ_in_every_moment() -> None:
    """Why the H200 run of the float64 kernel saw every ``exp_avg_sq`` element differ from
    torch's: ``1 - beta2`` is 0.001 in double and 0.00099998713 from float32 ``beta2``."""
    torch.manual_seed(3)
    grad = torch.randn(1000)
    runs = []
    for formula in ("opmath", "double"):
        state, master = fresh_state(1000, False), torch.ones(1000)
        reference_step(group_of(), state, master, grad, formula)
        runs.append(state)
    assert bool((runs[0]["exp_avg_sq"] != runs[1]["exp_avg_sq"]).all())


# -- the transcription against torch's CPU fused kernel ----------------------------------------
def cpu_fused(
    group: dict[str, Any], master: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor], **scaler: Any
) -> None:
    fused = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
    beta1, beta2 = group["betas"]
    maxes = [state["max_exp_avg_sq"]] if group["amsgrad"] else []
    state["step"] += 1
    fused(
        [master], [grad.float()], [state["exp_avg"]], [state["exp_avg_sq"]], maxes, [state["step"]],
        lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
        amsgrad=group["amsgrad"], maximize=group["maximize"], **scaler,
    )  # fmt: skip
    if scaler.get("found_inf") is not None:
        state["step"] -= scaler["found_inf"]


@pytest.mark.parametrize("options", [{}, {"amsgrad": True, "maximize": True}], ids=["plain", "amsgrad-maximize"])
def test_the_transcription_is_torchs_cpu_kernel_where_their_formulas_coincide(options: dict[str, Any]) -> None:
    """betas (0, 0) and no weight decay: both kernels compute ``m = g``, ``v = g * g``, bias
    corrections 1, then the same division, square root and update; the scaler's division,
    skip and step counting as well."""
    group = group_of(betas=(0.0, 0.0), lr=0.01, **options)
    torch.manual_seed(4)
    master = torch.randn(SIZE)
    state = fresh_state(SIZE, group["amsgrad"])
    mirror, expected = {k: v.clone() for k, v in state.items()}, master.clone()
    for found in (0.0, 1.0, 0.0):
        scale, flag = torch.tensor(512.0), torch.tensor(found)
        grad = (torch.randn(SIZE) * 512).to(FP16)
        cpu_fused(group, master, grad, state, grad_scale=scale, found_inf=flag)
        reference_step(group, mirror, expected, grad, grad_scale=scale, found_inf=flag)
    assert torch.equal(master, expected)
    assert all(torch.equal(state[name], mirror[name]) for name in state)


def test_torchs_cpu_kernel_computes_another_formula_than_its_cuda_kernel() -> None:
    """Documented in fused_adam_reference.py: with the usual betas the CPU kernel's moments
    (a lerp and float32 coefficients rounded from double) are not the CUDA kernel's."""
    group = group_of(weight_decay=0.01)
    torch.manual_seed(5)
    master, grad = torch.randn(SIZE), torch.randn(SIZE).to(FP16)
    state = fresh_state(SIZE, False)
    mirror, expected = {k: v.clone() for k, v in state.items()}, master.clone()
    cpu_fused(group, master, grad, state)
    reference_step(group, mirror, expected, grad)
    assert not torch.equal(state["exp_avg_sq"], mirror["exp_avg_sq"])


# -- the kernel compiled for a GPU (PTX; no GPU needed) ----------------------------------------
def compiled_ops(formula: str, flags: dict[str, bool], monkeypatch: pytest.MonkeyPatch, cache: Any) -> dict[str, int]:
    """Per element, the floating-point instructions of the kernel compiled for sm_90."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from ampcore._o2 import triton_adam

    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    pointers = {"grad": "*fp16", "low": "*fp16", "hyper": "*fp64" if formula == "double" else "*fp32"}
    names = ("master", "grad", "low", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "corrections", "hyper")
    signature = {name: pointers.get(name, "*fp32") for name in (*names, "grad_scale", "found_inf")}
    constants = {**flags, "SCALE": True, "SKIP": True, "DOUBLE": formula == "double", "BLOCK": 2048}
    signature.update({"n": "i64", **dict.fromkeys(constants, "constexpr")})
    try:
        source = ASTSource(triton_adam._adam_master_kernel, signature, constexprs=constants)
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False})
    except Exception as exc:  # a Triton without its CUDA tool chain, or of another API
        pytest.skip(f"Triton cannot compile for CUDA here ({type(exc).__name__}: {exc})")
    ops = re.findall(r"\b((?:fma|mul|add|sub|div|sqrt)\.[a-z0-9.]+f(?:32|64))\b", kernel.asm["ptx"])
    per_thread = 2048 // (32 * kernel.metadata.num_warps)
    return {op: ops.count(op) // per_thread for op in set(ops)}


@needs_triton
def test_compiled_for_a_gpu_the_kernel_rounds_as_transcribed(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Per element exactly the transcription's operations, each rounded to nearest
    (``.rn``: ptxas contracts none of them), no approximate division or square root:
    opmath AdamW 5 ``fma`` (decay, two per moment), 3 divisions (the scale, by
    ``bc2_sqrt``, the update), 1 square root; the double formula no ``fma`` at all."""
    flags = {"ADAMW": True, "DECAY": True, "AMSGRAD": False, "MAXIMIZE": True}
    opmath = compiled_ops("opmath", flags, monkeypatch, tmp_path)
    assert opmath == {"fma.rn.f32": 5, "div.rn.f32": 3, "sqrt.rn.f32": 1, "mul.rn.f32": 2, "add.rn.f32": 1,
                      "sub.rn.f32": 1}  # fmt: skip
    flags = {"ADAMW": False, "DECAY": True, "AMSGRAD": True, "MAXIMIZE": False}
    double = compiled_ops("double", flags, monkeypatch, tmp_path)
    assert not any(op.startswith("fma") for op in double)
    assert double["div.rn.f32"] == 3 and double["sqrt.rn.f32"] == 1
