"""``auto_plan_table``: why ``level="auto"`` ran each shape class in float32 or low precision."""

from __future__ import annotations

import torch

from .._auto import AutoPlan, auto_plan
from .._backends.registry import DeviceLike

__all__ = ["auto_plan_table"]


def auto_plan_table(
    device: DeviceLike = None, dtype: torch.dtype | str | None = None, plan: AutoPlan | None = None
) -> str:
    """The decisions of ``level="auto"`` as a table: each shape class (module kind,
    hyper-parameters, bucketed input shapes), its measured float32 and low-precision costs
    (casts included), the casts' share, and the decision.

    Args:
        device: the backend (``None``: the best available).
        dtype: the low-precision dtype (``None``: the backend's default).
        plan: a plan to show instead of this process's plan for ``device`` and ``dtype``.

    Example::

        >>> import ampcore.debugging
        >>> print(ampcore.debugging.auto_plan_table("cpu").splitlines()[0])  # doctest: +ELLIPSIS
        ampcore auto plan: cpu (...), bfloat16, torch ..., ampcore ...
    """
    return (plan or auto_plan(device, dtype)).table()
