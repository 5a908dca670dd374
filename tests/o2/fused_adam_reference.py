"""torch's CUDA fused Adam/AdamW (``adam_math`` in ATen's ``fused_adam_utils.cuh``),
transcribed operation by operation in torch ops that round exactly as the CUDA source does,
on any device (the tests: CPU; ``benchmarks/bench_o2_update.py --check``: against torch's
CUDA kernel itself).

Two versions of the source (``ampcore/_o2/triton_adam.py``, ``FORMULAS``):

``"opmath"`` (torch's current kernel, 2025 on: pytorch#153782 and #154069). Every value
is float32 (``opmath_t`` of a float32 parameter); the double hyperparameters are rounded
to float32 once (``static_cast<opmath_t>``)::

    grad /= grad_scale                                   # GradScaler (float32 division)
    grad = -grad                                         # maximize
    grad += param * weight_decay                         # Adam: fma(param, wd, grad) (nvcc contracts)
    param -= lr * weight_decay * param                   # AdamW: fma(-(lr * wd), param, param)
    exp_avg = fma(beta1, exp_avg, fma(-beta1, grad, grad))
    exp_avg_sq = fma(beta2, exp_avg_sq, fma(-beta2, grad * grad, grad * grad))
    bias_correction1 = 1 - pow(beta1, step)              # float32 pow of the float32 step
    bias_correction2_sqrt = sqrt(1 - pow(beta2, step))
    step_size = lr / bias_correction1
    denom = sqrt(exp_avg_sq or max(max_exp_avg_sq, exp_avg_sq)) / bias_correction2_sqrt + eps
    param -= step_size * exp_avg / denom

``"double"`` (2022-2025): the hyperparameters stay ``double``, so ``beta1 * exp_avg + (1 -
beta1) * grad``, ``beta2 * exp_avg_sq + (1 - beta2) * grad * grad``, the weight decay, the
bias corrections (from the float32 step), ``lr / bias_correction1`` and ``... + eps`` are
evaluated in double and rounded to float32 once each; the rest as above.  (nvcc contracts
those double multiply-adds; this transcription and the kernel's ``"double"`` formula do
not: the float32 results differ only where the double values fall within a double
rounding of a float32 rounding boundary, about one element in 10**8.  The kernel of
2022-2023 also rounded ``1 - pow(beta2, step)`` to float32 before its square root.)

Both: the step count advances by 1 before the update and goes back by ``found_inf`` after
(``torch/optim/adam.py``'s ``_fused_adam``); with ``found_inf == 1`` nothing else changes.

Exact float32 rounding here: products and quotients of two float32 values, sums, and
square roots are computed in float64 and rounded to float32 (correct: float64 has at least
2 * 24 + 2 bits, so the double rounding is innocuous); a float32 ``fma`` rounds once
(:func:`fma32`).  The float32 ``pow`` of the bias corrections is torch's ``pow`` kernel
(as ``triton_adam`` computes it, and as ATen's fused kernel calls the same device ``pow``);
on the CPU with fewer than 32 step counts at a time, ``std::pow``.

Where torch's CPU fused kernel (``aten/src/ATen/native/cpu/FusedAdamKernel.cpp``) differs:
it computes the bias corrections, ``1 - beta1``, ``1 - beta2`` and ``lr / bias_correction1``
in double, ``exp_avg`` as a lerp (``exp_avg + float(1 - beta1) * (grad - exp_avg)``),
``exp_avg_sq`` as ``exp_avg_sq * float(beta2) + float(1 - beta2) * grad * grad`` without
``fma``, and AdamW's decay as ``param * float(1 - lr * wd)``: it agrees with the CUDA
kernel only where those coincide (``tests/o2/test_master_kernel.py`` checks both).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

__all__ = ["fma32", "reference_step"]

F32, F64 = torch.float32, torch.float64


def fma32(a: torch.Tensor | float, b: torch.Tensor | float, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` for float32 operands, rounded once to float32 (to nearest, ties to
    even), as a device's ``fma.rn.f32``.  The product is exact in float64; the sum is
    rounded there (``s``) with its exact error ``e`` (TwoSum); ``s`` rounds to the right
    float32 unless it lies exactly halfway between two float32 values while ``e`` is not
    zero: then the exact sum lies on ``e``'s side of that midpoint."""
    wide_a = torch.as_tensor(a, dtype=F32, device=c.device).double()
    wide_b = torch.as_tensor(b, dtype=F32, device=c.device).double()
    product, addend = wide_a * wide_b, c.double()
    total = product + addend
    part = total - product
    error = (product - (total - part)) + (addend - part)
    rounded = total.float()
    toward = torch.where(total > rounded.double(), torch.inf, -torch.inf).to(F32)
    neighbour = torch.nextafter(rounded, toward)
    halfway = (rounded.double() + neighbour.double()) * 0.5 == total
    beyond = halfway & (error != 0) & ((error > 0) == (total > rounded.double()))
    return torch.where(beyond, neighbour, rounded)


