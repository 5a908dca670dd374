"""Step 1 of ``ampcore.decorate``: check every argument, resolve the backend and dtype, and
(at O2) check that the models and optimizers can be decorated.  Nothing is changed here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import nn

from .._backends.registry import DeviceLike, ResolvedDevice, resolve_device
from .._backends.support import resolve_dtype
from .._dtypes import parse_dtype
from .._errors import AmpcoreError
from .._policy.levels import check_level
from .._validate import check_bool, check_flags
from .checkpoint import decorated_model_of
from .fsdp import check_not_sharded
from .master import master_of, master_weights_of
from .model_plan import excluded_spec

__all__ = ["CALL", "DecorateRequest", "check_o2", "validate"]

CALL: Final = "ampcore.decorate"
_CALL: Final = CALL
_SAVE_DTYPES: Final = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class DecorateRequest:
    """The checked arguments of one decorate call."""

    level: str
    models: list[nn.Module]
    optimizers: list[torch.optim.Optimizer]
    resolved: ResolvedDevice
    low: torch.dtype
    master_weight: bool
    keep_norm_fp32: bool | None
    excluded_types: tuple[type, ...]
    excluded_instances: list[nn.Module]
    save_dtype: torch.dtype | None
    master_grad: bool
    cast_buffers: bool
    #: only the default options: the backend's own O2 tool (e.g. IPEX) may take the models
    vendor_may_prepare: bool


def validate(
    models: Any,
    optimizers: Any,
    level: str,
    dtype: torch.dtype | str | None,
    device: DeviceLike,
    master_weight: bool | None,
    keep_norm_fp32: bool | None,
    excluded_layers: Any,
    save_dtype: torch.dtype | str | None,
    master_grad: bool,
    cast_buffers: bool,
) -> DecorateRequest:
    """Step 1: check every argument (at every level) and resolve the backend and dtype."""
    checked_level = check_level(level, call=_CALL)
    model_list = _as_list(models, nn.Module, "models")
    opt_list = [] if optimizers is None else _as_list(optimizers, torch.optim.Optimizer, "optimizers")
    if master_weight is None:  # Paddle's default: master weights at O2
        master_weight = True
    check_flags(_CALL, master_weight=master_weight, master_grad=master_grad, cast_buffers=cast_buffers)
    if keep_norm_fp32 is not None:
        check_bool(_CALL, "keep_norm_fp32", keep_norm_fp32, expected="None, True or False")
    low_given = None if dtype is None else parse_dtype(dtype, _CALL)
    save = None if save_dtype is None else parse_dtype(save_dtype, _CALL, "save_dtype")
    if save is not None and save not in _SAVE_DTYPES:
        raise AmpcoreError(
            f"{_CALL}(save_dtype={save!r}): expected None or one of {', '.join(str(d) for d in _SAVE_DTYPES)}"
        )
    excluded_types, excluded_instances = excluded_spec(excluded_layers, _CALL)
    resolved = _resolve(device, model_list)
    low = resolve_dtype(resolved.backend, low_given, resolved.index, _CALL)
    defaults = (master_weight, keep_norm_fp32, excluded_layers, save, master_grad, cast_buffers)
    return DecorateRequest(
        checked_level, model_list, opt_list, resolved, low, master_weight, keep_norm_fp32, excluded_types,
        excluded_instances, save, master_grad, cast_buffers,
        vendor_may_prepare=defaults == (True, None, None, None, False, False),
    )  # fmt: skip


def check_o2(request: DecorateRequest) -> None:
    """Step 1 (O2 only): the device can run the dtype, and models and optimizers can be
    decorated (not wrapped, sharded or decorated already; no foreign parameters)."""
    request.resolved.backend.enforce_capability(request.low, request.resolved.index or 0)
    _check_models(request.models, request.excluded_instances)
    check_not_sharded(request.models, _CALL)
    _check_optimizers(request.models, request.optimizers)
    if request.master_grad and not (request.master_weight and request.optimizers):
        raise AmpcoreError(
            f"{_CALL}(master_grad=True): float32 master gradients need master_weight=True and the "
            "optimizers the gradients are for"
        )
    if request.master_grad and not hasattr(torch.Tensor, "grad_dtype"):
        raise AmpcoreError(
            f"{_CALL}(master_grad=True) needs Tensor.grad_dtype, which torch {torch.__version__} "
            "lacks; upgrade torch or use master_grad=False"
        )


def _check_not_inference(index: int, model: nn.Module) -> None:
    """Inference tensors (made under ``torch.inference_mode()``) cannot be converted in place
    or trained: refuse them before anything changes."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if tensor.is_inference():
            raise AmpcoreError(
                f"{_CALL}(models[{index}]): {name!r} is an inference tensor (the model was built or "
                "loaded under torch.inference_mode()), which O2 cannot convert or train; build the "
                "model outside torch.inference_mode() (torch.no_grad() is fine). decorate itself may "
                "be called under torch.inference_mode(): it converts as outside it"
            )


