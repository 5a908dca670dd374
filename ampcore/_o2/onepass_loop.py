"""The one-pass CPU master update for torch's default optimizer flavour (issues 26 and 31).

A param group with neither ``fused`` nor ``foreach`` set runs, on the CPU, torch's
for-loop optimizer (``_single_tensor_adam``, ``_single_tensor_sgd``): one ATen elementwise
op per line of the update, each a pass over memory.  O2 runs it on the float32 masters,
after widening the low-precision gradients and before refreshing the low-precision
parameters in passes of their own.  ``onepass_loop_kernel.cpp`` (a C++ extension built at
first use, as the fused flavour's ``onepass_kernel.cpp``) does all of it in one pass per
tensor, one call per param group: bfloat16/float16 gradient in, float32 master and states
updated, rounded low-precision parameter out, each op's float32 rounding and torch's
square root (MKL's, where torch uses it) reproduced.  ``foreach=True`` on the CPU runs the
same per-tensor kernels in the same order (measured: the same bits), so it goes here too.

Bit-identity is tested, never assumed: the layout (where torch's build fuses
multiply-adds, lerp's vector run) is transcribed per CPU capability (:data:`LAYOUTS`) and,
at first use, :func:`.onepass_loop_check.self_check` compares the kernel with torch's
for-loop optimizers on this machine; on any difference the kernel is not used (one
:class:`~ampcore._o2.onepass.OnePassWarning`) and torch's path runs.  The choice is the
fused kernel's (``BackendSpec.master_update_onepass``, ``AMPCORE_O2_ONEPASS``), made
separately (a process with only default-flavour groups builds only this kernel).

Where it runs: masters with a low-precision parameter and gradient, every tensor contiguous
on the CPU, a float32 CPU step count (Adam), float hyperparameters, not capturable, not
differentiable.  Anything else stays on torch's path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final, NamedTuple

import torch

from .._cpp_build import build_extension, extension_name, missing_tools
from .onepass import BASE_FLAGS, ISA_FLAGS, OPENMP, Work
from .onepass import _fits as fits
from .onepass_choice import Choice, Chooser, Kernel

__all__ = ["LAYOUTS", "adam_update", "describe", "loop_choice", "loop_ready", "sgd_update", "takes", "unscaled"]

SOURCE: Final = Path(__file__).with_name("onepass_loop_kernel.cpp")
#: the ampcore headers it includes (their bytes are part of the build's name)
HEADERS: Final = (Path(__file__).with_name("onepass_common.h"),)


class LoopLayout(NamedTuple):
    """How torch's elementwise CPU kernels round at its dispatched capability."""

    lerp_width: int  #: the run lerp_'s vector body takes (2 x Vectorized<float>::size() but AVX512: 16)
    contract: bool  #: multiply-adds fused (a build with FMA and -ffp-contract=fast)


#: torch's CPU capability -> its layout (measured with torch 2.13 on x86; others: torch's path)
LAYOUTS: Final[Mapping[str, LoopLayout]] = {
    "AVX512": LoopLayout(16, True),
    "AVX2": LoopLayout(16, True),
    "DEFAULT": LoopLayout(16, False),
}
_HYPER: Final = ("lr", "weight_decay", "eps", "momentum", "dampening")


def _build(capability: str) -> ModuleType:
    stem = f"ampcore_o2_onepass_loop_{capability.lower()}"
    flags = [*BASE_FLAGS, *OPENMP, *ISA_FLAGS.get(capability, ())]
    return build_extension(extension_name(stem, SOURCE, *HEADERS), SOURCE, flags)


def _self_check(module: ModuleType, found: LoopLayout) -> str | None:
    from .onepass_loop_check import self_check  # (its module imports this one)

    return self_check(module, found)


#: the for-loop kernel, for its chooser (``_build``, ``missing_tools`` looked up when called)
LOOP: Final = Kernel(
    "the one-pass CPU master update of torch's for-loop optimizers",
    "torch's for-loop optimizers",
    LAYOUTS,
    lambda capability: _build(capability),
    lambda: missing_tools(),
    _self_check,
    stacklevel=5,
)
_chooser = Chooser(LOOP)


def loop_choice() -> Choice:
    """This process's choice for the default flavour (built and self-checked at the first call)."""
    return _chooser.choose()


def loop_ready() -> bool:
    """Whether the kernel runs in this process (built and self-checked at the first call)."""
    return _module() is not None


def _module() -> tuple[ModuleType, LoopLayout] | None:
    return _chooser.loaded()


def describe() -> str:
    """One line for ``ampcore info`` (building nothing)."""
    return _chooser.describe()


