"""The settings every integration carries: the region's device, level, dtype and custom lists,
and the options of its :class:`ampcore.GradScaler`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._dtypes import parse_dtype
from .._errors import AmpcoreError, closest, shown
from .._policy.autocast import autocast
from .._policy.levels import check_level
from .._scaler.grad_scaler import GradScaler

__all__ = ["AmpcoreSettings"]

_DEFAULT: Any = object()  # an argument not given
_CALL = "ampcore.integrations.AmpcoreSettings"
_PARAMETERS = ("device", "level", "dtype", "custom_white_list", "custom_black_list", "scaler", "decorate")


def _misplaced(unknown: dict[str, Any]) -> AmpcoreError:
    """The error for keywords AmpcoreSettings does not take: a GradScaler or decorate option
    (Paddle's names included) is pointed to ``scaler={...}`` or ``decorate={...}``."""
    import inspect

    from .._o2.decorate import decorate
    from .._scaler.options import PADDLE_OPTION_NAMES

    scaler_names = set(inspect.signature(GradScaler.__init__).parameters) - {"self", "device", "dtype"}
    scaler_names |= set(PADDLE_OPTION_NAMES)
    decorate_names = set(inspect.signature(decorate).parameters) - {"models", "optimizers", "level", "dtype", "device"}
    name, value = next(iter(unknown.items()))
    if name in scaler_names:
        where = f"it is a GradScaler option: pass scaler={{{name!r}: {shown(value)}}}"
    elif name in decorate_names:
        where = f"it is an ampcore.decorate option: pass decorate={{{name!r}: {shown(value)}}}"
    else:
        hints = closest(name, [*_PARAMETERS, *scaler_names, *decorate_names], n=1, same_first_word=True)
        where = f"did you mean {hints[0]!r}?" if hints else f"valid: {', '.join(_PARAMETERS)}"
    return AmpcoreError(
        f"{_CALL}({name}=...): not a keyword of AmpcoreSettings; {where} "
        f"(AmpcoreSettings takes {', '.join(_PARAMETERS)})"
    )


@dataclass(frozen=True)
class _SettingsRecord:
    """The checked values of :class:`AmpcoreSettings` (immutable once built)."""

    device: str = "cpu"
    level: str = "O1"
    dtype: torch.dtype | None = None
    custom_white_list: frozenset[str] | None = None
    custom_black_list: frozenset[str] | None = None
    scaler: dict[str, Any] | None = field(default_factory=dict)
    decorate: dict[str, Any] = field(default_factory=dict)


class AmpcoreSettings(_SettingsRecord):
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

    def __init__(
        self,
        device: str = "cpu",
        level: str = "O1",
        dtype: torch.dtype | str | None = None,
        custom_white_list: Iterable[str] | None = None,
        custom_black_list: Iterable[str] | None = None,
        scaler: dict[str, Any] | None = _DEFAULT,
        decorate: dict[str, Any] = _DEFAULT,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise _misplaced(unknown)
        # checked and normalised first, then stored once: the record is never changed
        checked_level = check_level(level, call=_CALL)
        checked_dtype = None if dtype is None else parse_dtype(dtype, _CALL)
        scaler = {} if scaler is _DEFAULT else scaler
        decorate = {} if decorate is _DEFAULT else decorate
        if scaler is not None and not isinstance(scaler, dict):
            raise AmpcoreError(
                f"{_CALL}(scaler={scaler!r}): expected a dict of ampcore.GradScaler keyword arguments, "
                "or None for no scaler"
            )
        if not isinstance(decorate, dict):
            raise AmpcoreError(f"{_CALL}(decorate={decorate!r}): expected a dict of ampcore.decorate keyword arguments")
        super().__init__(
            device=device,
            level=checked_level,
            dtype=checked_dtype,
            custom_white_list=None if custom_white_list is None else frozenset(custom_white_list),
            custom_black_list=None if custom_black_list is None else frozenset(custom_black_list),
            scaler=scaler,
            decorate=decorate,
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
