"""O2 without master weights: the warning when ``ampcore.decorate`` gets no optimizer, and
the mark that lets a later error (``GradScaler.unscale_`` on float16 gradients) say why.

Paddle's AMP guide decorates the model alone (``decorate(models=model, level='O2')``) after
creating the optimizer.  Here that converts the parameters in place, so the optimizer made
before (or after) the call updates low-precision weights directly: no fp32 master weights,
and small updates round away (1e-3 on a weight of 1.0 is lost in bfloat16).  decorate cannot
reach an optimizer it was not given, so it says so at once and marks the parameters.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Final

import torch
from torch import nn

from .._backends.backend import dtype_name
from .._errors import AmpcoreWarning
from .decorate_checks import CALL, DecorateRequest
from .master import master_of
from .model_plan import ModelPlan

__all__ = ["FIX", "NoMasterWeightsWarning", "mark_without_masters", "no_master_reason", "warn_no_optimizer"]

_MARK: Final = "_ampcore_no_master"
#: What to write instead, in every message about missing master weights.
FIX: Final = (
    "pass the optimizer to decorate in the same call, on the model before it was decorated: "
    "`model, optimizer = ampcore.decorate(model, optimizer, level='O2')` (create the optimizer first; "
    "Paddle's `decorate(models=model, optimizers=optimizer, level='O2')` works as written)"
)


class NoMasterWeightsWarning(AmpcoreWarning):
    """``ampcore.decorate(level="O2")`` made parameters low precision without fp32 master weights."""


def warn_no_optimizer(request: DecorateRequest, plans: Iterable[ModelPlan]) -> None:
    """Warn that O2 without optimizers keeps no master weights (only if trainable parameters convert)."""
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