def _f32(value: float) -> float:
    """``static_cast<float>(value)``, as a Python float."""
    return float(torch.tensor(value, dtype=F32))


def _rn(value: torch.Tensor) -> torch.Tensor:
    """A float64 result of one operation on float32 values, rounded to float32."""
    return value.to(F32)


def reference_step(
    group: dict[str, Any] | Any,
    state: dict[str, torch.Tensor],
    master: torch.Tensor,
    grad: torch.Tensor,
    formula: str = "opmath",
    grad_scale: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
) -> None:
    """One step of torch's CUDA fused Adam/AdamW (``formula``, see the module docstring)
    on the float32 ``master`` with the gradient ``grad`` (any floating dtype; widened
    exactly), in place: ``master`` and ``state`` (``step``, a float32 tensor; ``exp_avg``,
    ``exp_avg_sq``, with ``group["amsgrad"]`` ``max_exp_avg_sq``)."""
    if formula not in ("opmath", "double"):
        raise ValueError(f"formula={formula!r}")
    state["step"] += 1
    skip = found_inf is not None and float(found_inf) == 1.0
    if not skip:
        step = _opmath if formula == "opmath" else _double
        master.copy_(step(group, state, master, grad, grad_scale))
    if found_inf is not None:
        state["step"] -= found_inf.to(state["step"].device)


def _gradient(group: Any, grad: torch.Tensor, grad_scale: torch.Tensor | None) -> torch.Tensor:
    g = grad.to(F32)
    if grad_scale is not None:
        g = _rn(g.double() / grad_scale.to(g.device).double())
    return -g if group["maximize"] else g


