"""Hugging Face ``transformers.Trainer`` with ampcore: :class:`AmpcoreTrainerMixin` and
:class:`AmpcoreTrainer` (``pip install ampcore[transformers]``).

The Trainer keeps its own loop; the mixin changes four places of it:

* ``autocast_smart_context_manager``: the loss is computed under ``ampcore.autocast`` with
  the settings (device, level, dtype, custom lists);
* the accelerator's ``scaler`` is an :class:`ampcore.GradScaler`: ``accelerator.backward``
  scales the loss, the optimizer steps through the scaler (a skipped step also skips the
  LR scheduler, as the Trainer does for torch's scaler), and the Trainer saves and resumes
  it as ``scaler.pt`` in each checkpoint;
* gradient clipping (``max_grad_norm``) and the logged gradient norm unscale first, and at
  O2 use the optimizer's fp32 master gradients (transformers 5 clips in ``_clip_grad_norm``,
  4.x through ``accelerator.clip_grad_norm_``: both are served);
* at level O2 the Trainer's optimizer is decorated with the model when the Trainer creates
  it (with your own optimizer, ``ampcore.decorate`` both before building the Trainer).

Leave ``TrainingArguments(fp16=False, bf16=False)``: ampcore does the mixed precision.
``gradient_checkpointing=True`` works: recomputation runs under the region's policy.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from transformers import Trainer

from .._errors import AmpcoreError
from .._o2.checkpoint import decorated_model_of
from .._o2.master import master_weights_of
from ._settings import AmpcoreSettings

__all__ = ["AmpcoreTrainer", "AmpcoreTrainerMixin"]


class AmpcoreTrainerMixin:
    """Mix into a ``transformers.Trainer`` subclass (before it) to train with ampcore.

    Args:
        *args: for the Trainer.
        ampcore: an :class:`~ampcore.integrations.AmpcoreSettings`; ``None``: O1 on the
            device of ``args`` (``TrainingArguments``).
        **kwargs: for the Trainer.

    Raises:
        AmpcoreError: ``TrainingArguments`` asks for the Trainer's own mixed precision
            (``fp16=True`` or ``bf16=True``).

    Example::

        >>> import tempfile, torch, transformers
        >>> from ampcore.integrations import AmpcoreSettings
        >>> from ampcore.integrations.transformers import AmpcoreTrainer
        >>> config = transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
        >>> data = [{"input_ids": torch.arange(8), "labels": torch.arange(8)}] * 4
        >>> args = transformers.TrainingArguments(tempfile.mkdtemp(), max_steps=2, use_cpu=True, report_to=[],
        ...                                       save_strategy="no", disable_tqdm=True)
        >>> trainer = AmpcoreTrainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
        ...                          ampcore=AmpcoreSettings(device="cpu", level="O1"))
        >>> trainer.train().global_step  # the Trainer prints its metrics
        {'train_runtime': ...}
        2
    """

    # provided by the Trainer this is mixed into
    accelerator: Any
    model: Any
    args: Any
    optimizer: Any

    def __init__(self, *args: Any, ampcore: AmpcoreSettings | None = None, **kwargs: Any) -> None:
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is not None and (
            getattr(training_args, "fp16", False) or getattr(training_args, "bf16", False)
        ):
            raise AmpcoreError(
                "AmpcoreTrainer: TrainingArguments(fp16=True/bf16=True) turns on the Trainer's own mixed "
                "precision; leave both False and choose the dtype with ampcore=AmpcoreSettings(dtype=...)"
            )
        if ampcore is None:
            device = getattr(training_args, "device", None)
            ampcore = AmpcoreSettings(device=device.type if device is not None else "cpu")
        self.ampcore = ampcore
        super().__init__(*args, **kwargs)

    # -- where the Trainer asks --------------------------------------------------------
    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()  # type: ignore[misc]
        self.accelerator.scaler = self.ampcore.make_scaler()
        # transformers 4.x clips in its loop with accelerator.clip_grad_norm_, which unscales
        # only the accelerator's own fp16 mixed precision (off here): the loss-scaled gradients
        self.accelerator.clip_grad_norm_ = self._ampcore_clip

    def autocast_smart_context_manager(
        self, cache_enabled: bool | None = True
    ) -> contextlib.AbstractContextManager[Any]:
        return self.ampcore.autocast()

    def create_optimizer(self, *args: Any, **kwargs: Any) -> torch.optim.Optimizer:
        optimizer: torch.optim.Optimizer = super().create_optimizer(*args, **kwargs)  # type: ignore[misc]
        if self.ampcore.level == "O2" and master_weights_of(optimizer) is None:
            if decorated_model_of(self.model) is not None:
                raise AmpcoreError(
                    "AmpcoreTrainer(level='O2'): the model was decorated without the Trainer's optimizer; "
                    "either let the Trainer decorate both (do not decorate the model yourself), or "
                    "decorate model and optimizer together and pass optimizers=(optimizer, scheduler)"
                )
            self.ampcore.decorate_models(self.model, optimizer)
        return optimizer

    def _clip_grad_norm(self, model: torch.nn.Module) -> Any:
        return self._ampcore_clip(model.parameters(), self.args.max_grad_norm)

    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: Any = None) -> Any:
        if grad_norm is None:
            grad_norm = self._ampcore_clip(model.parameters(), float("inf"))
        return super()._get_grad_norm(model, grad_norm=grad_norm)  # type: ignore[misc]

    # -- helpers ------------------------------------------------------------------------
    def _ampcore_optimizer(self) -> torch.optim.Optimizer:
        optimizer = self.optimizer
        while type(optimizer).__name__ == "AcceleratedOptimizer":  # accelerate's wrapper
            optimizer = optimizer.optimizer
        return optimizer  # type: ignore[no-any-return]

    def _ampcore_unscale(self) -> None:
        scaler = self.accelerator.scaler
        if scaler is not None:
            scaler.unscale_(self._ampcore_optimizer())

    def _ampcore_clip(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Unscale, then clip (and measure) the gradients the update uses: at O2 the
        optimizer's fp32 master gradients, else ``parameters``'."""
        self._ampcore_unscale()
        optimizer = self._ampcore_optimizer()
        if master_weights_of(optimizer) is not None:
            parameters = [p for group in optimizer.param_groups for p in group["params"]]
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


class AmpcoreTrainer(AmpcoreTrainerMixin, Trainer):
    """``transformers.Trainer`` with :class:`AmpcoreTrainerMixin` (takes ``ampcore=``)."""
