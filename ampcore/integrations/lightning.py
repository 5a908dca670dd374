"""Lightning precision plugins that run ampcore: :class:`AmpcorePrecision` for the
``Trainer``, :class:`AmpcoreFabricPrecision` for ``Fabric`` (``pip install ampcore[lightning]``).

Both carry an :class:`~ampcore.integrations.AmpcoreSettings` (device, level, dtype, custom
lists, scaler options): the forward pass (training, validation, test and predict steps) runs
under ``ampcore.autocast``, the loss is scaled before backward, the step goes through
``GradScaler.step``/``update`` (a skipped step leaves model and optimizer untouched), and the
scaler's state is part of Lightning's checkpoints.

Level O2: the ``Trainer`` plugin decorates the LightningModule and its optimizers when
Lightning connects them (single-device strategies: Lightning's DDP strategy builds DDP
before the optimizers exist, and decorate must come first, so the plugin refuses O2 there);
with ``Fabric`` decorate the model and optimizer yourself before ``fabric.setup`` (the
plugin checks that you did).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

import torch
from lightning.fabric.plugins.precision import Precision as FabricPrecision
from lightning.pytorch.plugins.precision import Precision as TrainerPrecision
from torch import nn

from .._errors import AmpcoreError
from .._o2.checkpoint import decorated_model_of
from ._settings import AmpcoreSettings

__all__ = ["AmpcoreFabricPrecision", "AmpcorePrecision"]


def _settings(settings: AmpcoreSettings | None, kwargs: dict[str, Any], call: str) -> AmpcoreSettings:
    if settings is not None and kwargs:
        raise AmpcoreError(
            f"{call}: pass either settings=AmpcoreSettings(...) or its keywords ({', '.join(kwargs)}), not both"
        )
    return settings if settings is not None else AmpcoreSettings(**kwargs)


class _Shared:
    """What both plugins do the same way."""

    settings: AmpcoreSettings
    scaler: Any

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.settings.autocast()

    def _scale(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(tensor) if self.scaler is not None else tensor

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.scaler is not None and state_dict:
            self.scaler.load_state_dict(state_dict)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)


class AmpcoreFabricPrecision(_Shared, FabricPrecision):
    """``Fabric(plugins=AmpcoreFabricPrecision(device="cpu", level="O1", ...))``.

    Args:
        settings: an :class:`~ampcore.integrations.AmpcoreSettings`, or its keywords
            (``device``, ``level``, ``dtype``, ``custom_white_list``,
            ``custom_black_list``, ``scaler``).

    At level O2 decorate first: ``model, opt = ampcore.decorate(model, opt, level="O2")``,
    then ``fabric.setup(model, opt)``; ``fabric.backward(loss)`` scales the loss and
    ``optimizer.step()`` (Fabric's wrapped optimizer) steps through the scaler.

    Example::

        >>> import torch, lightning
        >>> from ampcore.integrations.lightning import AmpcoreFabricPrecision
        >>> plugin = AmpcoreFabricPrecision(device="cpu", level="O1", custom_black_list={"gelu"})
        >>> fabric = lightning.Fabric(accelerator="cpu", devices=1, plugins=plugin)
        >>> net = torch.nn.Linear(4, 1)
        >>> model, opt = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        >>> with fabric.autocast():
        ...     out = model(torch.randn(2, 4))
        >>> out.dtype
        torch.bfloat16
        >>> fabric.backward(out.float().sum()); opt.step(); opt.zero_grad()
    """

    precision = "ampcore"  # not one of Lightning's names

    def __init__(self, settings: AmpcoreSettings | None = None, **kwargs: Any) -> None:
        self.settings = _settings(settings, kwargs, "AmpcoreFabricPrecision")
        self.scaler = self.settings.make_scaler()

    def convert_module(self, module: nn.Module) -> nn.Module:
        if self.settings.level == "O2" and decorated_model_of(module) is None:
            raise AmpcoreError(
                "AmpcoreFabricPrecision(level='O2'): the model was not decorated. Decorate it with its "
                "optimizers before fabric.setup: `model, opt = ampcore.decorate(model, opt, level='O2')`, "
                "then `model, opt = fabric.setup(model, opt)`"
            )
        return module

    def backward(self, tensor: torch.Tensor, model: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        super().backward(self._scale(tensor), model, *args, **kwargs)

    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        if self.scaler is None:
            return super().optimizer_step(optimizer, **kwargs)
        result = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return result


class AmpcorePrecision(_Shared, TrainerPrecision):
    """``Trainer(plugins=[AmpcorePrecision(device="cpu", level="O1", ...)])``.

    Args:
        settings: an :class:`~ampcore.integrations.AmpcoreSettings`, or its keywords
            (``device``, ``level``, ``dtype``, ``custom_white_list``,
            ``custom_black_list``, ``scaler``, ``decorate``).

    Gradient clipping (``Trainer(gradient_clip_val=...)``) sees unscaled gradients: the
    scaler unscales after the closure, before ``on_before_optimizer_step``, as Lightning's
    own AMP plugin does; at O2 it clips the optimizer's fp32 master gradients.

    Example::

        >>> from ampcore.integrations.lightning import AmpcorePrecision
        >>> plugin = AmpcorePrecision(device="cpu", level="OD", custom_white_list={"gelu"})
        >>> plugin.settings.level, plugin.scaler.is_enabled()
        ('OD', False)
    """

    precision = "ampcore"  # not one of Lightning's names

    def __init__(self, settings: AmpcoreSettings | None = None, **kwargs: Any) -> None:
        self.settings = _settings(settings, kwargs, "AmpcorePrecision")
        self.scaler = self.settings.make_scaler()

    def connect(
        self, model: nn.Module, optimizers: list[torch.optim.Optimizer], lr_schedulers: list[Any]
    ) -> tuple[nn.Module, list[torch.optim.Optimizer], list[Any]]:
        if self.settings.level == "O2" and decorated_model_of(model) is None:
            if isinstance(model, nn.parallel.DistributedDataParallel):
                raise AmpcoreError(
                    "AmpcorePrecision(level='O2'): the strategy wrapped the model in DistributedDataParallel "
                    "before the optimizers existed, and ampcore.decorate must convert the model (with its "
                    "optimizers) before DDP is built. Under Lightning's DDP strategy use level 'O1' or 'OD' "
                    "(the plugin's autocast and scaler work there), or O2 on a single device"
                )
            self.settings.decorate_models(model, list(optimizers) or None)
        return model, optimizers, lr_schedulers

    @contextlib.contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        with self.settings.autocast():
            yield

    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        scaled: torch.Tensor = super().pre_backward(self._scale(tensor), module)
        return scaled

    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        if self.scaler is None:
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise AmpcoreError(
                "AmpcorePrecision: ampcore.GradScaler does not support closures, so not LBFGS; pass scaler=None"
            )
        closure_result = closure()
        skip = closure_result is None and model.automatic_optimization  # backward was skipped
        if not skip and not getattr(optimizer, "_step_supports_amp_scaling", False):
            self.scaler.unscale_(optimizer)  # before clipping and on_before_optimizer_step
        self._after_closure(model, optimizer)
        if skip:
            return closure_result
        result = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return result
