"""The settings every integration carries: the region's device, level, dtype and custom lists,
and the options of its :class:`ampcore.GradScaler`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._dtypes import parse_dtype
from .._errors import AmpcoreError
from .._policy.autocast import autocast
from .._policy.levels import check_level
from .._scaler.grad_scaler import GradScaler

__all__ = ["AmpcoreSettings"]


@dataclass(frozen=True)
class AmpcoreSettings:
    """What a framework integration needs to run ampcore: one place, checked once.

    Args:
        device: the backend (``"cpu"``, ``"cuda"``...), as for :class:`ampcore.autocast`.
        level: ``"O0"``, ``"OD"``, ``"O1"`` or ``"O2"`` (O2 also decorates the model and
            its optimizers, see each integration).
        dtype: the low-precision dtype or its name; ``None``: the backend's default.
        custom_white_list: op names to run in low precision.
        custom_black_list: op names to keep in float32.
        scaler: ``{}`` (default) builds an :class:`ampcore.GradScaler` for the device and
            dtype (a no-op that still skips non-finite steps where the dtype needs no
            scaling); a dict of its keyword arguments (``init_scale``, ``growth_interval``,
            ``collapse_patience``...); ``None`` for no scaler.
        decorate: keyword arguments for ``ampcore.decorate`` at level O2
            (``keep_norm_fp32``, ``excluded_layers``, ``master_grad``...).

    Example::

        >>> import torch
        >>> from ampcore.integrations import AmpcoreSettings
        >>> settings = AmpcoreSettings(device="cpu", level="O1", custom_black_list={"gelu"})
        >>> with settings.autocast():
        ...     torch.nn.functional.gelu(torch.mm(torch.ones(2, 2), torch.ones(2, 2))).dtype
        torch.float32
        >>> settings.make_scaler().is_enabled()  # bfloat16 on the CPU needs no loss scaling
        False
    """

    device: str = "cpu"
    level: str = "O1"
    dtype: torch.dtype | str | None = None
    custom_white_list: Iterable[str] | None = None
    custom_black_list: Iterable[str] | None = None
    scaler: dict[str, Any] | None = field(default_factory=dict)
    decorate: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        call = "ampcore.integrations.AmpcoreSettings"
        object.__setattr__(self, "level", check_level(self.level, call=call))
        if self.dtype is not None:
            object.__setattr__(self, "dtype", parse_dtype(self.dtype, call))
        for name in ("custom_white_list", "custom_black_list"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, frozenset(value))
        if self.scaler is not None and not isinstance(self.scaler, dict):
            raise AmpcoreError(
                f"{call}(scaler={self.scaler!r}): expected a dict of ampcore.GradScaler keyword arguments, "
                "or None for no scaler"
            )
        if not isinstance(self.decorate, dict):
            raise AmpcoreError(
                f"{call}(decorate={self.decorate!r}): expected a dict of ampcore.decorate keyword arguments"
            )
        self.autocast()  # an invalid device, dtype or list raises here, not in the first step

    def autocast(self) -> autocast:
        """A fresh :class:`ampcore.autocast` region with these settings."""
        return autocast(
            device=self.device,
            dtype=self.dtype,
            level=self.level,
            custom_white_list=self.custom_white_list,
            custom_black_list=self.custom_black_list,
        )

    def make_scaler(self) -> GradScaler | None:
        """The :class:`ampcore.GradScaler` these settings ask for (``None``: no scaler)."""
        if self.scaler is None:
            return None
        options = dict(self.scaler)
        options.setdefault("dtype", self.dtype)
        if self.level == "O0":
            options.setdefault("enabled", False)
        return GradScaler(self.device, **options)

    def decorate_models(self, models: Any, optimizers: Any = None) -> Any:
        """``ampcore.decorate`` at O2 (with ``self.decorate``); other levels: unchanged."""
        from .._o2.decorate import decorate

        if self.level != "O2":
            return models if optimizers is None else (models, optimizers)
        return decorate(models, optimizers, level="O2", dtype=self.dtype, device=self.device, **self.decorate)
