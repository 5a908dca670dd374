"""The first-use self-check of the one-pass CPU master update (``onepass.py``): the kernel
against torch's own CPU fused kernels on float32 masters, bit for bit, on this machine.

Small random problems (a few milliseconds in all): sizes that exercise torch's vector body,
both parts of its scalar tail and several thread chunks; Adam and AdamW with and without
decay, amsgrad, maximize, GradScaler's ``grad_scale``; SGD without and with momentum
(dampening, Nesterov, decay, maximize, the first step); bfloat16 and float16 gradients;
three steps each.  The tests (``tests/o2/test_onepass.py``) check far more cases; this
check exists because another CPU, compiler or torch build may round differently.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Final

import torch

__all__ = ["SIZES", "adam_case", "self_check", "sgd_case"]

#: one vector-body element, tails of 7 and 15 (GCC vectorised 8 of them), several chunks
SIZES: Final = (1, 15, 40, 1000, 4099)
_ADAM: Final[tuple[dict[str, Any], ...]] = (
    {"adamw": True, "weight_decay": 0.01, "amsgrad": False, "maximize": False, "betas": (0.9, 0.999)},
    {"adamw": False, "weight_decay": 0.1, "amsgrad": True, "maximize": True, "betas": (0.8, 0.99)},
    {"adamw": False, "weight_decay": 0.0, "amsgrad": False, "maximize": False, "betas": (0.3, 0.9), "scale": 64.0},
)
_SGD: Final[tuple[dict[str, Any], ...]] = (
    {"weight_decay": 0.0, "momentum": 0.0, "dampening": 0.0, "nesterov": False, "maximize": False},
    {"weight_decay": 0.01, "momentum": 0.9, "dampening": 0.0, "nesterov": True, "maximize": False},
    {"weight_decay": 0.0, "momentum": 0.5, "dampening": 0.25, "nesterov": False, "maximize": True, "scale": 8.0},
)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (NaNs with the same payload too)."""
    bits = torch.int32 if a.element_size() == 4 else torch.int16
    return bool(torch.equal(a.view(bits), b.view(bits)))


def _gradient(n: int, dtype: torch.dtype, generator: torch.Generator, scale: float | None) -> torch.Tensor:
    g = torch.randn(n, generator=generator) * torch.exp2(torch.randint(-8, 4, (n,), generator=generator).float())
    return (g * scale if scale else g).to(dtype)


def adam_case(
    module: ModuleType, layout: tuple[int, int, bool], n: int, dtype: torch.dtype, case: dict[str, Any], seed: int = 0
) -> list[str]:
    """Three steps of the kernel and of torch's fused Adam/AdamW on ``n`` elements; the
    names of the tensors that differ (empty: bit-identical)."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(n, generator=generator)
    ref, mine, low = start.clone(), start.clone(), start.to(dtype)
    zeros = [torch.zeros(n) for _ in range(3)]
    ref_states, states = [t.clone() for t in zeros], [t.clone() for t in zeros]
    ref_step, step = torch.zeros(()), torch.zeros(())
    scale = case.get("scale")
    grad_scale = None if scale is None else torch.tensor(float(scale))
    beta1, beta2 = case["betas"]
    hyper = {"lr": 1e-3, "beta1": beta1, "beta2": beta2, "weight_decay": case["weight_decay"], "eps": 1e-8}
    kernel = torch._fused_adamw_ if case["adamw"] else torch._fused_adam_
    for _ in range(3):
        grad = _gradient(n, dtype, generator, scale)
        ref_step += 1
        step += 1
        kernel(
            [ref], [grad.float()], [ref_states[0]], [ref_states[1]], [ref_states[2]] if case["amsgrad"] else [],
            [ref_step], amsgrad=case["amsgrad"], maximize=case["maximize"], grad_scale=grad_scale, found_inf=None,
            **hyper,
        )  # fmt: skip
        module.adam(
            [mine], [grad], [low], [states[0]], [states[1]], [states[2]] if case["amsgrad"] else [], [step],
            hyper["lr"], beta1, beta2, hyper["weight_decay"], hyper["eps"], case["amsgrad"], case["maximize"],
            case["adamw"], grad_scale, None, *layout,
        )  # fmt: skip
    pairs = {"master": (ref, mine), "exp_avg": (ref_states[0], states[0]), "exp_avg_sq": (ref_states[1], states[1])}
    pairs["max_exp_avg_sq"] = (ref_states[2], states[2])
    pairs["parameter"] = (ref.to(dtype), low)
    return [name for name, (a, b) in pairs.items() if not same(a, b)]


def sgd_case(
    module: ModuleType, layout: tuple[int, int, bool], n: int, dtype: torch.dtype, case: dict[str, Any], seed: int = 0
) -> list[str]:
    """Three steps of the kernel and of torch's fused SGD (the first creating the momentum
    buffers, as torch's is_first_step); the names of the tensors that differ."""
    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(n, generator=generator)
    ref, mine, low = start.clone(), start.clone(), start.to(dtype)
    ref_buf, buf = torch.empty(n), torch.empty(n)
    scale = case.get("scale")
    grad_scale = None if scale is None else torch.tensor(float(scale))
    keys = ("weight_decay", "momentum", "dampening", "nesterov", "maximize")
    momentum = case["momentum"] != 0
    for index in range(3):
        grad = _gradient(n, dtype, generator, scale)
        torch._fused_sgd_(
            [ref], [grad.float()], [ref_buf] if momentum else [], lr=0.01, is_first_step=index == 0,
            grad_scale=grad_scale, found_inf=None, **{key: case[key] for key in keys},
        )  # fmt: skip
        module.sgd(
            [mine], [grad], [low], [buf] if momentum else [], case["weight_decay"], case["momentum"], 0.01,
            case["dampening"], case["nesterov"], case["maximize"], index == 0, grad_scale, None, *layout,
        )  # fmt: skip
    pairs = {"master": (ref, mine), "parameter": (ref.to(dtype), low)}
    if momentum:
        pairs["momentum_buffer"] = (ref_buf, buf)
    return [name for name, (a, b) in pairs.items() if not same(a, b)]


def self_check(module: ModuleType, layout: tuple[int, int, bool]) -> str | None:
    """None where the kernel is bit-identical to torch's fused kernels on every problem of
    this check, with its parameter stores ordinary and streamed (the AVX512 build streams
    large tensors: ``set_stream_min``); else the first difference, in words."""
    default = module.set_stream_min(0)
    try:
        for stream_min in (default, 0):
            module.set_stream_min(stream_min)
            differ = _check(module, layout)
            if differ is not None:
                return differ if stream_min else f"{differ} (streamed stores)"
        return None
    finally:
        module.set_stream_min(default)


def _check(module: ModuleType, layout: tuple[int, int, bool]) -> str | None:
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float16):
            for n in SIZES:
                for case in _ADAM:
                    differ = adam_case(module, layout, n, dtype, case)
                    if differ:
                        return f"Adam {case}, {n} {dtype} elements: {', '.join(differ)} differ"
                for case in _SGD:
                    differ = sgd_case(module, layout, n, dtype, case)
                    if differ:
                        return f"SGD {case}, {n} {dtype} elements: {', '.join(differ)} differ"
    return None
