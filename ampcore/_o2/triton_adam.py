"""A Triton kernel for O2's fused Adam/AdamW master update, one pass per parameter.

Imported only when an optimizer asked for it (:func:`ampcore.set_master_update_kernel`):
Triton is never a dependency of ampcore.

Per element the kernel reads the low-precision gradient, the float32 master and the Adam
states, and writes the master, the states and the low-precision parameter (rounded from
the new master): 2 + 8 + 16 (+ 8 with amsgrad) + 2 bytes per parameter, one pass, where
torch's fused Adam on the masters needs the gradients widened into float32 first and the
parameters copied back after (40 bytes per parameter in three passes).

The arithmetic transcribes torch's CUDA fused Adam (``adam_math`` and
``FusedAdamMathFunctor`` in ``aten/src/ATen/native/cuda/fused_adam_utils.cuh``) operation
by operation, with every multiply-add that nvcc contracts written as an explicit ``fma``
and Triton's own contraction switched off, so that the rounding is the source's, not a
compiler's choice.  Two versions of that source exist (:data:`FORMULAS`):

``"opmath"`` (torch's current kernel, pytorch#153782 and #154069, 2025): everything in
float32.  The hyperparameters are rounded to float32 first; with ``g`` the gradient
(divided by ``grad_scale`` in float32 under a GradScaler, negated for ``maximize``):

* Adam's weight decay ``g = fma(p, wd, g)``; AdamW's ``p = fma(-(lr * wd), p, p)``;
* ``m = fma(beta1, m, fma(-beta1, g, g))``; ``v = fma(beta2, v, fma(-beta2, g*g, g*g))``;
* per tensor, from the float32 step count: ``bc1 = 1 - pow(beta1, step)``,
  ``bc2_sqrt = sqrt(1 - pow(beta2, step))`` (float32 ``pow``, computed here by torch's
  own float32 ``pow`` kernel, the same device function the fused kernel calls);
* ``step_size = lr / bc1``; ``denom = sqrt(v or max(max_v, v)) / bc2_sqrt + eps``;
  ``p = p - step_size * m / denom``; divisions and square roots correctly rounded.

``"double"`` (the kernel of 2022-2025): the hyperparameters stay float64 and every
expression that mixes them with float32 values is evaluated in float64 and rounded once
to float32 (``m = beta1 * m + (1 - beta1) * g`` ...); the bias corrections from the step
count in float64, rounded to float32; the rest as above.

Under a GradScaler (``grad_scale``/``found_inf``, as torch's GradScaler hands them to fused
optimizers) a step whose ``found_inf`` is 1 changes nothing (torch's kernel returns
early), and the step counts go back by ``found_inf`` afterwards, as torch's ``_fused_adam``
does.  ``benchmarks/bench_o2_update.py --check`` compares the kernel and the formula with
torch's CUDA kernel on a device.
"""

from __future__ import annotations

from typing import Any, Final

import torch
import triton
import triton.language as tl

__all__ = ["FORMULAS", "launch_adam"]

#: elements per program
BLOCK: Final = 2048
#: the versions of torch's CUDA fused Adam the kernel transcribes (the module docstring)
FORMULAS: Final = ("opmath", "double")


@triton.jit
def _decay(p, g, lr, weight_decay, DECAY: tl.constexpr, ADAMW: tl.constexpr, DOUBLE: tl.constexpr):
    """Adam's weight decay (into the gradient) or AdamW's (into the parameter)."""
    if DOUBLE:
        if DECAY and ADAMW:
            p = (p.to(tl.float64) - lr * weight_decay * p.to(tl.float64)).to(tl.float32)
        elif DECAY:
            g = (g.to(tl.float64) + p.to(tl.float64) * weight_decay).to(tl.float32)
    else:
        if DECAY and ADAMW:
            p = tl.fma(-(lr * weight_decay), p, p)
        elif DECAY:
            g = tl.fma(p, weight_decay, g)
    return p, g


