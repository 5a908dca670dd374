"""The methods of ``paddle.amp.GradScaler`` that torch's GradScaler lacks, on ampcore's scaler.

Paddle's getters and setters use Paddle's parameter names (``incr_ratio`` is ampcore's
``growth_factor``, and so on: :data:`ampcore._scaler.options.PADDLE_OPTION_NAMES`); each one
reads or writes the same setting as its torch-style twin, with the same validation.
``minimize`` is Paddle's ``step()`` + ``update()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._errors import AmpcoreError
from .settings_api import ScalerSettingsMethods
from .store import CALL

__all__ = ["PaddleScalerMethods"]


class PaddleScalerMethods(ScalerSettingsMethods):
    """Paddle's spelling of the scaler API (mixed into :class:`ampcore.GradScaler`).

    Example::

        >>> import torch, ampcore
        >>> scaler = ampcore.GradScaler("cpu", dtype="float16", init_loss_scaling=1024, incr_ratio=4.0)
        >>> scaler.is_enable(), scaler.is_use_dynamic_loss_scaling(), scaler.get_incr_ratio()
        (True, True, 4.0)
        >>> scaler.set_decr_every_n_nan_or_inf(2)
        >>> scaler.get_hysteresis()
        2
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> scaled = scaler.scale(model(torch.randn(8, 4)).pow(2).mean())
        >>> scaled.backward()
        >>> scaler.minimize(opt, scaled)  # step() + update(), as in Paddle
        >>> scaler.get_scale()
        1024.0
    """

    if TYPE_CHECKING:  # provided by GradScaler

        def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any: ...

        def update(self, new_scale: float | torch.Tensor | None = None) -> None: ...

    def minimize(self, optimizer: torch.optim.Optimizer, *args: torch.Tensor) -> None:
        """Paddle's ``minimize``: :meth:`step` then :meth:`update`.

        Paddle passes the scaled loss on to its optimizer's ``minimize``; the gradients are
        already there after ``backward()``, so loss tensors given here are accepted and not
        needed.  Anything else raises (a torch closure belongs to :meth:`step`).
        """
        others = [type(arg).__name__ for arg in args if not isinstance(arg, torch.Tensor)]
        if others:
            raise AmpcoreError(
                f"{CALL}.minimize(optimizer, *args): args may only be the (scaled) loss tensors Paddle passes, "
                f"got {', '.join(others)}; pass a closure to scaler.step(optimizer, closure) instead"
            )
        self.step(optimizer)
        self.update()

    def is_enable(self) -> bool:
        """Paddle's name of :meth:`is_enabled`: whether the loss is scaled."""
        return self.is_enabled()

    def get_enable(self) -> bool:
        """Paddle 2.2's name of :meth:`is_enabled`."""
        return self.is_enabled()

    def is_use_dynamic_loss_scaling(self) -> bool:
        """Whether the scale changes with overflows (``dynamic``, Paddle's ``use_dynamic_loss_scaling``)."""
        return self._store.options.dynamic

    def get_use_dynamic_loss_scaling(self) -> bool:
        """Paddle 2.2's name of :meth:`is_use_dynamic_loss_scaling`."""
        return self._store.options.dynamic

    def get_init_loss_scaling(self) -> float:
        """The initial scale (``init_scale``)."""
        return self._store.options.init_scale

    def set_init_loss_scaling(self, new_init_loss_scaling: float) -> None:
        """Set the initial scale and, as Paddle does, the current scale to it (a scaler that
        does not scale keeps scale 1).  Must lie within ``[min_scale, max_scale]``."""
        store = self._store
        store.reset_scale(store.options.with_values(f"{CALL}.set_init_loss_scaling", init_scale=new_init_loss_scaling))

    def get_incr_ratio(self) -> float:
        """Paddle's name of :meth:`get_growth_factor`."""
        return self.get_growth_factor()

    def set_incr_ratio(self, new_incr_ratio: float) -> None:
        """Paddle's name of :meth:`set_growth_factor` (> 1)."""
        self.set_growth_factor(new_incr_ratio)

    def get_decr_ratio(self) -> float:
        """Paddle's name of :meth:`get_backoff_factor`."""
        return self.get_backoff_factor()

    def set_decr_ratio(self, new_decr_ratio: float) -> None:
        """Paddle's name of :meth:`set_backoff_factor` (in (0, 1))."""
        self.set_backoff_factor(new_decr_ratio)

    def get_incr_every_n_steps(self) -> int:
        """Paddle's name of :meth:`get_growth_interval`."""
        return self.get_growth_interval()

    def set_incr_every_n_steps(self, new_incr_every_n_steps: int) -> None:
        """Paddle's name of :meth:`set_growth_interval` (>= 1)."""
        self.set_growth_interval(new_incr_every_n_steps)

    def get_decr_every_n_nan_or_inf(self) -> int:
        """Paddle's name of :meth:`get_hysteresis`."""
        return self.get_hysteresis()

    def set_decr_every_n_nan_or_inf(self, new_decr_every_n_nan_or_inf: int) -> None:
        """Paddle's name of :meth:`set_hysteresis` (>= 1)."""
        self.set_hysteresis(new_decr_every_n_nan_or_inf)
