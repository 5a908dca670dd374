"""The first-use self-check of the one-pass update for torch's default (for-loop) flavour
(``onepass_loop_kernel.cpp``): the kernel against torch's ``_single_tensor_adam`` and
``_single_tensor_sgd`` on float32 masters with the widened gradients, bit for bit.

Small random problems (a few milliseconds): sizes below, at and past lerp's vector run and
past a thread grain; Adam and AdamW with decay, amsgrad, maximize, beta1 = 0 (the lerp whose
vector body and scalar tail differ in a zero's sign); SGD without and with momentum
(dampening, Nesterov, decay, maximize, the first step that makes the buffer); bfloat16 and
float16 gradients with zeros of both signs; three steps each.  The tests
(``tests/o2/test_onepass_loop.py``) check far more; this check exists because another CPU,
compiler or torch build may round differently.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Final

import torch

from .onepass_check import same

__all__ = ["ADAM_CASES", "SGD_CASES", "SIZES", "adam_case", "self_check", "sgd_case"]

#: one element, a lerp run and a tail, several runs and a tail, more than a thread grain
SIZES: Final = (1, 31, 100, 33000)
ADAM_CASES: Final[tuple[dict[str, Any], ...]] = (
    {"adamw": True, "weight_decay": 0.01, "amsgrad": False, "maximize": False, "betas": (0.9, 0.999)},
    {"adamw": False, "weight_decay": 0.1, "amsgrad": True, "maximize": True, "betas": (0.8, 0.99)},
    {"adamw": False, "weight_decay": 0.0, "amsgrad": False, "maximize": False, "betas": (0.0, 0.9), "scale": 1024.0},
)
SGD_CASES: Final[tuple[dict[str, Any], ...]] = (
    {"weight_decay": 0.0, "momentum": 0.0, "dampening": 0.0, "nesterov": False, "maximize": False},
    {"weight_decay": 0.01, "momentum": 0.9, "dampening": 0.0, "nesterov": True, "maximize": False},
    {"weight_decay": 0.0, "momentum": 0.5, "dampening": 0.25, "nesterov": False, "maximize": True, "scale": 8.0},
)


def gradient(n: int, dtype: torch.dtype, generator: torch.Generator, scale: float | None = None) -> torch.Tensor:
    """Gradients over many binades, with zeros of both signs (times a loss scale)."""
    g = torch.randn(n, generator=generator) * torch.exp2(torch.randint(-8, 4, (n,), generator=generator).float())
    zeros = torch.randint(0, 16, (n,), generator=generator)
    g = torch.where(zeros == 0, torch.zeros(()), g)
    g = torch.where(zeros == 1, torch.tensor(-0.0), g)
    return (g * scale if scale else g).to(dtype)


def unscaling(case: dict[str, Any]) -> torch.Tensor | None:
    """GradScaler's float32 inverse scale for ``case["scale"]`` (None: no scaler)."""
    scale = case.get("scale")
    return None if scale is None else torch.tensor(scale, dtype=torch.float64).reciprocal().float()


def widened(grad: torch.Tensor, inv_scale: torch.Tensor | None) -> torch.Tensor:
    """What torch's optimizer gets: the gradient widened, then unscaled as GradScaler does."""
    wide = grad.float()
    return wide if inv_scale is None else wide.mul_(inv_scale)


