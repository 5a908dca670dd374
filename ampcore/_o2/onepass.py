"""The one-pass CPU master update: torch's CPU fused Adam/AdamW/SGD in one pass per tensor.

O2 on the CPU runs torch's own fused kernels on the float32 masters, with the widening of
the low-precision gradients and the refresh of the low-precision parameters as passes of
their own.  ``onepass_kernel.cpp`` (a C++ extension built at first use, like the compiled
policy kernel: ``ampcore/_cpp_build.py``) does all three in one pass per tensor: it reads
the bfloat16/float16 gradient, applies the arithmetic of torch's CPU fused kernel of the
group's flavour to the master and its states, and writes the rounded parameter.

Bit-identity with torch is tested, never assumed: where torch's kernel contracts
multiply-adds and how it splits the elements (its dispatched vector width, its thread
chunks) are transcribed, and at first use a self-check (:func:`self_check`) runs both on
small random problems (tails, vector bodies, every option) on this machine; on any
difference the kernel is not used (one :class:`OnePassWarning`) and torch's path runs.

Where it runs: backends whose ``BackendSpec.master_update_onepass`` is true (the CPU
adapter), for param groups with ``fused=True`` (``torch.optim.Adam``/``AdamW``/``SGD``), a
float ``lr``, masters with a low-precision parameter, every tensor contiguous on the CPU.
``AMPCORE_O2_ONEPASS`` chooses: ``auto`` (default: the kernel where it builds and passes
the self-check, else torch's path), ``compiled`` (an error where it cannot), ``torch``
(never).  ``ampcore info`` prints :func:`describe`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final, NamedTuple

import torch

from .._cpp_build import build_extension, extension_name, missing_tools
from .onepass_choice import ENV, Choice, Chooser, Kernel, OnePassWarning

__all__ = ["ENV", "OnePassWarning", "adam_update", "choice", "describe", "layout", "ready", "sgd_update"]

SOURCE: Final = Path(__file__).with_name("onepass_kernel.cpp")
#: the ampcore headers it includes (their bytes are part of the build's name)
HEADERS: Final = (Path(__file__).with_name("onepass_avx512.h"), Path(__file__).with_name("onepass_common.h"))
_LOW: Final = (torch.bfloat16, torch.float16)


class Layout(NamedTuple):
    """How torch's CPU fused kernels split and round at its dispatched capability."""

    width: int  #: Vectorized<float>::size()
    tail_width: int  #: the vector width GCC gave the scalar tail loop (0: none)
    contract: bool  #: multiply-adds fused (a build with FMA and -ffp-contract=fast)


#: torch's CPU capability -> its layout (x86 builds of torch by GCC; others: torch's path)
LAYOUTS: Final[Mapping[str, Layout]] = {
    "AVX512": Layout(16, 8, True),
    "AVX2": Layout(8, 0, True),
    "DEFAULT": Layout(8, 0, False),
}


def layout(capability: str) -> Layout | None:
    """The layout of torch's fused kernels at ``capability`` (``torch.backends.cpu.
    get_cpu_capability()``), or None where ampcore has not transcribed it.

    Example::

        >>> layout("AVX512").width, layout("NEON")
        (16, None)
    """
    return LAYOUTS.get(capability)


#: instruction sets the CPU has where torch dispatched this capability (compiled for them)
ISA_FLAGS: Final[Mapping[str, tuple[str, ...]]] = {
    "AVX512": ("-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mprefer-vector-width=512"),
    "AVX2": ("-mavx2", "-mfma"),
    "DEFAULT": (),
}
#: no contraction the source does not spell (it spells torch's); no errno or trap
#: semantics, so that square roots and selects vectorise (neither changes a value)
BASE_FLAGS: Final = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math")
#: at::parallel_for is an OpenMP region only where the extension is compiled with OpenMP
#: (else it runs serially, whatever torch.get_num_threads() says): torch's thread chunks and
#: torch's thread count (the OpenMP runtime torch loaded)
OPENMP: Final = ("-fopenmp",)


def _build(capability: str) -> ModuleType:
    stem = f"ampcore_o2_onepass_{capability.lower()}"  # one build per instruction set
    flags = [*BASE_FLAGS, *OPENMP, *ISA_FLAGS.get(capability, ())]
    return build_extension(extension_name(stem, SOURCE, *HEADERS), SOURCE, flags)


def _self_check(module: ModuleType, found: Layout) -> str | None:
    from .onepass_check import self_check  # (its module imports this one)

    return self_check(module, found)


