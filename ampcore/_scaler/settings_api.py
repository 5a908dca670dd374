"""The getters, setters and checkpoints of :class:`ampcore.GradScaler` (torch's names).

A mixin over the scaler's one record of what it keeps, ``self._store``
(:class:`~ampcore._scaler.store.ScaleStore`); Paddle's names for the same settings are in
``paddle.py``.
"""

from __future__ import annotations

from typing import Any

from .._errors import AmpcoreError
from .state import build_state_dict, parse_state_dict
from .store import CALL, ScaleStore

__all__ = ["ScalerSettingsMethods"]


class ScalerSettingsMethods:
    """The scale, the settings and the state dicts of a scaler (mixed into GradScaler)."""

    _store: ScaleStore

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when not scaling).

        Syncs with the host (reads the device).
        """
        return self._store.scale_value()

    def is_enabled(self) -> bool:
        """Whether the scaler scales the loss.

        ``False`` when constructed with ``enabled=False``, and for a dtype that needs no loss
        scaling (then it still skips steps with non-finite gradients).
        """
        return self._store.scaling

    def get_growth_factor(self) -> float:
        """The factor the scale grows by."""
        return self._store.options.growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor (> 1)."""
        store = self._store
        store.options = store.options.with_values(f"{CALL}.set_growth_factor", growth_factor=new_factor)

    def get_backoff_factor(self) -> float:
        """The factor the scale backs off by."""
        return self._store.options.backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor (in (0, 1))."""
        store = self._store
        store.options = store.options.with_values(f"{CALL}.set_backoff_factor", backoff_factor=new_factor)

    def get_growth_interval(self) -> int:
        """How many consecutive clean steps grow the scale."""
        return self._store.options.growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval (>= 1).  A clean-step count already at or past it grows the
        scale at the next clean step."""
        store = self._store
        store.options = store.options.with_values(f"{CALL}.set_growth_interval", growth_interval=new_interval)
        store.cap_trackers()

    def get_hysteresis(self) -> int:
        """How many consecutive overflow steps back the scale off."""
        return self._store.options.hysteresis

    def set_hysteresis(self, new_hysteresis: int) -> None:
        """Set the hysteresis (>= 1).  An overflow count already at or past it backs off at the
        next overflow step."""
        store = self._store
        store.options = store.options.with_values(f"{CALL}.set_hysteresis", hysteresis=new_hysteresis)
        store.cap_trackers()

    def get_min_scale(self) -> float | None:
        """The lower bound of the scale (``None``: none)."""
        return self._store.options.min_scale

    def get_max_scale(self) -> float | None:
        """The upper bound of the scale (``None``: none)."""
        return self._store.options.max_scale

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: the scale, both counters and the settings, as
        plain Python values (torch's five keys plus ampcore's; see docs/scaler.md).

        ``{}`` when the scaler does not scale.  Syncs with the host; call it after
        :meth:`update`.

        Example::

            >>> import ampcore
            >>> s = ampcore.GradScaler("cpu", enabled=True, hysteresis=2)
            >>> s.state_dict()["hysteresis"], s.state_dict()["_overflow_tracker"]
            (2, 0)
        """
        if not self._store.scaling:
            return {}
        return build_state_dict(self._store.current_state())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state saved by :meth:`state_dict`, or by ``torch.amp.GradScaler`` (its five
        keys; this scaler's hysteresis, bounds and flags stay, the overflow count starts at 0).

        Missing, extra or wrongly typed entries raise :class:`ampcore.AmpcoreError` and leave
        the scaler unchanged.  A scaler that does not scale checks the dict, then ignores it.

        Example::

            >>> import torch, ampcore
            >>> theirs = torch.amp.GradScaler("cpu", init_scale=256.0)
            >>> ours = ampcore.GradScaler("cpu", enabled=True)
            >>> ours.load_state_dict(theirs.state_dict())
            >>> ours.get_scale()
            256.0
        """
        call = f"{CALL}.load_state_dict"
        store = self._store
        if isinstance(state_dict, dict) and not state_dict:
            if not store.scaling:
                return
            raise AmpcoreError(
                f"{call}(): The source state dict is empty, possibly because it was saved from a "
                "disabled instance of GradScaler (or from one whose dtype needs no loss scaling)."
            )
        state = parse_state_dict(call, state_dict, store.options)
        if store.scaling:
            store.restore(state)