def takes(group: Mapping[str, Any]) -> bool:
    """Whether ``group`` is one this kernel may update (torch's for-loop or CPU foreach flavour
    with float hyperparameters), building nothing."""
    if group.get("fused") or group.get("capturable") or group.get("differentiable"):
        return False
    values = [group.get(key, 0.0) for key in _HYPER]
    values.extend(group.get("betas", ()))
    return not any(isinstance(value, torch.Tensor) for value in values)


def unscaled(grad: torch.Tensor, master: torch.Tensor, inv_scale: torch.Tensor | None) -> torch.Tensor:
    """``grad`` for torch's path: under a deferred unscale (``inv_scale``, scaled_update.py)
    a low-precision gradient widened and multiplied by it, as the scaler's update does."""
    if inv_scale is None or grad.dtype == master.dtype:
        return grad
    return grad.to(master.dtype).mul_(inv_scale.to(grad.device))


def adam_update(group: Mapping[str, Any], work: Work, inv_scale: torch.Tensor | None = None) -> Work:
    """torch's for-loop Adam/AdamW step (``group``, see :func:`takes`) on the items of
    ``work`` the kernel takes (their step counts advanced as torch advances them); returns
    the rest, for torch's path.  ``inv_scale``: the low-precision gradients are scaled by a
    GradScaler whose unscaling was deferred to the update (the kernel multiplies, the rest
    are returned widened and unscaled)."""
    built = _module()
    if built is None or not takes(group):
        return [(m, unscaled(g, m, inv_scale), low, state) for m, g, low, state in work]
    amsgrad = bool(group["amsgrad"])
    names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg", "exp_avg_sq")
    taken: Work = []
    rest: Work = []
    for item in work:
        master, grad, low, state = item
        step = state["step"]
        ok = step.dtype == torch.float32 and step.is_cpu and step.numel() == 1
        (taken if ok and fits(master, grad, low, [state[name] for name in names]) else rest).append(item)
    if taken:
        module, layout = built
        beta1, beta2 = group["betas"]
        states = [state for *_, state in taken]
        module.adam(
            [master for master, *_ in taken],
            [grad for _, grad, *_ in taken],
            [low for _, _, low, _ in taken],
            [state["exp_avg"] for state in states],
            [state["exp_avg_sq"] for state in states],
            [state["max_exp_avg_sq"] for state in states] if amsgrad else [],
            [state["step"] for state in states],
            float(group["lr"]),
            float(beta1),
            float(beta2),
            float(group["weight_decay"]),
            float(group["eps"]),
            amsgrad,
            bool(group["maximize"]),
            bool(group.get("decoupled_weight_decay", False)),
            _on_cpu(inv_scale),
            *layout,
        )
    return [(m, unscaled(g, m, inv_scale), low, state) for m, g, low, state in rest]


def _on_cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.to("cpu", torch.float32)


SgdItem = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]


def sgd_update(
    options: Mapping[str, Any], items: Sequence[SgdItem], inv_scale: torch.Tensor | None = None
) -> tuple[list[int], list[torch.Tensor]]:
    """torch's for-loop SGD step (``options``: the group's ``lr``, ``weight_decay``,
    ``momentum``, ``dampening``, ``nesterov``, ``maximize`` as floats and bools) on the items
    (master, low-precision gradient, low-precision parameter, momentum buffer or None: the
    first step, which makes it) the kernel takes (``inv_scale``: as for :func:`adam_update`;
    the caller unscales the rest with :func:`unscaled`).  Returns the indices of the rest,
    for torch's path, and the momentum buffers of the items taken (in their order; empty
    without momentum)."""
    built = _module()
    if built is None:
        return list(range(len(items))), []
    momentum = float(options["momentum"]) != 0
    taken = [
        index
        for index, (master, grad, low, buf) in enumerate(items)
        if fits(master, grad, low, [buf] if momentum and buf is not None else [])
    ]
    bufs: list[torch.Tensor] = []
    if taken:
        module, layout = built
        first = [items[i][3] is None for i in taken] if momentum else []
        if momentum:  # torch's first step clones the (contiguous) gradient: a contiguous buffer
            bufs = [items[i][3] if items[i][3] is not None else torch.empty_like(items[i][0]) for i in taken]  # type: ignore[misc]
        module.sgd(
            [items[i][0] for i in taken],
            [items[i][1] for i in taken],
            [items[i][2] for i in taken],
            bufs,
            first,
            float(options["weight_decay"]),
            float(options["momentum"]),
            float(options["lr"]),
            float(options["dampening"]),
            bool(options["nesterov"]),
            bool(options["maximize"]),
            _on_cpu(inv_scale),
            *layout,
        )
    chosen = set(taken)
    return [index for index in range(len(items)) if index not in chosen], bufs