#: the fused kernel, for its chooser (``_build``, ``missing_tools`` looked up when called)
FUSED: Final = Kernel(
    "the one-pass CPU master update",
    "torch's fused kernels",
    LAYOUTS,
    lambda capability: _build(capability),
    lambda: missing_tools(),
    _self_check,
    stacklevel=4,
)
_chooser = Chooser(FUSED)


def choice() -> Choice:
    """This process's choice (built and self-checked at the first call)."""
    return _chooser.choose()


def describe() -> str:
    """One line for ``ampcore info`` (building nothing)."""
    return _chooser.describe()


def ready() -> bool:
    """Whether the one-pass kernel runs in this process (built and self-checked at the first call)."""
    return _module() is not None


def _module() -> tuple[ModuleType, Layout] | None:
    return _chooser.loaded()


def _fits(master: torch.Tensor, grad: torch.Tensor, low: torch.Tensor | None, others: Sequence[Any]) -> bool:
    if low is None or master.dtype != torch.float32 or low.dtype not in _LOW or grad.dtype != low.dtype:
        return False
    tensors = (master, grad, low, *others)
    # the kernels read and write through host pointers: tensors in host memory, dense, contiguous
    return all(t.is_cpu and t.is_contiguous() and not t.is_sparse for t in tensors)


Work = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, Any]]]


def adam_update(
    group: Mapping[str, Any], work: Work, grad_scale: torch.Tensor | None, found_inf: torch.Tensor | None
) -> Work:
    """torch's fused Adam/AdamW step (``group``, a ``fused=True`` group) on the items of
    ``work`` the kernel takes, as ``torch.optim.adam._fused_adam`` runs it (step counts
    advanced, then back by ``found_inf``); returns the rest, for torch's path."""
    built = _module()
    if built is None or isinstance(group["lr"], torch.Tensor) or group.get("capturable"):
        return work
    names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")
    taken: Work = []
    rest: Work = []
    for item in work:
        master, grad, low, state = item
        step = state["step"]
        fits = step.dtype == torch.float32 and _fits(master, grad, low, [state[name] for name in names])
        (taken if fits else rest).append(item)
    if taken:
        module, found = built
        steps = [state["step"] for *_, state in taken]
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        module.adam(
            [m for m, *_ in taken],
            [g for _, g, *_ in taken],
            [low for _, _, low, _ in taken],
            [s["exp_avg"] for *_, s in taken],
            [s["exp_avg_sq"] for *_, s in taken],
            [s["max_exp_avg_sq"] for *_, s in taken] if group["amsgrad"] else [],
            steps,
            float(group["lr"]),
            float(beta1),
            float(beta2),
            float(group["weight_decay"]),
            float(group["eps"]),
            bool(group["amsgrad"]),
            bool(group["maximize"]),
            bool(group["decoupled_weight_decay"]),
            _on_cpu(grad_scale),
            _on_cpu(found_inf),
            *found,
        )
        if found_inf is not None:  # a skipped step leaves the counts as they were
            flag = found_inf.to("cpu", torch.float32)
            torch._foreach_sub_(steps, [flag] * len(steps))
    return rest


def sgd_update(
    options: Mapping[str, Any],
    items: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]],
) -> list[int]:
    """torch's fused SGD step (``options``: what ``torch._fused_sgd_`` takes) on the items
    (master, low-precision gradient, low-precision parameter, momentum buffer) the kernel
    takes; returns the indices of the rest, for torch's path."""
    built = _module()
    momentum = float(options["momentum"]) != 0
    if built is None or isinstance(options["lr"], torch.Tensor):
        return list(range(len(items)))
    taken = [
        index
        for index, (master, grad, low, buf) in enumerate(items)
        if _fits(master, grad, low, [buf] if momentum else []) and (buf is not None or not momentum)
    ]
    if taken:
        module, found = built
        module.sgd(
            [items[i][0] for i in taken],
            [items[i][1] for i in taken],
            [items[i][2] for i in taken],
            [items[i][3] for i in taken] if momentum else [],
            float(options["weight_decay"]),
            float(options["momentum"]),
            float(options["lr"]),
            float(options["dampening"]),
            bool(options["nesterov"]),
            bool(options["maximize"]),
            bool(options["is_first_step"]),
            _on_cpu(options["grad_scale"]),
            _on_cpu(options["found_inf"]),
            *found,
        )
    chosen = set(taken)
    return [index for index in range(len(items)) if index not in chosen]


def _on_cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.to("cpu", torch.float32)
