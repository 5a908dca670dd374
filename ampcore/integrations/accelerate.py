"""Hugging Face Accelerate with ampcore: :class:`AmpcoreAccelerator` (``pip install
ampcore[accelerate]``).

An ``accelerate.Accelerator`` (with its own mixed precision off) whose ``autocast()`` enters
``ampcore.autocast`` with the given settings and whose ``scaler`` is an
:class:`ampcore.GradScaler`: ``accelerator.backward(loss)`` scales, the prepared optimizer's
``step()`` steps through the scaler (skipped steps leave everything untouched, gradient
accumulation steps only at sync), ``clip_grad_norm_`` unscales first, and
``save_state``/``load_state`` carry the scaler.  At level O2, ``prepare`` decorates the
models with the optimizers passed in the same call.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from contextlib import contextmanager
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from torch import nn

from .._errors import AmpcoreError
from .._o2.checkpoint import decorated_model_of
from .._o2.master import master_weights_of
from ._settings import AmpcoreSettings

__all__ = ["AmpcoreAccelerator"]


class AmpcoreAccelerator(Accelerator):
    """``accelerate.Accelerator`` running ampcore's regions and scaler.

    Args:
        *args: for ``Accelerator``.
        ampcore: an :class:`~ampcore.integrations.AmpcoreSettings` (device, level, dtype,
            custom lists, scaler options); ``None``: O1 on the accelerator's device.
        **kwargs: for ``Accelerator``; ``mixed_precision`` must be ``"no"`` (or absent).

    Raises:
        AmpcoreError: Accelerate's own mixed precision is on (two autocasts and two
            scalers would fight), or the settings' device is not the accelerator's.

    Example::

        >>> import torch
        >>> from ampcore.integrations import AmpcoreSettings
        >>> from ampcore.integrations.accelerate import AmpcoreAccelerator
        >>> accelerator = AmpcoreAccelerator(cpu=True, ampcore=AmpcoreSettings(device="cpu", level="O1"))
        >>> net = torch.nn.Linear(4, 1)
        >>> model, opt = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
        >>> with accelerator.autocast():
        ...     loss = model(torch.randn(2, 4)).float().pow(2).mean()
        >>> accelerator.backward(loss); opt.step(); opt.zero_grad()
    """

    def __init__(self, *args: Any, ampcore: AmpcoreSettings | None = None, **kwargs: Any) -> None:
        precision = kwargs.get("mixed_precision")
        if precision not in (None, "no"):
            raise AmpcoreError(
                f"AmpcoreAccelerator(mixed_precision={precision!r}): ampcore does the mixed precision; "
                "leave Accelerate's off and choose the dtype with ampcore=AmpcoreSettings(dtype=...)"
            )
        super().__init__(*args, **kwargs)
        if self.mixed_precision != "no":
            raise AmpcoreError(
                f"AmpcoreAccelerator: Accelerate's mixed precision is {self.mixed_precision!r} (from "
                "`accelerate config` or ACCELERATE_MIXED_PRECISION); set it to 'no': ampcore does the mixed precision"
            )
        settings = ampcore if ampcore is not None else AmpcoreSettings(device=self.device.type)
        if settings.device.split(":")[0] != self.device.type:
            raise AmpcoreError(
                f"AmpcoreAccelerator(ampcore=AmpcoreSettings(device={settings.device!r})): the accelerator runs "
                f"on {self.device.type!r}; give the settings that device"
            )
        self.ampcore = settings
        self.scaler = settings.make_scaler()

    @contextmanager
    def autocast(self, autocast_handler: Any = None) -> Generator[None, None, None]:
        """``ampcore.autocast`` with the accelerator's settings (``autocast_handler`` is ignored)."""
        with self.ampcore.autocast():
            yield

    def prepare(self, *args: Any, device_placement: Any = None) -> Any:
        """``Accelerator.prepare``; at level O2 first ``ampcore.decorate`` the models with the
        optimizers of the same call (on the accelerator's device)."""
        if self.ampcore.level == "O2":
            models = [a for a in args if isinstance(a, nn.Module) and decorated_model_of(a) is None]
            optimizers = [a for a in args if isinstance(a, torch.optim.Optimizer) and master_weights_of(a) is None]
            if models:
                for model in models:
                    model.to(self.device)
                self.ampcore.decorate_models(models, optimizers or None)
        return super().prepare(*args, device_placement=device_placement)

    def _inner_optimizers(self, optimizer: Any = None) -> list[torch.optim.Optimizer]:
        if optimizer is None:
            chosen = self._optimizers
        else:
            chosen = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        found = []
        for opt in chosen:
            while isinstance(opt, AcceleratedOptimizer):
                opt = opt.optimizer
            found.append(opt)
        return found

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Unscale the optimizers' gradients through ampcore's scaler (once per step)."""
        if self.scaler is None:
            return
        for opt in self._inner_optimizers(optimizer):
            self.scaler.unscale_(opt)

    def clip_grad_norm_(self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2) -> Any:
        """Unscale, then clip; at O2 the optimizers' fp32 master gradients are clipped (the
        ones the update uses) instead of the model's low-precision ones."""
        parameters = list(parameters)
        inner = self._inner_optimizers()
        if any(master_weights_of(opt) is not None for opt in inner):
            parameters = [p for opt in inner for group in opt.param_groups for p in group["params"]]
        return super().clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
