"""O2 without master weights: the warning when ``ampcore.decorate`` gets no optimizer, and
the mark that lets a later error (``GradScaler.unscale_`` on float16 gradients) say why.

Paddle's AMP guide decorates the model alone (``decorate(models=model, level='O2')``) after
creating the optimizer.  Here that converts the parameters in place, so the optimizer made
before (or after) the call updates low-precision weights directly: no fp32 master weights,
and small updates round away (1e-3 on a weight of 1.0 is lost in bfloat16).  decorate cannot
reach an optimizer it was not given, so it says so at once and marks the parameters; then,
once per process, it registers a global optimizer step pre-hook (torch's registry is
process-wide) that finds the optimizer holding marked parameters at its first step and names it.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable
from typing import Any, Final

import torch
from torch import nn

from .._backends.backend import dtype_name
from .._errors import AmpcoreWarning
from .decorate_checks import CALL, DecorateRequest
from .master import master_of, master_weights_of
from .master_sgd import MASTER_BLIND_HOOKS
from .model_plan import ModelPlan

__all__ = [
    "FIX",
    "NO_OPTIMIZER",
    "NoMasterWeightsWarning",
    "mark_without_masters",
    "no_master_reason",
    "warn_no_optimizer",
    "watch_optimizer_steps",
]

_MARK: Final = "_ampcore_no_master"
#: The reason marked on parameters decorated at O2 without any optimizer.
NO_OPTIMIZER: Final = "decorate(level='O2') was called without its optimizer"
#: The step pre-hook's handle (registered once per process) and the optimizers it checked.
_WATCH: Final[list[Any]] = []
_CHECKED: Final[weakref.WeakSet[torch.optim.Optimizer]] = weakref.WeakSet()
#: What to write instead, in every message about missing master weights.
FIX: Final = (
    "pass the optimizer to decorate in the same call, on the model before it was decorated: "
    "`model, optimizer = ampcore.decorate(model, optimizer, level='O2')` (create the optimizer first; "
    "Paddle's `decorate(models=model, optimizers=optimizer, level='O2')` works as written)"
)


class NoMasterWeightsWarning(AmpcoreWarning):
    """``ampcore.decorate(level="O2")`` made parameters low precision without fp32 master weights."""


def warn_no_optimizer(request: DecorateRequest, plans: Iterable[ModelPlan]) -> None:
    """Warn that O2 without optimizers keeps no master weights: only if trainable parameters
    convert and some model is in training mode (``model.eval()`` first: inference, no warning;
    the step pre-hook still names an optimizer that later trains them)."""
    if not any(model.training for model in request.models):
        return
    count = sum(p.numel() for plan in plans for p in plan.params if p.is_floating_point() and p.requires_grad)
    if not count:
        return
    low = dtype_name(request.low)
    warnings.warn(
        f"{CALL}(level='O2') got no optimizer: {count:,} parameter values become torch.{low} in place "
        "and no float32 master weights are kept, so an optimizer created before this call (as in "
        f"Paddle's AMP guide) or after it updates torch.{low} weights directly and small updates are "
        f"lost (1e-3 added to 1.0 rounds away in bfloat16); with float16, GradScaler.step then refuses the "
        f"float16 gradients. To keep master weights, {FIX}. To train without them on purpose, pass "
        "master_weight=False.",
        NoMasterWeightsWarning,
        stacklevel=4,
    )


def mark_without_masters(models: Iterable[nn.Module], low: torch.dtype, reason: str) -> None:
    """Mark every ``low`` parameter of ``models`` that got no master weight, with ``reason``."""
    for model in models:
        for param in model.parameters():
            if param.dtype == low and master_of(param) is None:
                param.__dict__[_MARK] = reason


def no_master_reason(param: torch.Tensor) -> str | None:
    """Why decorate left ``param`` without a master weight (``None``: not marked by decorate)."""
    reason = getattr(param, "__dict__", {}).get(_MARK)
    return reason if isinstance(reason, str) else None


def watch_optimizer_steps() -> None:
    """Register (once per process) the step pre-hook that names an optimizer holding
    parameters decorated without it, at that optimizer's first step."""
    if not _WATCH:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        MASTER_BLIND_HOOKS.add(_check_first_step)  # returns at once for an optimizer with masters
        _WATCH.append(register_optimizer_step_pre_hook(_check_first_step))


def _check_first_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Warn once per optimizer that updates parameters decorate left without masters."""
    if optimizer in _CHECKED:
        return
    _CHECKED.add(optimizer)
    if master_weights_of(optimizer) is not None:
        return
    marked = [p for group in optimizer.param_groups for p in group["params"] if no_master_reason(p) == NO_OPTIMIZER]
    if not marked:
        return
    low = dtype_name(marked[0].dtype)
    warnings.warn(
        f"{type(optimizer).__name__}.step(): {len(marked)} of this optimizer's parameters were made torch.{low} "
        "by ampcore.decorate(level='O2') without this optimizer, so it updates them with no float32 master "
        f"weights (small updates are lost). To keep master weights, {FIX}.",
        NoMasterWeightsWarning,
        stacklevel=3,
    )
