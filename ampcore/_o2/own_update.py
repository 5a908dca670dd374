"""Which of ampcore's own master-weight updates runs a step, and how it walks the parameters.

``MasterWeights.step`` (``master.py``) asks :func:`own_update` for the update of the coming
step: torch's Adam/AdamW run by ampcore (``master_adam.py``), torch's SGD run by ampcore
(``master_sgd.py``), or None where torch's own step must run on float32 gradient copies
(step hooks, a closure, a subclass, a differentiable group...).  Each update runs on the
walk of :class:`~ampcore._o2.update_walk.UpdateWalk` (chunks or whole tensors), unscaling
the gradients as it widens them under GradScaler's deferred unscaling
(``scaled_update.py``); Adam's whole-tensor walk keeps what does not change between steps
(``adam_plans.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .master_adam import fused_adam_applies, fused_adam_update
from .master_kernel import warn_unused
from .master_sgd import fused_sgd_applies, fused_sgd_update
from .scaled_update import SLICES, unscaled_update
from .update_walk import walks_differ

if TYPE_CHECKING:
    from .master import MasterWeights

__all__ = ["adam_update", "own_update", "sgd_update"]

#: an update of the masters (and of the float32 parameters it updates whole, which it returns)
Update = Callable[[], list[torch.Tensor]]


def own_update(weights: MasterWeights, plain: bool) -> Update | None:
    """The update ampcore runs itself for this step of ``weights``' optimizer, or None
    (``plain``: the step has no arguments, no closure).  Warns once where the Triton
    kernel was chosen but torch's Adam runs."""
    optimizer = weights.optimizer
    adam = plain and fused_adam_applies(optimizer)
    if weights.kernel == "triton" and not adam:
        warn_unused(optimizer)
    if adam:
        return functools.partial(adam_update, weights)
    if plain and fused_sgd_applies(optimizer):
        return functools.partial(sgd_update, weights)
    return None


def _walk(
    weights: MasterWeights, kind: str, update: Callable[[int | None], list[torch.Tensor]], scaled: bool = False
) -> list[torch.Tensor]:
    """``update`` on the walk of ``weights.walk``; untimed and whole where chunks cannot
    walk ``kind``'s update (``scaled``: under GradScaler's deferred unscaling)
    differently (``update_walk.walks_differ``)."""
    key = f"{kind}-scaled" if scaled else kind
    differ = weights.walks_differ.get(key)
    if differ is None:
        groups, chunk = weights.optimizer.param_groups, weights.walk.chunk
        differ = walks_differ(groups, chunk, batched=kind == "adam", slices=SLICES if scaled else 0)
        weights.walks_differ[key] = differ
    return weights.walk.run(update, alike=not differ)


def sgd_update(weights: MasterWeights) -> list[torch.Tensor]:
    """torch SGD from the low-precision gradients: momentum-free in one pass
    (``master_sgd``), fused or with momentum by torch's SGD of the group's flavour on
    gradients widened chunk by chunk (``master_sgd_torch``)."""
    optimizer, low_of, pending = weights.optimizer, weights.low_of, weights.pending
    groups = optimizer.param_groups
    if pending is not None and pending.masters:  # unscale as the gradients are widened
        return _walk(
            weights,
            "sgd",
            lambda chunk: unscaled_update(
                pending,
                groups,
                chunk,
                lambda part: fused_sgd_update(part, low_of, chunk, optimizer, weights.onepass),
                _direct(weights, lambda group, inv: fused_sgd_update([group], low_of, chunk, optimizer, True, inv)),
            ),
            scaled=True,
        )
    return _walk(weights, "sgd", lambda chunk: fused_sgd_update(groups, low_of, chunk, optimizer, weights.onepass))


def adam_update(weights: MasterWeights) -> list[torch.Tensor]:
    """Adam/AdamW (``master_adam``), from the low-precision gradients (or the fp32 ones
    the masters hold already)."""
    optimizer, low_of, pending = weights.optimizer, weights.low_of, weights.pending
    triton, onepass = weights.kernel == "triton", weights.onepass
    if pending is not None and pending.masters:  # unscale as the gradients are widened
        return _walk(
            weights,
            "adam",
            lambda chunk: unscaled_update(
                pending,
                optimizer.param_groups,
                chunk,
                lambda part: fused_adam_update(optimizer, low_of, chunk, triton, onepass, groups=part),
                _direct(
                    weights,
                    lambda group, inv: fused_adam_update(
                        optimizer, low_of, chunk, triton, True, groups=[group], inv_scale=inv
                    ),
                ),
            ),
            scaled=True,
        )
    plans = weights.adam_plans
    return _walk(
        weights, "adam", lambda chunk: fused_adam_update(optimizer, low_of, chunk, triton, onepass, plans=plans)
    )


def _direct(
    weights: MasterWeights, update: Callable[[dict[str, Any], torch.Tensor], list[torch.Tensor]]
) -> Callable[[dict[str, Any], torch.Tensor], list[torch.Tensor] | None] | None:
    """For :func:`.scaled_update.unscaled_update`: ``update`` for the groups the one-pass
    kernel of the for-loop flavour takes (it unscales as it reads the gradients), or None
    where it does not run here."""
    if not weights.onepass:
        return None
    from .onepass_loop import loop_ready, takes

    def run(group: dict[str, Any], inv_scale: torch.Tensor) -> list[torch.Tensor] | None:
        if not takes(group) or not loop_ready():
            return None
        return update(group, inv_scale)

    return run
