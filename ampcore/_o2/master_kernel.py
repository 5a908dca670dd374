"""Which kernel runs O2's own Adam/AdamW master update: torch's, or ampcore's Triton kernel.

``"torch"`` (the default): torch's Adam function on the float32 masters, the flavour the
param group asks for (single-tensor, foreach, fused), the low-precision gradients widened
first and the low-precision parameters copied from the masters after; bit-identical to
torch's optimizer on float32 masters.

``"triton"`` (opt-in, :func:`set_master_update_kernel`): the param groups with
``fused=True`` run ``triton_adam.py``'s one-pass kernel instead, which reads the
low-precision gradients directly and writes the masters, the states and the low-precision
parameters (28 bytes per parameter instead of 40; on a bandwidth-bound device that is the
update's time).  Its arithmetic transcribes torch's CUDA fused Adam operation by operation
(``triton_adam.py``), GradScaler's ``grad_scale``/``found_inf`` included; that the compiled
kernel is bit-identical to torch's on a device is checked there, not assumed
(``benchmarks/bench_o2_update.py --check``), hence opt-in.  Groups without ``fused=True``,
a tensor ``lr``, and parameters whose tensors are not contiguous on one device keep
torch's path.
"""

from __future__ import annotations

import importlib.util
import os
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

import torch

from .._errors import AmpcoreError, AmpcoreWarning, warn_user

if TYPE_CHECKING:
    from .master import MasterKernel

__all__ = [
    "TritonKernelUnusedWarning",
    "get_master_update_kernel",
    "set_master_update_kernel",
    "triton_update",
    "warn_unused",
]

#: (master, gradient, low-precision parameter or None, Adam state) per parameter
Work = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, Any]]]

KERNELS: Final[tuple[Literal["torch", "triton"], ...]] = ("torch", "triton")


def set_master_update_kernel(optimizer: torch.optim.Optimizer, kernel: MasterKernel) -> None:
    """Choose the kernel of the Adam/AdamW master update of an optimizer decorated at O2.

    ``"torch"`` (the default) runs torch's own Adam on the float32 masters, bit-identical
    to torch's optimizer.  ``"triton"`` runs a one-pass Triton kernel for the param groups
    with ``fused=True``: it reads the low-precision gradients directly and refreshes the
    low-precision parameters in the same pass, with the arithmetic of torch's CUDA fused
    Adam (bit-identity with it is reported per device by ``benchmarks/bench_o2_update.py
    --check``; see docs/o2.md).  Needs Triton installed and a device Triton drives (or
    ``TRITON_INTERPRET=1``).

    Under ``GradScaler`` the kernel takes the scale and the found-inf flag the scaler hands
    fused optimizers, as torch's fused kernel does (no float32 gradient copies either).
    A step that ampcore does not run itself (step hooks, a closure, a differentiable
    group) runs torch's fused kernel instead, with one :class:`TritonKernelUnusedWarning`.

    Raises:
        AmpcoreError: ``optimizer`` has no ampcore master weights; ``kernel`` is not one of
            ``"torch"``, ``"triton"``; for ``"triton"``: the optimizer is not exactly
            ``torch.optim.Adam``/``AdamW``, none of its param groups has ``fused=True``, or
            Triton is missing or does not drive the masters' device.

    Example::

        >>> import torch, ampcore
        >>> model = torch.nn.Linear(4, 4)
        >>> opt = torch.optim.AdamW(model.parameters(), fused=True)
        >>> model, opt = ampcore.decorate(model, opt, device="cpu")
        >>> ampcore.set_master_update_kernel(opt, "torch")
        >>> ampcore.get_master_update_kernel(opt)
        'torch'
    """
    from .master import master_weights_of

    weights = master_weights_of(optimizer)
    if weights is None:
        raise AmpcoreError(
            f"set_master_update_kernel(): {type(optimizer).__name__} has no ampcore master weights "
            "(pass it to ampcore.decorate(..., level='O2') first)"
        )
    if kernel not in KERNELS:
        raise AmpcoreError(f"set_master_update_kernel(kernel={kernel!r}): expected one of {', '.join(KERNELS)}")
    if kernel == "triton":
        reason = _not_for_triton(optimizer) or triton_unavailable(weights.masters[0].device)
        if reason is not None:
            raise AmpcoreError(f"set_master_update_kernel(kernel='triton'): {reason}; the kernel stays 'torch'")
    weights.kernel = kernel