def _corrections(group: Any, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``1 - pow(beta1, step)`` and ``sqrt(1 - pow(beta2, step))`` (opmath)."""
    beta1, beta2 = (_f32(b) for b in group["betas"])
    count = step.reshape(1).to(F32)
    first = _rn(1 - torch.pow(beta1, count).double())
    second = _rn(_rn(1 - torch.pow(beta2, count).double()).double().sqrt())
    return first, second


def _root(group: Any, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """float32 ``sqrt`` of ``exp_avg_sq`` (amsgrad: of ``std::max(max_exp_avg_sq,
    exp_avg_sq)``, which becomes the new ``max_exp_avg_sq``)."""
    top = state["exp_avg_sq"]
    if group["amsgrad"]:
        top = state["max_exp_avg_sq"] = torch.where(state["max_exp_avg_sq"] < top, top, state["max_exp_avg_sq"])
    return _rn(top.double().sqrt())


def _update(
    group: Any,
    state: dict[str, torch.Tensor],
    p: torch.Tensor,
    step_size: torch.Tensor,
    correction2_sqrt: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """``p - step_size * exp_avg / (sqrt(v) / bc2_sqrt + eps)``, each operation rounded
    to float32 (``eps`` added in float64 and rounded: a float32 ``eps`` adds exactly so)."""
    denom = _rn(_rn(_root(group, state).double() / correction2_sqrt.double()).double() + eps)
    update = _rn(_rn(step_size.double() * state["exp_avg"].double()).double() / denom.double())
    return _rn(p.double() - update.double())


def _opmath(
    group: Any, state: dict[str, torch.Tensor], master: torch.Tensor, grad: torch.Tensor, scale: torch.Tensor | None
) -> torch.Tensor:
    lr, decay, eps = (_f32(group[name]) for name in ("lr", "weight_decay", "eps"))
    beta1, beta2 = (_f32(b) for b in group["betas"])
    g, p = _gradient(group, grad, scale), master.clone()
    if decay != 0:
        if group["decoupled_weight_decay"]:
            p = fma32(-_f32(lr * decay), p, p)  # lr * wd: a float32 product of float32 values
        else:
            g = fma32(p, decay, g)
    state["exp_avg"] = fma32(beta1, state["exp_avg"], fma32(-beta1, g, g))
    square = _rn(g.double() * g.double())
    state["exp_avg_sq"] = fma32(beta2, state["exp_avg_sq"], fma32(-beta2, square, square))
    correction1, correction2_sqrt = _corrections(group, state["step"])
    return _update(group, state, p, _rn(torch.tensor(lr, dtype=F64) / correction1.double()), correction2_sqrt, eps)


def _double(
    group: Any, state: dict[str, torch.Tensor], master: torch.Tensor, grad: torch.Tensor, scale: torch.Tensor | None
) -> torch.Tensor:
    lr, decay, eps = (float(group[name]) for name in ("lr", "weight_decay", "eps"))
    beta1, beta2 = (float(b) for b in group["betas"])
    g, p = _gradient(group, grad, scale), master.clone()
    if decay != 0:
        if group["decoupled_weight_decay"]:
            p = _rn(p.double() - lr * decay * p.double())
        else:
            g = _rn(g.double() + p.double() * decay)
    state["exp_avg"] = _rn(beta1 * state["exp_avg"].double() + (1 - beta1) * g.double())
    state["exp_avg_sq"] = _rn(beta2 * state["exp_avg_sq"].double() + (1 - beta2) * g.double() * g.double())
    count = float(state["step"])
    correction1 = torch.tensor(1 - beta1**count, dtype=F64).float()
    correction2_sqrt = torch.tensor(math.sqrt(1 - beta2**count), dtype=F64).float()
    return _update(group, state, p, _rn(lr / correction1.double()), correction2_sqrt, eps)


@functools.cache
def interpreter_fma_unfused() -> str | None:
    """Why Triton's interpreter cannot run the ``"opmath"`` formula bit for bit, or None.
    Its ``tl.fma`` must round once; Triton 3.4's (torch 2.8's pin, ``python3 tasks.py
    compat``) computes ``a * b`` and ``+ c`` in float32, rounding twice.  Call with
    ``TRITON_INTERPRET=1`` set (the tests' ``interpreted`` fixture)."""
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[misc]
    def fma_kernel(a: Any, b: Any, c: Any, out: Any) -> None:
        index = tl.arange(0, 2)
        tl.store(out + index, tl.fma(tl.load(a + index), tl.load(b + index), tl.load(c + index)))

    near = 1.0 + 2.0**-12  # near * near + 2**-80 lies just above a float32 halfway point
    a, c, out = torch.tensor([near, near]), torch.tensor([2.0**-80, 2.0**-80]), torch.empty(2)
    fma_kernel[(1,)](a, a, c, out)
    if float(out[0]) == 1.0 + 2.0**-11 + 2.0**-23:
        return None
    return (
        f"Triton {triton.__version__}'s interpreter rounds tl.fma twice ((1 + 2**-12)**2 + 2**-80 gave "
        f"{float(out[0])!r}, not 1 + 2**-11 + 2**-23): the opmath formula cannot be checked bit for bit in it "
        "(a GPU compiles a real fma: benchmarks/bench_o2_update.py --check)"
    )
