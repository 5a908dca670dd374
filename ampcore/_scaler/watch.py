"""The scaler's watch for a collapsing loss scale: every step skipped, the scale backing off
without end (DeepSpeed#697, "scale stuck, the model stops learning").

A lower scale helps only when the *scaled* gradients overflow.  When an op overflows by
itself (a float16 ``rsqrt`` in a norm layer that was not kept float32, an exp of large
logits), every step overflows whatever the scale, and the scaler backs off silently from
65536 to 0.06.  The watch counts consecutive iterations with a skipped step, from the flag
:meth:`GradScaler.step` reads on the host anyway (no extra sync), and after ``patience`` of
them warns (:class:`LossScaleCollapseWarning`) or raises, with a hint that points at the op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from .._errors import AmpcoreError, AmpcoreWarning, warn_user
from .options import check_int

__all__ = ["ON_COLLAPSE", "CollapseWatch", "LossScaleCollapseWarning"]

#: What the scaler does when the scale collapses.
ON_COLLAPSE: Final = ("warn", "raise")

HINT: Final = (
    "A smaller scale cannot help when an op overflows by itself. Find the op with "
    "`with ampcore.debugging.check_numerics(): loss = ...; scaler.scale(loss).backward()`, then keep "
    "it in float32: custom_black_list={'<op>'} in ampcore.autocast, or its layer with "
    "ampcore.decorate(..., excluded_layers=[...]) or ampcore.register_fp32_module(<layer type>); "
    "or train in bfloat16."
)


class LossScaleCollapseWarning(AmpcoreWarning):
    """:class:`ampcore.GradScaler` skipped ``collapse_patience`` steps in a row: gradients
    overflow at every scale, so the model stops learning."""


class CollapseWatch:
    """Counts consecutive iterations with a skipped step; reports once per collapse."""

    def __init__(self, call: str, patience: int | None, action: str) -> None:
        if patience is not None:
            patience = check_int(call, "collapse_patience", patience, 1)
        if action not in ON_COLLAPSE:
            raise AmpcoreError(
                f"{call}(on_collapse={action!r}): expected one of {', '.join(repr(a) for a in ON_COLLAPSE)}"
            )
        self.patience = patience
        self.action = action
        self.skipped_in_row = 0

    def record(self, skipped: list[bool], describe_scale: Callable[[], str], error: type[AmpcoreError]) -> None:
        """One iteration's skip flags (those read on the host); warn or raise at ``patience``."""
        if self.patience is None or not skipped:
            return
        if not any(skipped):
            self.skipped_in_row = 0
            return
        self.skipped_in_row += 1
        if self.skipped_in_row != self.patience:
            return
        message = (
            f"ampcore.GradScaler: the last {self.patience} steps were all skipped because their gradients "
            f"held inf/nan{describe_scale()}; the model is not learning. {HINT}"
        )
        if self.action == "raise":
            raise error(message + " (on_collapse='raise')")
        warn_user(message, LossScaleCollapseWarning)
