"""``ampcore.GradScaler``: dynamic loss scaling with hysteresis and bounds, on any backend.

The class holds three things: ``_store`` (settings, scale, counters: ``store.py``),
``_kernels`` (the device work: ``kernels.py``) and ``_records`` (the per-optimizer state
machine of the current iteration: ``iteration.py``).  How it unscales and checks each kind
of optimizer's gradients (plain, O2 deferred, fused) comes from ``unscaling.py``, its
getters, setters and checkpoints from ``settings_api.py`` and Paddle's names from
``paddle.py``.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import torch
import torch.distributed as dist

from .._backends.backend import dtype_name
from .._backends.registry import DeviceLike
from .._dtypes import parse_dtype
from .._errors import AmpcoreError
from .._o2.scaled_update import deferred_unscale
from .iteration import OptimizerRecord, Stage, check_optimizer
from .kernels import ScalerKernels
from .nest import map_tensors
from .new_scale import LossScaleAtMinimumError, raise_if_stuck, set_scale_
from .options import ScalerOptions, accepts_paddle_option_names, check_bool
from .paddle import PaddleScalerMethods, check_no_closure
from .store import CALL as _CALL
from .store import make_store
from .unscaling import GradientUnscaling
from .watch import CollapseWatch

__all__ = ["GradScaler", "LossScaleAtMinimumError"]

_SCALE_FIRST: Final = (
    "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
)
T = TypeVar("T")


class GradScaler(GradientUnscaling, PaddleScalerMethods):
    """Dynamic loss scaling for mixed precision training, on any ampcore backend.

    Used like ``torch.amp.GradScaler``: ``scaler.scale(loss).backward()``,
    ``scaler.step(optimizer)``, ``scaler.update()``.  A step whose gradients hold an inf or
    a nan is skipped (parameters and optimizer state untouched).  The scale is multiplied by
    ``backoff_factor`` once ``hysteresis`` consecutive steps overflowed, and by
    ``growth_factor`` after ``growth_interval`` consecutive clean steps; it stays within
    ``[min_scale, max_scale]``.  docs/scaler.md gives the algorithm, which calls synchronise
    with the host (only :meth:`step`, once; none for fused optimizers) and the state-dict
    format.

    Args:
        device: a backend name (``"cuda"``, ``"cuda:1"``), a ``torch.device`` or ``None`` for
            the best available backend.
        dtype: the low-precision training dtype (``torch.float16`` or a name such as
            ``"float16"``, ``"bf16"``); ``None`` takes the backend's default.  It decides
            whether loss scaling is needed (see ``enabled``).
        init_scale: the initial scale (Paddle: ``init_loss_scaling``).
        growth_factor: > 1; applied after ``growth_interval`` clean steps (``incr_ratio``).
        backoff_factor: in (0, 1); applied after ``hysteresis`` overflow steps (``decr_ratio``).
        growth_interval: >= 1 consecutive clean steps before growing (``incr_every_n_steps``).
        hysteresis: >= 1 consecutive overflow steps before backing off
            (``decr_every_n_nan_or_inf``); 1 is torch's behaviour.
        min_scale: lower bound of the scale, or ``None`` for none.
        max_scale: upper bound of the scale, or ``None`` for none.
        dynamic: ``False`` keeps the scale constant at ``init_scale``
            (``use_dynamic_loss_scaling``).
        enabled: ``None`` (default): scale unless the backend says ``dtype`` needs no loss
            scaling (bfloat16): then the scaler is a transparent no-op (scale 1) that still
            skips steps with non-finite gradients, and says so once in an INFO record of the
            ``"ampcore"`` logger.  ``True`` forces scaling; ``False`` turns everything off
            (:meth:`step` just calls ``optimizer.step()``).
        raise_at_min_scale: raise :class:`LossScaleAtMinimumError` from :meth:`update` when
            the scale must back off but already is at ``min_scale`` (needs ``min_scale``;
            costs one host read per :meth:`update`).
        collapse_patience: after this many consecutive iterations whose step was skipped
            (non-finite gradients: the scale collapsing toward its minimum), warn with
            :class:`ampcore.LossScaleCollapseWarning` (once per run of skips) naming how to
            find the op (``ampcore.debugging.check_numerics``); ``None`` turns the watch off.
            Counted from the flag :meth:`step` reads anyway: no extra host sync; fused
            optimizers (no read) are not watched.
        on_collapse: ``"warn"`` (default) or ``"raise"`` (:class:`LossScaleAtMinimumError`).
        process_group: the group over which the found-inf flag is all-reduced (MAX) when
            ``torch.distributed`` is initialised; ``None`` for the default group.
        sync_found_inf: ``False`` never all-reduces the flag (each rank decides alone).

    Paddle's names (``init_loss_scaling``, ``incr_ratio``, ``decr_ratio``,
    ``incr_every_n_steps``, ``decr_every_n_nan_or_inf``, ``use_dynamic_loss_scaling``) are
    accepted too, and Paddle's positional order (a bool first: ``GradScaler(True, 1024)``);
    giving a parameter under both names raises.  :meth:`paddle` gives Paddle's defaults
    (the AMP guide's 32768 / 1000 / 2 by default).  So are Paddle's methods
    (``minimize``, ``is_enable``, ``is_use_dynamic_loss_scaling``, ``get_init_loss_scaling``
    and the other ``get_*``/``set_*`` of ``paddle.amp.GradScaler``).

    Raises:
        AmpcoreError: an invalid setting, an unknown backend or dtype.
        BackendUnavailableError: the backend cannot run here (unless ``enabled=False``).

    Example::

        >>> import torch, ampcore
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> scaler = ampcore.GradScaler("cpu", dtype=torch.float16, init_scale=1024.0)
        >>> loss = model(torch.randn(8, 4)).pow(2).mean()
        >>> scaler.scale(loss).backward()
        >>> scaler.step(opt)
        >>> scaler.update()
        >>> scaler.get_scale()
        1024.0
    """

    @accepts_paddle_option_names
    def __init__(
        self,
        device: DeviceLike = None,
        *,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        hysteresis: int = 1,
        min_scale: float | None = None,
        max_scale: float | None = 2.0**24,
        dynamic: bool = True,
        enabled: bool | None = None,
        raise_at_min_scale: bool = False,
        collapse_patience: int | None = 10,
        on_collapse: str = "warn",
        dtype: torch.dtype | str | None = None,
        process_group: dist.ProcessGroup | None = None,
        sync_found_inf: bool = True,
    ) -> None:
        if enabled is not None:
            check_bool(_CALL, "enabled", enabled)
        check_bool(_CALL, "sync_found_inf", sync_found_inf)
        dtype = None if dtype is None else parse_dtype(dtype, _CALL)
        options = ScalerOptions.create(
            _CALL,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            hysteresis=hysteresis,
            min_scale=min_scale,
            max_scale=max_scale,
            dynamic=dynamic,
            raise_at_min_scale=raise_at_min_scale,
        )
        self._store = make_store(device, dtype, enabled, options)
        self._kernels = ScalerKernels(self._store.backend)
        self._collapse = CollapseWatch(_CALL, collapse_patience, on_collapse)
        self._process_group = process_group
        self._sync_found_inf = sync_found_inf
        #: per optimizer (by id), only once a call on it succeeded: a refused call leaves none
        self._records: dict[int, OptimizerRecord] = {}

    def __repr__(self) -> str:
        return self._store.describe()

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (and ``copy.deepcopy``): only between iterations; the store travels as
        Python values, the kernels are chosen again for the copy."""
        if self._records:
            raise AmpcoreError(
                f"{_CALL} may only be pickled or copied at the beginning of an iteration, "
                "or at the end after scaler.update()."
            )
        if self._process_group is not None:
            raise AmpcoreError(f"{_CALL}(process_group=...) cannot be pickled or copied: a process group cannot be")
        state = self.__dict__.copy()
        state["_kernels"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._kernels = ScalerKernels(self._store.backend)

    def _require_scale(self, call: str) -> torch.Tensor:
        store = self._store
        if store.tensors is None and store.scaling:
            raise AmpcoreError(f"{_CALL}.{call}(): attempted {call} but the scale is not set yet. {_SCALE_FIRST}")
        return store.ensure_tensors().scale

    def _end_iteration(self) -> None:
        """Open the next iteration's window of the device overflow flag: reset the flag once
        this iteration's found-inf flags have read it (a saturated forward of the next
        iteration's first micro-batch happens before its ``scale()``, so only the end of an
        iteration can start the window)."""
        store = self._store
        self._kernels.clear_device_overflow(store.home() if store.tensors is None else store.tensors.scale.device)

    # -- the training-loop API -----------------------------------------------------------
    def scale(self, outputs: T) -> T:
        """Multiply ``outputs`` (a tensor, or lists/tuples/dicts of them, nested) by the scale.

        Returns outputs of the same structure; other iterables give a lazy ``map`` (as torch).
        A no-op scaler returns ``outputs`` unchanged.  It leaves the device's overflow flag
        alone: an overflow in the forward pass of any micro-batch is seen by :meth:`step`.
        No host sync.

        Example::

            >>> import torch, ampcore
            >>> scaler = ampcore.GradScaler("cpu", enabled=True, init_scale=8.0)
            >>> scaler.scale({"a": torch.tensor(1.0), "b": [torch.tensor(2.0)]})
            {'a': tensor(8.), 'b': [tensor(16.)]}
        """
        if not self._store.active or not self._store.scaling:
            return outputs
        if isinstance(outputs, torch.Tensor):
            scale = self._store.ensure_tensors(outputs.device).scale
            return outputs * scale.to(device=outputs.device, non_blocking=True)  # type: ignore[return-value]
        copies: dict[torch.device, torch.Tensor] = {}

        def by_scale(tensor: torch.Tensor) -> torch.Tensor:
            copy = copies.get(tensor.device)
            if copy is None:
                scale = self._store.ensure_tensors(tensor.device).scale
                copy = copies[tensor.device] = scale.to(device=tensor.device, non_blocking=True)
            return tensor * copy

        return map_tensors(outputs, by_scale)  # type: ignore[no-any-return]

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place and record whether any is
        non-finite.  Optional: :meth:`step` does it when you did not; call it to clip or
        inspect unscaled gradients between backward and :meth:`step`.  No host sync (the
        found-inf flag is all-reduced over the process group when distributed).

        Example::

            >>> import torch, ampcore
            >>> p = torch.nn.Parameter(torch.ones(2))
            >>> opt = torch.optim.SGD([p], lr=1.0)
            >>> scaler = ampcore.GradScaler("cpu", enabled=True, init_scale=4.0)
            >>> scaler.scale(p.sum()).backward()
            >>> scaler.unscale_(opt)
            >>> torch.nn.utils.clip_grad_norm_([p], max_norm=1.0) is not None
            True
            >>> p.grad
            tensor([0.7071, 0.7071])

        Raises:
            AmpcoreError (a RuntimeError): unscale_ twice for an optimizer, or after
            :meth:`step`, before the iteration's update; float16 gradients.
        """
        check_optimizer("unscale_", optimizer)
        if not self._store.active:
            return
        record = self._records.get(id(optimizer)) or OptimizerRecord()
        record.check_can_unscale()
        scale = self._require_scale("unscale_")
        scaling = self._store.scaling
        inv_scale = self._kernels.inv_scale(scale) if scaling else torch.ones_like(scale)
        record.found_inf = self._unscale_grads_(optimizer, inv_scale, allow_fp16=not scaling)
        record.stage = Stage.UNSCALED
        self._records[id(optimizer)] = record

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless :meth:`unscale_` ran) and call ``optimizer.step(*args, **kwargs)``
        unless a gradient is non-finite; return what it returned (``None`` when skipped).

        One host sync (reading the found-inf flag); none for optimizers with
        ``_step_supports_amp_scaling`` (fused Adam/AdamW/SGD), which receive
        ``grad_scale`` and ``found_inf`` tensors and skip on the device.

        Closures: one rule for ``step(opt, closure=f)``, ``step(opt, f)`` and
        ``minimize(opt, f)``: refused while the scaler is enabled (the closure would make new,
        unscaled gradients after the check); with ``enabled=False`` passed to the optimizer.

        Raises:
            AmpcoreError (a RuntimeError): step twice before update, a closure (see above), an
            ``optimizer`` that is no optimizer (e.g. the model).  A refused call records
            nothing.
        """
        check_optimizer("step", optimizer)
        if not self._store.active:
            return optimizer.step(*args, **kwargs)
        check_no_closure("step", args, kwargs)
        record = self._records.get(id(optimizer)) or OptimizerRecord()
        record.check_can_step()
        scale = self._require_scale("step")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._fused_step(optimizer, record, scale, args, kwargs)
        pending = None
        if record.stage is Stage.READY:
            pending = deferred_unscale(optimizer, args, kwargs)
            if pending is None:
                self.unscale_(optimizer)
            else:
                self._check_deferred(optimizer, record, scale, pending)
            record = self._records[id(optimizer)]
        else:
            self._or_late_overflow_(record.found_inf)
        found_inf = record.found_inf
        record.skipped = found_inf is None or bool(found_inf.item())
        if record.skipped:
            result = None
        elif pending is None:
            result = optimizer.step(*args, **kwargs)
        else:
            with pending.during():
                result = optimizer.step()
        record.stage = Stage.STEPPED
        return result

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """End the iteration: back off or grow the scale from the recorded found-inf flags,
        or set it to ``new_scale``.  No host sync (except with ``raise_at_min_scale=True``).

        A float ``new_scale`` outside ``[min_scale, max_scale]`` raises; a tensor is copied
        and clamped into the bounds on the device (checking it would cost a host sync).  A
        tensor holding nan, zero, a negative value or ``+inf`` without ``max_scale`` is
        ignored: the scale stays as it was.

        Raises:
            AmpcoreError (a RuntimeError): no :meth:`step`/:meth:`unscale_` this iteration;
            an invalid ``new_scale``.
            LossScaleAtMinimumError: see ``raise_at_min_scale``.
        """
        store = self._store
        if not store.active:
            return
        if new_scale is not None:
            if not store.scaling:
                raise AmpcoreError(
                    f"{_CALL}.update(new_scale=...): this scaler does not scale (torch.{dtype_name(store.dtype)} "
                    "needs no loss scaling on this backend); construct it with enabled=True to set a scale"
                )
            set_scale_(self._require_scale("update"), new_scale, store.options)
        else:
            self._update_dynamic_scale()
        skipped = [r.skipped for r in self._records.values() if r.skipped is not None]
        self._records.clear()
        self._end_iteration()
        self._collapse.record(skipped, self._describe_scale, LossScaleAtMinimumError)

    def _update_dynamic_scale(self) -> None:
        """Back off or grow the scale from the iteration's found-inf flags (on the device)."""
        found = [r.found_inf for r in self._records.values() if r.found_inf is not None]
        if not found:
            raise AmpcoreError(
                "No inf checks were recorded prior to update(): call scaler.step(optimizer) "
                "(or unscale_) for each optimizer of this iteration before scaler.update()."
            )
        store = self._store
        options = store.options
        if not (store.scaling and options.dynamic):
            return
        tensors = store.ensure_tensors()
        found_inf = found[0]
        for other in found[1:]:
            found_inf = found_inf + other.to(tensors.scale.device, non_blocking=True)
        if options.raise_at_min_scale:
            raise_if_stuck(tensors, found_inf, options)
        self._kernels.update_scale_(tensors.scale, tensors.growth_tracker, tensors.overflow_tracker, found_inf, options)

    def _describe_scale(self) -> str:
        """', and the loss scale fell to 0.0625' (read, one host sync, only when reporting)."""
        options = self._store.options
        if not self._store.scaling or not options.dynamic:
            return ""
        return f", and the loss scale fell to {self.get_scale():g} (init_scale {options.init_scale:g})"