def adam_case(
    module: ModuleType,
    layout: tuple[int, bool],
    n: int,
    dtype: torch.dtype,
    case: dict[str, Any],
    seed: int = 0,
    foreach: bool = False,
) -> list[str]:
    """Three steps of the kernel and of torch's for-loop Adam/AdamW (``foreach``: its
    foreach Adam) on ``n`` elements; the names of the tensors that differ (empty:
    bit-identical)."""
    from torch.optim.adam import _multi_tensor_adam, _single_tensor_adam

    torchs = _multi_tensor_adam if foreach else _single_tensor_adam

    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(n, generator=generator)
    ref, mine, low = start.clone(), start.clone(), start.to(dtype)
    ref_states, states = [torch.zeros(n) for _ in range(3)], [torch.zeros(n) for _ in range(3)]
    ref_step, step = torch.tensor(0.0), torch.tensor(0.0)
    beta1, beta2 = case["betas"]
    amsgrad = case["amsgrad"]
    inv = unscaling(case)
    for _ in range(3):
        grad = gradient(n, dtype, generator, case.get("scale"))
        torchs(
            [ref], [widened(grad, inv)], [ref_states[0]], [ref_states[1]], [ref_states[2]] if amsgrad else [],
            [ref_step], None, None, amsgrad=amsgrad, has_complex=False, beta1=beta1, beta2=beta2, lr=1e-3,
            weight_decay=case["weight_decay"], eps=1e-8, maximize=case["maximize"], capturable=False,
            differentiable=False, decoupled_weight_decay=case["adamw"],
        )  # fmt: skip
        module.adam(
            [mine], [grad], [low], [states[0]], [states[1]], [states[2]] if amsgrad else [], [step], 1e-3, beta1,
            beta2, case["weight_decay"], 1e-8, amsgrad, case["maximize"], case["adamw"], inv, *layout,
        )  # fmt: skip
    pairs = {"master": (ref, mine), "exp_avg": (ref_states[0], states[0]), "exp_avg_sq": (ref_states[1], states[1])}
    pairs["max_exp_avg_sq"] = (ref_states[2], states[2])
    pairs["parameter"] = (ref.to(dtype), low)
    pairs["step"] = (ref_step, step)
    return [name for name, (a, b) in pairs.items() if not same(a, b)]


def sgd_case(
    module: ModuleType,
    layout: tuple[int, bool],
    n: int,
    dtype: torch.dtype,
    case: dict[str, Any],
    seed: int = 0,
    foreach: bool = False,
) -> list[str]:
    """Three steps of the kernel and of torch's for-loop SGD (``foreach``: its foreach SGD;
    the first step making the momentum buffer, as torch's clone); the names of the tensors
    that differ."""
    from torch.optim.sgd import _multi_tensor_sgd, _single_tensor_sgd

    torchs = _multi_tensor_sgd if foreach else _single_tensor_sgd

    generator = torch.Generator().manual_seed(seed)
    start = torch.randn(n, generator=generator)
    ref, mine, low = start.clone(), start.clone(), start.to(dtype)
    ref_bufs: list[torch.Tensor | None] = [None]
    buf = torch.empty(n)
    keys = ("weight_decay", "momentum", "dampening", "nesterov", "maximize")
    momentum = case["momentum"] != 0
    inv = unscaling(case)
    for index in range(3):
        grad = gradient(n, dtype, generator, case.get("scale"))
        torchs(
            [ref], [widened(grad, inv)], ref_bufs, None, None, lr=0.01, has_sparse_grad=False,
            **{key: case[key] for key in keys},
        )  # fmt: skip
        module.sgd(
            [mine], [grad], [low], [buf] if momentum else [], [index == 0] if momentum else [], case["weight_decay"],
            case["momentum"], 0.01, case["dampening"], case["nesterov"], case["maximize"], inv, *layout,
        )  # fmt: skip
    pairs = {"master": (ref, mine), "parameter": (ref.to(dtype), low)}
    if momentum:
        pairs["momentum_buffer"] = (ref_bufs[0], buf)  # type: ignore[assignment]
    return [name for name, (a, b) in pairs.items() if not same(a, b)]


def self_check(module: ModuleType, layout: tuple[int, bool]) -> str | None:
    """None where the kernel is bit-identical to torch's for-loop optimizers on every
    problem of this check; else the first difference, in words."""
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float16):
            for n in SIZES:
                for case in ADAM_CASES:
                    differ = adam_case(module, layout, n, dtype, case)
                    if differ:
                        return f"for-loop Adam {case}, {n} {dtype} elements: {', '.join(differ)} differ"
                for case in SGD_CASES:
                    differ = sgd_case(module, layout, n, dtype, case)
                    if differ:
                        return f"for-loop SGD {case}, {n} {dtype} elements: {', '.join(differ)} differ"
    return None