def _as_list(value: Any, kind: type, name: str) -> list[Any]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise AmpcoreError(f"{_CALL}({name}=[]): expected at least one {kind.__name__}")
    for index, item in enumerate(items):
        if not isinstance(item, kind):
            where = f"{name}[{index}]" if isinstance(value, (list, tuple)) else name
            raise AmpcoreError(
                f"{_CALL}({where}={type(item).__name__}): expected a {kind.__module__}.{kind.__qualname__}"
                f"{' or a list of them' if where == name else ''}"
            )
    if len({id(item) for item in items}) != len(items):
        raise AmpcoreError(f"{_CALL}({name}=...): the same object is passed twice")
    return items


def _resolve(device: DeviceLike, models: list[nn.Module]) -> ResolvedDevice:
    """The backend for ``device``, or for the device the models' tensors are on."""
    devices = {t.device for m in models for t in (*m.parameters(), *m.buffers())}
    if len(devices) > 1:
        raise AmpcoreError(
            f"{_CALL}: the models' parameters and buffers are on several devices "
            f"({', '.join(sorted(str(d) for d in devices))}); move them to one device first"
        )
    resolved = resolve_device(device if device is not None or not devices else next(iter(devices)))
    if devices:
        on = next(iter(devices)).type
        if on != resolved.backend.device_type:
            raise AmpcoreError(
                f"{_CALL}(device={device!r}): backend {resolved.backend.name!r} drives "
                f"{resolved.backend.device_type!r} tensors, but the models are on {on!r}; move "
                "the models first or pass the backend of their device"
            )
    return resolved


def _check_models(models: list[nn.Module], excluded_instances: list[nn.Module]) -> None:
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    for index, model in enumerate(models):
        for module in model.modules():
            if isinstance(module, (DistributedDataParallel, DataParallel)):
                kind = type(module).__name__
                raise AmpcoreError(
                    f"{_CALL}(models[{index}]): the model is already wrapped in {kind}. Decorate "
                    f"first, then wrap: `model, opt = ampcore.decorate(model, opt, level='O2')`, "
                    f"then `model = {kind}(model)`. {kind} sets up gradient buckets for the "
                    "parameters' dtype when it is built; converting them afterwards breaks "
                    "gradient synchronisation."
                )
        if decorated_model_of(model) is not None or any(decorated_model_of(m) for m in model.modules()):
            raise AmpcoreError(
                f"{_CALL}(models[{index}]): the model (or a submodule) was already decorated at "
                "level O2; decorate each model once, with all of its optimizers"
            )
        _check_not_inference(index, model)
    inside = {id(m) for model in models for m in model.modules()}
    for layer in excluded_instances:
        if id(layer) not in inside:
            raise AmpcoreError(
                f"{_CALL}(excluded_layers=...): {type(layer).__name__} instance is not a submodule "
                "of the given models; pass layers of the models (e.g. model.head) or layer types"
            )


def _check_optimizers(models: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
    owned = {id(p) for m in models for p in m.parameters()}
    holder: dict[int, int] = {}
    for index, opt in enumerate(optimizers):
        name = f"optimizers[{index}] ({type(opt).__name__})"
        if master_weights_of(opt) is not None:
            raise AmpcoreError(f"{_CALL}({name}): the optimizer was already decorated; decorate it once")
        params = [p for g in opt.param_groups for p in g["params"]]
        foreign = [p for p in params if id(p) not in owned]
        if foreign:
            shapes = ", ".join(str(tuple(p.shape)) for p in foreign[:3])
            raise AmpcoreError(
                f"{_CALL}({name}): {len(foreign)} of its {len(params)} parameters (shapes {shapes}"
                f"{', ...' if len(foreign) > 3 else ''}) are not parameters of the given models; "
                "pass every model whose parameters the optimizer updates"
            )
        for p in params:
            earlier = master_of(p)
            if earlier is not None:
                raise AmpcoreError(
                    f"{_CALL}({name}): a parameter of shape {tuple(p.shape)} already has an fp32 master "
                    f"weight, in the {type(earlier.optimizer).__name__} of an earlier decorate call (the "
                    "models share it); a parameter can have one master, in one optimizer: decorate the "
                    "models sharing parameters in one decorate call, with every parameter in one optimizer"
                )
            other = holder.setdefault(id(p), index)
            if other != index:
                raise AmpcoreError(
                    f"{_CALL}({name}): a parameter of shape {tuple(p.shape)} is also in "
                    f"optimizers[{other}]; each parameter can have one master weight, in one optimizer"
                )
