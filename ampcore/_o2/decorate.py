"""``ampcore.decorate``: prepare models and optimizers for level O2 (Paddle's ``decorate``).

One call runs five steps, each a small function:

1. validate (``decorate_checks.py``): every argument, the backend and dtype; at O2 the
   models and optimizers (nothing is changed up to step 3);
2. plan (``model_plan.py``): what each model converts and what stays float32;
3. vendor offer: the backend adapter's ``ampcore_prepare_o2`` hook may take a model (and
   its optimizer) with the default options;
4. convert (``convert.py``): parameters and buffers in place, with the model's hooks;
5. install (``convert.py``): the optimizers' fp32 master weights (``master.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, overload

import torch
from torch import nn

from .._backends.registry import DeviceLike, ResolvedDevice
from .convert import convert_models, install_masters
from .decorate_checks import DecorateRequest, check_o2, validate
from .mixed_norm import mixed_batch_norm
from .model_plan import ModelPlan, default_keep_norm_fp32, plan_model
from .no_optimizer import NO_OPTIMIZER, mark_without_masters, warn_no_optimizer, watch_optimizer_steps

__all__ = ["decorate"]

ModelsT = TypeVar("ModelsT", bound="nn.Module | Sequence[nn.Module]")
OptimizersT = TypeVar("OptimizersT", bound="torch.optim.Optimizer | Sequence[torch.optim.Optimizer]")


@overload
def decorate(
    models: ModelsT,
    optimizers: None = None,
    level: str = "O2",
    dtype: torch.dtype | str | None = None,
    device: DeviceLike = None,
    master_weight: bool | None = True,
    keep_norm_fp32: bool | None = None,
    excluded_layers: Any = None,
    save_dtype: torch.dtype | str | None = None,
    master_grad: bool = False,
    cast_buffers: bool = False,
) -> ModelsT: ...


@overload
def decorate(
    models: ModelsT,
    optimizers: OptimizersT,
    level: str = "O2",
    dtype: torch.dtype | str | None = None,
    device: DeviceLike = None,
    master_weight: bool | None = True,
    keep_norm_fp32: bool | None = None,
    excluded_layers: Any = None,
    save_dtype: torch.dtype | str | None = None,
    master_grad: bool = False,
    cast_buffers: bool = False,
) -> tuple[ModelsT, OptimizersT]: ...


def decorate(
    models: Any,
    optimizers: Any = None,
    level: str = "O2",
    dtype: torch.dtype | str | None = None,
    device: DeviceLike = None,
    master_weight: bool | None = True,
    keep_norm_fp32: bool | None = None,
    excluded_layers: Any = None,
    save_dtype: torch.dtype | str | None = None,
    master_grad: bool = False,
    cast_buffers: bool = False,
) -> Any:
    """Prepare models (and their optimizers) for mixed precision at ``level`` (docs/o2.md).

    O0, OD and O1 return the arguments unchanged.  O2 casts parameters to ``dtype`` except
    norm layers, :func:`ampcore.register_fp32_module` types and ``excluded_layers``, casts
    floating inputs at forward, and (``master_weight``) steps fp32 master copies.  In place;
    decorate before DistributedDataParallel; run forward under ``ampcore.autocast(level="O2")``.

    Args:
        models: a module, or a list/tuple of modules.
        optimizers: ``None``, an optimizer or a list/tuple of them, holding only ``models``' parameters.
        level: ``"O0"``, ``"OD"``, ``"O1"`` or ``"O2"`` (Paddle's lower-case spelling works).
            The default is ``"O2"`` (Paddle's ``decorate`` defaults to ``"O1"``, where it
            changes nothing; see docs/o2.md).
        dtype: the low-precision dtype or its name (``"bf16"``...); ``None``: the backend's default.
        device: the backend; ``None``: the backend of the device the parameters are on.
        master_weight: keep fp32 master weights for the optimizers (``None``, Paddle's
            default, means ``True``).  At O2 without ``optimizers`` there is nothing to keep
            them for: decorate warns (pass the optimizer, or ``master_weight=False``).
        keep_norm_fp32: keep LayerNorm/GroupNorm/InstanceNorm/RMSNorm-like layers float32
            (``None``: for float16 only); BatchNorm-like layers always stay float32.
        excluded_layers: modules or module types kept float32, run as float32 islands.
        save_dtype: dtype of floating ``state_dict()`` entries; ``None``: the fp32 masters and
            the other entries in their dtype before decorate.
        master_grad: float32 gradients shared by model and optimizer (not with DDP).
        cast_buffers: also cast floating buffers (default: left as they are: rotary tables and
            running statistics are constants that low precision makes wrong).

    Returns:
        ``models`` when ``optimizers`` is None, else ``(models, optimizers)``, shaped as given.

    Raises:
        AmpcoreError: invalid arguments; a model already decorated, wrapped in DDP or sharded
            by FSDP2; foreign parameters; a dtype the backend cannot run.  Nothing changes then.

    Example::

        >>> import torch, ampcore
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> model, opt = ampcore.decorate(model, opt, level="O2", device="cpu")
        >>> model[0].weight.dtype, opt.param_groups[0]["params"][0].dtype
        (torch.bfloat16, torch.float32)
    """
    request = validate(
        models, optimizers, level, dtype, device, master_weight, keep_norm_fp32, excluded_layers, save_dtype,
        master_grad, cast_buffers,
    )  # fmt: skip
    if request.level != "O2":
        return models if optimizers is None else (models, optimizers)
    # under torch.inference_mode() the converted parameters and the masters would be
    # inference tensors, which no training step can use: convert as outside it
    with torch.inference_mode(False):
        return _decorate_o2(request, models, optimizers)


def _decorate_o2(request: DecorateRequest, models: Any, optimizers: Any) -> Any:
    """Level O2: plan -> vendor offer -> convert -> install, on a validated request."""
    check_o2(request)
    plans = _plan(request)
    if request.master_weight and not request.optimizers:
        warn_no_optimizer(request, plans)
        watch_optimizer_steps()
    out_models, out_opts = list(request.models), list(request.optimizers)
    model_list, opt_list = request.models, request.optimizers
    if request.vendor_may_prepare:
        plans, model_list, opt_list = _offer_to_vendor(request, plans, out_models, out_opts)
    # -- nothing has changed up to here; from here on, only conversion --------------------
    records = convert_models(request, plans, opt_list)
    install_masters(request, records, opt_list)
    for model, record in zip(model_list, records, strict=True):
        record.attach(model)
    mark_without_masters(model_list, request.low, _no_master_reason(request))
    models = _reshaped(models, out_models)
    return models if optimizers is None else (models, _reshaped(optimizers, out_opts))


def _no_master_reason(request: DecorateRequest) -> str:
    """Why a converted parameter of this call has no master weight (for later errors)."""
    if not request.master_weight:
        return "decorate was called with master_weight=False"
    if not request.optimizers:
        return NO_OPTIMIZER
    return "none of the optimizers given to decorate updates it"


def _plan(request: DecorateRequest) -> list[ModelPlan]:
    """Step 2: what to convert in each model (parameters, buffers, kept and excluded layers)."""
    keep_norm = request.keep_norm_fp32
    if keep_norm is None:
        keep_norm = default_keep_norm_fp32(request.resolved.backend, request.low)
    ids = {id(m) for m in request.excluded_instances}
    index = request.resolved.index
    device_type = request.resolved.backend.device_type
    mixed = mixed_batch_norm(device_type if index is None else f"{device_type}:{index}", request.low)
    return [plan_model(m, keep_norm, request.excluded_types, ids, request.cast_buffers, mixed) for m in request.models]


def _offer_to_vendor(
    request: DecorateRequest, plans: list[ModelPlan], out_models: list[nn.Module], out_opts: list[torch.optim.Optimizer]
) -> tuple[list[ModelPlan], list[nn.Module], list[torch.optim.Optimizer]]:
    """Step 3: the backend's own O2 tool takes what it can (replaced in ``out_models`` and
    ``out_opts``); returns the plans, models and optimizers left to the core."""
    done_models, done_opts = _vendor_prepare(request.resolved, request.low, out_models, out_opts)
    return (
        [plan for index, plan in enumerate(plans) if index not in done_models],
        [m for index, m in enumerate(request.models) if index not in done_models],
        [opt for index, opt in enumerate(request.optimizers) if index not in done_opts],
    )


def _vendor_prepare(
    resolved: ResolvedDevice, low: torch.dtype, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
) -> tuple[set[int], set[int]]:
    """Offer each model, with the one optimizer that updates only it (if any), to the
    adapter's ``ampcore_prepare_o2`` hook; replace in place what it prepared.  Returns the
    indices of the models and optimizers it took over."""
    prepare = resolved.backend.hook("ampcore_prepare_o2")
    done_models: set[int] = set()
    done_opts: set[int] = set()
    if prepare is None:
        return done_models, done_opts
    params = [{id(p) for g in opt.param_groups for p in g["params"]} for opt in optimizers]
    for index, model in enumerate(models):
        mine = {id(p) for p in model.parameters()}
        touching = [j for j, ids in enumerate(params) if ids & mine]
        if len(touching) > 1 or any(not params[j] <= mine for j in touching):
            continue  # an optimizer spanning models, or several: the core handles it
        opt_index = touching[0] if touching else None
        result = prepare(model=model, optimizer=None if opt_index is None else optimizers[opt_index], dtype=low)
        if result is None:
            continue
        models[index], new_opt = result
        done_models.add(index)
        if opt_index is not None:
            optimizers[opt_index] = new_opt
            done_opts.add(opt_index)
    return done_models, done_opts


def _reshaped(given: Any, items: list[Any]) -> Any:
    """``items`` in the shape ``given`` had (one object, a list or a tuple)."""
    if isinstance(given, list):
        return items
    if isinstance(given, tuple):
        return tuple(items)
    return items[0]