@triton.jit
def _moments(g, m, v, beta1, beta2, DOUBLE: tl.constexpr):
    """The new ``exp_avg`` and ``exp_avg_sq`` (float32) from the decayed gradient ``g``."""
    if DOUBLE:
        wide = g.to(tl.float64)
        m = (beta1 * m.to(tl.float64) + (1.0 - beta1) * wide).to(tl.float32)
        v = (beta2 * v.to(tl.float64) + (1.0 - beta2) * wide * wide).to(tl.float32)
    else:
        m = tl.fma(beta1, m, tl.fma(-beta1, g, g))
        square = g * g
        v = tl.fma(beta2, v, tl.fma(-beta2, square, square))
    return m, v


@triton.jit(do_not_specialize=["n"])  # one compilation per set of flags, whatever the sizes
def _adam_master_kernel(
    master,
    grad,
    low,
    exp_avg,
    exp_avg_sq,
    max_exp_avg_sq,
    corrections,
    hyper,
    grad_scale,
    found_inf,
    n,
    ADAMW: tl.constexpr,
    DECAY: tl.constexpr,
    AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    SCALE: tl.constexpr,
    SKIP: tl.constexpr,
    DOUBLE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    if SKIP:  # torch's kernel returns when found_inf == 1: nothing is read or written
        # (one address, broadcast; not tl.zeros_like, which the interpreter fails to call
        # once Triton's driver was queried outside it)
        mask = mask & (tl.load(found_inf + offsets * 0) != 1.0)
    lr, beta1, beta2 = tl.load(hyper), tl.load(hyper + 1), tl.load(hyper + 2)
    weight_decay, eps = tl.load(hyper + 3), tl.load(hyper + 4)
    correction1, correction2_sqrt = tl.load(corrections), tl.load(corrections + 1)
    if DOUBLE:
        step_size = (lr / correction1.to(tl.float64)).to(tl.float32)  # (div.rn.f64)
    else:
        step_size = tl.div_rn(lr, correction1)
    p = tl.load(master + offsets, mask=mask, other=0.0)
    g = tl.load(grad + offsets, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(exp_avg + offsets, mask=mask, other=0.0)
    v = tl.load(exp_avg_sq + offsets, mask=mask, other=0.0)
    if SCALE:  # (float64 in the "double" source: the same float32 result, 53 >= 2 * 24 + 2 bits)
        g = tl.div_rn(g, tl.load(grad_scale))
    if MAXIMIZE:
        g = -g
    p, g = _decay(p, g, lr, weight_decay, DECAY, ADAMW, DOUBLE)
    m, v = _moments(g, m, v, beta1, beta2, DOUBLE)
    top = v
    if AMSGRAD:
        top = tl.load(max_exp_avg_sq + offsets, mask=mask, other=0.0)
        top = tl.where(top < v, v, top)  # std::max(max_exp_avg_sq, exp_avg_sq)
        tl.store(max_exp_avg_sq + offsets, top, mask=mask)
    denom = tl.div_rn(tl.sqrt_rn(top), correction2_sqrt)
    if DOUBLE:
        denom = (denom.to(tl.float64) + eps).to(tl.float32)
    else:
        denom = denom + eps
    p = p - tl.div_rn(step_size * m, denom)
    tl.store(master + offsets, p, mask=mask)
    tl.store(exp_avg + offsets, m, mask=mask)
    tl.store(exp_avg_sq + offsets, v, mask=mask)
    tl.store(low + offsets, p.to(low.dtype.element_ty), mask=mask)


def launch_adam(
    group: dict[str, Any] | Any,
    masters: list[torch.Tensor],
    grads: list[torch.Tensor],
    lows: list[torch.Tensor],
    states: list[dict[str, Any]],
    formula: str = "opmath",
    grad_scale: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
) -> None:
    """One fused Adam/AdamW step (``group["decoupled_weight_decay"]``: AdamW) of each master
    from its low-precision gradient, refreshing its low-precision parameter, with torch's
    fused Adam's arithmetic (``formula``, one of :data:`FORMULAS`) and its GradScaler
    protocol (``grad_scale`` divides the gradients; ``found_inf`` equal to 1 skips the
    update).  The step counts (float32 tensors on the device, as torch's fused Adam keeps
    them) advance first and go back by ``found_inf`` after, in multi-tensor ops, as torch's
    ``_fused_adam`` does.  Every tensor contiguous, on one device; no host sync."""
    if formula not in FORMULAS:
        raise ValueError(f"formula={formula!r}: expected one of {', '.join(FORMULAS)}")
    double = formula == "double"
    device = masters[0].device
    steps = [state["step"] for state in states]
    torch._foreach_add_(steps, 1)
    beta1, beta2 = group["betas"]
    values = (float(group["lr"]), float(beta1), float(beta2), float(group["weight_decay"]), float(group["eps"]))
    # on the device as a tensor, of the formula's type: a kernel's float argument is
    # float32 unless Triton honours a float64 annotation, which depends on its version
    # (an asynchronous copy of 20-40 bytes, no host sync)
    hyper = torch.tensor(values, dtype=torch.float64 if double else torch.float32).to(device, non_blocking=True)
    corrections = _corrections(torch.stack(steps), float(beta1), float(beta2), double)
    scale = None if grad_scale is None else grad_scale.to(device, dtype=torch.float32, non_blocking=True)
    skip = None if found_inf is None else found_inf.to(device, dtype=torch.float32, non_blocking=True)
    flags = {
        "ADAMW": bool(group["decoupled_weight_decay"]),
        "DECAY": float(group["weight_decay"]) != 0.0,
        "AMSGRAD": bool(group["amsgrad"]),
        "MAXIMIZE": bool(group["maximize"]),
        "SCALE": scale is not None,
        "SKIP": skip is not None,
        "DOUBLE": double,
    }
    # enable_fp_fusion=False: no multiply-add contracted by Triton; the kernel's explicit
    # fma are the ones nvcc makes in torch's kernel
    for index, (master, grad, low, state) in enumerate(zip(masters, grads, lows, states, strict=True)):
        n = master.numel()
        top = state["max_exp_avg_sq"] if flags["AMSGRAD"] else state["exp_avg_sq"]
        _adam_master_kernel[(triton.cdiv(n, BLOCK),)](
            master, grad, low, state["exp_avg"], state["exp_avg_sq"], top, corrections[index], hyper,
            hyper if scale is None else scale, hyper if skip is None else skip, n,
            BLOCK=BLOCK, enable_fp_fusion=False, **flags,
        )  # fmt: skip
    if skip is not None:
        torch._foreach_sub_(steps, [skip] * len(steps))


def _corrections(counts: torch.Tensor, beta1: float, beta2: float, double: bool) -> torch.Tensor:
    """Per step count (float32, on the device) the float32 pair ``1 - beta1 ** count``,
    ``sqrt(1 - beta2 ** count)``: in float32 from the float32-rounded betas (the "opmath"
    formula: torch's float32 ``pow`` kernel calls the device ``pow`` the fused kernel
    calls), or in float64, rounded at the end (the "double" formula); no host sync."""
    if double:
        counts = counts.double()
    else:
        beta1, beta2 = (float(torch.tensor(b, dtype=torch.float32)) for b in (beta1, beta2))
    first = torch.pow(beta1, counts).neg_().add_(1)
    # (a correctly rounded square root, as the device's sqrtf: through float64 when float32)
    second = torch.pow(beta2, counts).neg_().add_(1).double().sqrt_().to(counts.dtype)
    # four columns: every tensor's pair starts 16 bytes after the last, so that the kernel's
    # pointer argument stays 16-byte aligned (Triton compiles a variant per alignment)
    return torch.stack((first, second, first, second), dim=1).float()