def get_master_update_kernel(optimizer: torch.optim.Optimizer) -> MasterKernel:
    """The kernel of an O2 optimizer's Adam/AdamW master update (see
    :func:`set_master_update_kernel`).

    Raises:
        AmpcoreError: ``optimizer`` has no ampcore master weights.
    """
    from .master import master_weights_of

    weights = master_weights_of(optimizer)
    if weights is None:
        raise AmpcoreError(f"get_master_update_kernel(): {type(optimizer).__name__} has no ampcore master weights")
    return weights.kernel


class TritonKernelUnusedWarning(AmpcoreWarning):
    """An optimizer set to the Triton master-update kernel ran a step through torch's kernel."""


_warned: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()


def _not_for_triton(optimizer: torch.optim.Optimizer) -> str | None:
    """Why the Triton kernel can never run ``optimizer``'s update (None: it can)."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return f"the kernel runs torch.optim.Adam and AdamW updates, not {type(optimizer).__name__}'s"
    if not any(group.get("fused") for group in optimizer.param_groups):
        return "it runs the param groups with fused=True, and this optimizer has none (pass fused=True)"
    return None


def warn_unused(optimizer: torch.optim.Optimizer) -> None:
    """Say once per optimizer that a step set to the Triton kernel ran torch's instead
    (``optimizer.step`` found that ampcore does not run this step itself)."""
    if optimizer in _warned:
        return
    _warned.add(optimizer)
    why = (
        "ampcore does not run this step itself (step hooks, a differentiable group, a closure, or a GradScaler "
        "step with a param group that is not fused=True)"
    )
    warn_user(
        f"set_master_update_kernel(kernel='triton'): this {type(optimizer).__name__} step ran torch's fused "
        f"kernel on float32 gradient copies instead: {why} (said once per optimizer)",
        TritonKernelUnusedWarning,
    )


def triton_unavailable(device: torch.device) -> str | None:
    """Why the Triton kernel cannot run on ``device`` (None: it can)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton)"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None  # the interpreter runs kernels on any tensors the host can read
    try:
        from triton.runtime import driver

        driven = driver.active.get_active_torch_device().type
    except Exception as exc:  # no driver for this machine, or a Triton without the query
        return f"Triton found no device to drive ({type(exc).__name__}: {exc})"
    if driven != device.type:
        return f"Triton drives {driven!r} devices, the master weights are on {device.type!r}"
    return None


def triton_update(
    group: Mapping[str, Any],
    work: Work,
    grad_scale: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
) -> Work:
    """Update the masters of ``work`` that the Triton kernel can take (a master with a
    low-precision parameter, every tensor contiguous on the master's device, a float
    ``lr``, a float32 step count there, not ``capturable``: the kernel copies its
    hyperparameters from the host, which a CUDA graph cannot capture), with GradScaler's
    ``grad_scale``/``found_inf`` where given; returns the rest, for torch's Adam."""
    if isinstance(group["lr"], torch.Tensor) or group.get("capturable"):
        return work
    taken: Work = []
    rest: Work = []
    for item in work:
        param, grad, low, state = item
        moments = [state[name] for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if name in state]
        tensors = (param, grad, low, *moments, state["step"])
        fits = low is not None and all(t.device == param.device and t.is_contiguous() for t in tensors)
        (taken if fits and state["step"].dtype == torch.float32 else rest).append(item)
    if taken:
        from .triton_adam import launch_adam

        lows = [low for _, _, low, _ in taken if low is not None]
        masters, grads = [p for p, *_ in taken], [g for _, g, *_ in taken]
        launch_adam(group, masters, grads, lows, [s for *_, s in taken], grad_scale=grad_scale, found_inf=found_inf)
    return rest
