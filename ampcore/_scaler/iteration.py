"""The scaler's training-loop state machine: one explicit record per optimizer and iteration
(as ``torch.amp.GradScaler``'s per-optimizer states).

Each optimizer goes READY -> UNSCALED (``unscale_``, or inside ``step``) -> STEPPED
(``step``), and back to READY at ``update()``, which forgets every record.  A record is kept
only once a call on its optimizer succeeded: a refused call records nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from .._errors import AmpcoreError
from .store import CALL

__all__ = ["OptimizerRecord", "Stage", "check_optimizer"]


class Stage(Enum):
    """Where an optimizer stands in the current iteration."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


@dataclass
class OptimizerRecord:
    """What the scaler knows about one optimizer during the current iteration."""

    stage: Stage = Stage.READY
    found_inf: torch.Tensor | None = None
    #: whether step() skipped the update (None: not read on the host, fused optimizers)
    skipped: bool | None = None

    def check_can_unscale(self) -> None:
        """Refuse a second ``unscale_`` (or one after ``step``) in the same iteration."""
        if self.stage is Stage.UNSCALED:
            raise AmpcoreError("unscale_() has already been called on this optimizer since the last update().")
        if self.stage is Stage.STEPPED:
            raise AmpcoreError("unscale_() is being called after step().")

    def check_can_step(self) -> None:
        """Refuse a second ``step`` in the same iteration."""
        if self.stage is Stage.STEPPED:
            raise AmpcoreError("step() has already been called since the last update().")


def check_optimizer(call: str, optimizer: object) -> None:
    """Refuse what is no optimizer (a model, None) before anything is recorded."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, (list, tuple)) or not callable(getattr(optimizer, "step", None)):
        hint = "; pass the optimizer, not the model" if isinstance(optimizer, torch.nn.Module) else ""
        raise AmpcoreError(
            f"{CALL}.{call}(optimizer={type(optimizer).__name__}): expected a torch.optim.Optimizer "
            f"(an object with param_groups and step()){hint}"
        )
