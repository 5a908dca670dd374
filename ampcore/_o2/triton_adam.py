"""A Triton kernel for O2's fused Adam/AdamW master update, one pass per parameter.

Imported only when an optimizer asked for it (:func:`ampcore.set_master_update_kernel`):
Triton is never a dependency of ampcore.

Per element the kernel reads the low-precision gradient, the float32 master and the Adam
states, and writes the master, the states and the low-precision parameter (rounded from
the new master): 2 + 8 + 16 (+ 8 with amsgrad) + 2 bytes per parameter, one pass, where
torch's fused Adam on the masters needs the gradients widened into float32 first and the
parameters copied back after (40 bytes per parameter in three passes).

The arithmetic is that of torch's CUDA fused Adam (``adam_math`` in
``aten/src/ATen/native/cuda/fused_adam_utils.cuh``): the moment updates and the weight
decay in float64 from float32 operands, rounded to float32; the bias corrections from the
float32 step count in float64 (``1 - pow(beta, step)``; the second one's square root in
float64), rounded to float32; the step size ``lr / bias_correction1`` rounded to float32;
``denom = sqrt(v) / bias_correction2_sqrt`` in float32 plus ``eps`` in float64; the update
``param - step_size * m / denom`` in float32; square roots and divisions correctly rounded.
Whether the compiled kernel matches torch's bit for bit depends on how both compilers
contract multiply-adds: ``benchmarks/bench_o2_update.py --check`` reports it per device.
"""

from __future__ import annotations

from typing import Any, Final

import torch
import triton
import triton.language as tl

__all__ = ["launch_adam"]

#: elements per program
BLOCK: Final = 2048
#: the arithmetic of :func:`launch_adam`: torch's fused Adam, and two diagnostics
PRECISIONS: Final = ("float64", "float32-hyperparameters", "float32")


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
    n,
    ADAMW: tl.constexpr,
    DECAY: tl.constexpr,
    AMSGRAD: tl.constexpr,
    MAXIMIZE: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    # the arithmetic's type: float64 as torch's fused Adam, or float32 (a diagnostic)
    wide: tl.constexpr = COMPUTE
    lr, beta1, beta2 = tl.load(hyper).to(wide), tl.load(hyper + 1).to(wide), tl.load(hyper + 2).to(wide)
    weight_decay, eps = tl.load(hyper + 3).to(wide), tl.load(hyper + 4).to(wide)
    correction2_sqrt = tl.load(corrections + 1)
    if wide == tl.float64:
        step_size = (lr / tl.load(corrections).to(wide)).to(tl.float32)  # (division.rn.f64)
    else:
        step_size = tl.div_rn(lr, tl.load(corrections))
    p = tl.load(master + offsets, mask=mask, other=0.0)
    g = tl.load(grad + offsets, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(exp_avg + offsets, mask=mask, other=0.0)
    v = tl.load(exp_avg_sq + offsets, mask=mask, other=0.0)
    if MAXIMIZE:
        g = -g
    if DECAY:
        if ADAMW:
            p = (p.to(wide) - lr * weight_decay * p.to(wide)).to(tl.float32)
        else:
            g = (g.to(wide) + p.to(wide) * weight_decay).to(tl.float32)
    g_wide = g.to(wide)
    m = (beta1 * m.to(wide) + (1.0 - beta1) * g_wide).to(tl.float32)
    v = (beta2 * v.to(wide) + (1.0 - beta2) * g_wide * g_wide).to(tl.float32)
    if AMSGRAD:
        top = tl.maximum(tl.load(max_exp_avg_sq + offsets, mask=mask, other=0.0), v)
        tl.store(max_exp_avg_sq + offsets, top, mask=mask)
        root = tl.sqrt_rn(top)
    else:
        root = tl.sqrt_rn(v)
    denom = (tl.div_rn(root, correction2_sqrt).to(wide) + eps).to(tl.float32)
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
    precision: str = "float64",
) -> None:
    """One fused Adam/AdamW step (``group["decoupled_weight_decay"]``: AdamW) of each master
    from its low-precision gradient, refreshing its low-precision parameter; the step counts
    (float32 tensors on the device, as torch's fused Adam keeps them) advance first, in one
    multi-tensor op, as torch's fused Adam does.  Every tensor contiguous, on one device.
    ``precision``: ``"float64"``, torch's fused Adam; the benchmark's ``--check`` also runs
    two diagnostics for a torch that would compute otherwise: ``"float32-hyperparameters"``
    (rounded to float32 first, float64 arithmetic) and ``"float32"`` (all in float32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(PRECISIONS)}")
    rounding = torch.float64 if precision == "float64" else torch.float32
    wide = precision != "float32"
    steps = [state["step"] for state in states]
    torch._foreach_add_(steps, 1)
    beta1, beta2 = group["betas"]
    scalars = torch.tensor(
        (float(group["lr"]), float(beta1), float(beta2), float(group["weight_decay"]), float(group["eps"])),
        dtype=rounding,
    ).double()
    # float64 on the device: a kernel's float argument is float32 unless Triton honours a
    # float64 annotation, which depends on its version; a float64 tensor is float64 in
    # every version (an asynchronous copy of 40 bytes, no host sync)
    hyper = scalars.to(masters[0].device, non_blocking=True)
    _, beta1, beta2, _, _ = scalars.tolist()
    corrections = _corrections(torch.stack(steps).to(torch.float64 if wide else torch.float32), beta1, beta2)
    flags = {
        "ADAMW": bool(group["decoupled_weight_decay"]),
        "DECAY": float(group["weight_decay"]) != 0.0,
        "AMSGRAD": bool(group["amsgrad"]),
        "MAXIMIZE": bool(group["maximize"]),
        "COMPUTE": tl.float64 if wide else tl.float32,
    }
    # enable_fp_fusion: multiply-adds contracted, as nvcc does by default for torch's kernel
    # (Triton 3.10 turns it off by default)
    for index, (master, grad, low, state) in enumerate(zip(masters, grads, lows, states, strict=True)):
        n = master.numel()
        top = state["max_exp_avg_sq"] if flags["AMSGRAD"] else state["exp_avg_sq"]
        _adam_master_kernel[(triton.cdiv(n, BLOCK),)](
            master, grad, low, state["exp_avg"], state["exp_avg_sq"], top, corrections[index], hyper, n,
            BLOCK=BLOCK, enable_fp_fusion=True, **flags,
        )  # fmt: skip


def _corrections(counts: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """Per step count (on the device), as float32: ``1 - beta1 ** count`` and
    ``sqrt(1 - beta2 ** count)``, each computed in the counts' dtype (float64: as torch's
    fused Adam computes them per tensor in its kernel, from the same ``pow``); no host sync."""
    first = torch.pow(float(beta1), counts).neg_().add_(1)
    second = torch.pow(float(beta2), counts).neg_().add_(1).sqrt_()
    # four columns: every tensor's pair starts 16 bytes after the last, so that the kernel's
    # pointer argument stays 16-byte aligned (Triton compiles a variant per alignment)
    return torch.stack((first, second, first, second), dim=1).float()
