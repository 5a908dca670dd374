"""``ampcore.decorate``: prepare models and optimizers for level O2 (Paddle's ``decorate``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, overload

import torch
from torch import nn

from .checkpoint import DecoratedModel, ModuleCheckpointHooks, OptimizerCheckpointHooks, decorated_model_of
from .._dtypes import parse_dtype
from .._errors import AmpcoreError
from .._validate import check_bool, check_flags
from .fsdp import RefuseSharded, check_not_sharded
from .._policy.levels import check_level
from .master import MasterPair, MasterWeights, master_of, master_weights_of
from .model_plan import CastInputs, Float32Island, ModelPlan, default_keep_norm_fp32, excluded_spec, plan_model
from .._backends.registry import DeviceLike, ResolvedDevice, resolve_device

__all__ = ["decorate"]

_CALL: Final = "ampcore.decorate"
_SAVE_DTYPES: Final = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

ModelsT = TypeVar("ModelsT", bound="nn.Module | Sequence[nn.Module]")
OptimizersT = TypeVar("OptimizersT", bound="torch.optim.Optimizer | Sequence[torch.optim.Optimizer]")


@overload
def decorate(
    models: ModelsT,
    optimizers: None = None,
    level: str = "O2",
    dtype: torch.dtype | str | None = None,
    device: DeviceLike = None,
    master_weight: bool = True,
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
    master_weight: bool = True,
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
    master_weight: bool = True,
    keep_norm_fp32: bool | None = None,
    excluded_layers: Any = None,
    save_dtype: torch.dtype | str | None = None,
    master_grad: bool = False,
    cast_buffers: bool = False,
) -> Any:
    """Prepare models (and their optimizers) for mixed precision at ``level``.

    Levels O0, OD and O1 change nothing (the op side is :class:`ampcore.autocast`) and return
    the arguments as given.  At ``"O2"`` the parameters go to ``dtype`` except in norm
    layers (torch's, norm-like classes of other libraries such as ``LlamaRMSNorm``, and
    types given to :func:`ampcore.register_fp32_module`) and ``excluded_layers`` (see
    docs/o2.md); floating buffers keep their dtype unless ``cast_buffers``; the models' floating
    inputs are cast to ``dtype`` at forward, and with ``master_weight=True`` each optimizer
    updates fp32 master copies from which the low-precision parameters are refreshed after
    every step.  The objects are changed in place and keep their types.

    Decorate *before* wrapping a model in DistributedDataParallel, and run the forward pass
    under ``ampcore.autocast(level="O2")``.

    Args:
        models: a module, or a list/tuple of modules.
        optimizers: ``None``, an optimizer, or a list/tuple of optimizers; every parameter
            they hold must belong to ``models``.
        level: ``"O0"``, ``"OD"``, ``"O1"`` or ``"O2"`` (Paddle's lower-case spelling works).
        dtype: the low-precision dtype (``torch.bfloat16`` or a name such as ``"bfloat16"``,
            ``"bf16"``, ``"float16"``); ``None`` takes the backend's default.
        device: the backend (``"cuda"``, ``"cpu"``, ...); ``None`` takes the backend of the
            device the models' parameters are on.
        master_weight: keep fp32 master weights for the optimizers (O2).
        keep_norm_fp32: keep LayerNorm-, GroupNorm-, InstanceNorm- and RMSNorm-like layers
            in float32; ``None`` asks the backend (default: for float16 only).
            BatchNorm-like layers always stay float32.
        excluded_layers: modules (instances or types) that stay float32 and run as float32
            islands (autocast off inside).
        save_dtype: dtype of every floating entry of ``model.state_dict()``; ``None`` saves
            the fp32 masters and other entries in their dtype before decorate.
        master_grad: backward produces float32 gradients, shared by model and optimizer
            (accumulation, unscaling, clipping and the update all in float32).  Not with
            DistributedDataParallel.
        cast_buffers: also cast floating buffers (outside kept and excluded layers) to
            ``dtype``.  ``False`` (default) leaves them as they are: rotary frequencies,
            running statistics and position tables are constants that low precision makes
            wrong.

    Returns:
        ``models`` when ``optimizers`` is None, else ``(models, optimizers)``, in the shapes
        they were given.

    Raises:
        AmpcoreError: invalid arguments, a model already decorated, already wrapped in
            DistributedDataParallel or already sharded by FSDP2's ``fully_shard`` (sharding
            a decorated model raises at its first forward: with FSDP2 use its
            ``MixedPrecisionPolicy`` and ``ampcore.autocast``), an optimizer holding foreign
            parameters, a dtype the backend cannot run.  Nothing is changed when it raises.

    Example::

        >>> import torch, ampcore
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> model, opt = ampcore.decorate(model, opt, level="O2", device="cpu")
        >>> model[0].weight.dtype, model[1].weight.dtype, opt.param_groups[0]["params"][0].dtype
        (torch.bfloat16, torch.bfloat16, torch.float32)
        >>> with ampcore.autocast(device="cpu", level="O2"):
        ...     loss = model(torch.randn(2, 4)).float().pow(2).mean()
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """
    request = _validate(
        models, optimizers, level, dtype, device, master_weight, keep_norm_fp32, excluded_layers, save_dtype,
        master_grad, cast_buffers,
    )  # fmt: skip
    if request.level != "O2":
        return models if optimizers is None else (models, optimizers)
    _check_o2(request)
    plans = _plan(request)
    out_models, out_opts = list(request.models), list(request.optimizers)
    model_list, opt_list = request.models, request.optimizers
    if request.vendor_may_prepare:
        plans, model_list, opt_list = _offer_to_vendor(request, plans, out_models, out_opts)
    # -- nothing has changed up to here; from here on, only conversion --------------------
    records = _convert_models(request, plans, opt_list)
    _install_masters(request, records, opt_list)
    for model, record in zip(model_list, records):
        record.attach(model)
    models = _reshaped(models, out_models)
    return models if optimizers is None else (models, _reshaped(optimizers, out_opts))


@dataclass(frozen=True)
class _Request:
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


def _validate(
    models: Any,
    optimizers: Any,
    level: str,
    dtype: torch.dtype | str | None,
    device: DeviceLike,
    master_weight: bool,
    keep_norm_fp32: bool | None,
    excluded_layers: Any,
    save_dtype: torch.dtype | str | None,
    master_grad: bool,
    cast_buffers: bool,
) -> _Request:
    """Step 1: check every argument (at every level) and resolve the backend and dtype."""
    checked_level = check_level(level, call=_CALL)
    model_list = _as_list(models, nn.Module, "models")
    opt_list = [] if optimizers is None else _as_list(optimizers, torch.optim.Optimizer, "optimizers")
    check_flags(_CALL, master_weight=master_weight, master_grad=master_grad, cast_buffers=cast_buffers)
    if keep_norm_fp32 is not None:
        check_bool(_CALL, "keep_norm_fp32", keep_norm_fp32, expected="None, True or False")
    low_given = None if dtype is None else parse_dtype(dtype, _CALL)
    save = None if save_dtype is None else parse_dtype(save_dtype, _CALL, "save_dtype")
    if save is not None and save not in _SAVE_DTYPES:
        raise AmpcoreError(
            f"{_CALL}(save_dtype={save!r}): expected None or one of "
            f"{', '.join(str(d) for d in _SAVE_DTYPES)}"
        )
    excluded_types, excluded_instances = excluded_spec(excluded_layers, _CALL)
    resolved = _resolve(device, model_list)
    low = resolved.backend.check_dtype(low_given, call=_CALL)
    defaults = (master_weight, keep_norm_fp32, excluded_layers, save, master_grad, cast_buffers)
    return _Request(
        checked_level, model_list, opt_list, resolved, low, master_weight, keep_norm_fp32, excluded_types,
        excluded_instances, save, master_grad, cast_buffers,
        vendor_may_prepare=defaults == (True, None, None, None, False, False),
    )  # fmt: skip


def _check_o2(request: _Request) -> None:
    """Step 1 (O2 only): the device can run the dtype, and models and optimizers can be
    decorated (not wrapped, sharded or decorated already; no foreign parameters)."""
    request.resolved.backend.enforce_capability(request.low, request.resolved.index or 0, stacklevel=3)
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


def _plan(request: _Request) -> list[ModelPlan]:
    """Step 2: what to convert in each model (parameters, buffers, kept and excluded layers)."""
    keep_norm = request.keep_norm_fp32
    if keep_norm is None:
        keep_norm = default_keep_norm_fp32(request.resolved.backend, request.low)
    ids = {id(m) for m in request.excluded_instances}
    return [plan_model(m, keep_norm, request.excluded_types, ids, request.cast_buffers) for m in request.models]


def _offer_to_vendor(
    request: _Request, plans: list[ModelPlan], out_models: list[nn.Module], out_opts: list[torch.optim.Optimizer]
) -> tuple[list[ModelPlan], list[nn.Module], list[torch.optim.Optimizer]]:
    """Step 3: the backend's own O2 tool takes what it can (replaced in ``out_models`` and
    ``out_opts``); returns the plans, models and optimizers left to the core."""
    done_models, done_opts = _vendor_prepare(request.resolved, request.low, out_models, out_opts)
    return (
        [plan for index, plan in enumerate(plans) if index not in done_models],
        [m for index, m in enumerate(request.models) if index not in done_models],
        [opt for index, opt in enumerate(request.optimizers) if index not in done_opts],
    )


def _convert_models(
    request: _Request, plans: list[ModelPlan], optimizers: list[torch.optim.Optimizer]
) -> list[DecoratedModel]:
    """Step 4: convert each model in place (masters for the optimized parameters) and
    install its hooks (checkpoints, input casting, float32 islands)."""
    optimized = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    records = [DecoratedModel(request.low, request.save_dtype, request.master_grad) for _ in plans]
    islands = _Islands(request.resolved, request.low)
    for plan, record in zip(plans, records):
        _convert(plan, record, request.low, request.master_weight, optimized)
        _install_hooks(plan, record, request.low, islands)
    return records


def _install_masters(
    request: _Request, records: list[DecoratedModel], optimizers: list[torch.optim.Optimizer]
) -> None:
    """Step 5: give each optimizer its master weights (and their checkpoint hooks)."""
    pairs = {pair.model: pair for record in records for pair in record.pairs.values()}
    may_share = not request.resolved.backend.needs_loss_scaling(request.low)
    for opt in optimizers:
        own = [pairs[p] for g in opt.param_groups for p in g["params"] if p in pairs]
        if not own:  # master_weight=False, or only float32 parameters: nothing to do
            continue
        weights = MasterWeights(opt, own, request.master_grad, may_share=may_share)
        weights.install()
        OptimizerCheckpointHooks(weights).register(opt)
        for record in records:
            if any(pair.model in record.pairs for pair in own):
                record.master_weights.append(weights)


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


def _convert(
    plan: ModelPlan, record: DecoratedModel, low: torch.dtype, master_weight: bool, optimized: set[int]
) -> None:
    """Make masters (aliasing the original fp32 storage) and convert, in place."""
    with torch.no_grad():
        for param in plan.params:
            original = param.data
            if master_weight and id(param) in optimized:
                wide = torch.promote_types(original.dtype, torch.float32)
                master = nn.Parameter(original if original.dtype == wide else original.to(wide), param.requires_grad)
                record.pairs[param] = MasterPair(param, master)
            grad = param.grad
            param.grad = None
            param.data = original.to(low)
            if grad is not None:
                param.grad = grad.to(low)
        converted: dict[int, torch.Tensor] = {}
        for module, name in plan.buffers:
            buf = module._buffers[name]
            if buf is not None:
                new = converted.get(id(buf))
                if new is None:
                    new = converted[id(buf)] = buf.to(low)
                module._buffers[name] = new
    for pair in record.pairs.values():
        pair.version = pair.model._version


def _install_hooks(plan: ModelPlan, record: DecoratedModel, low: torch.dtype, islands: _Islands) -> None:
    for module in plan.model.modules():
        if module._parameters or module._buffers:
            ModuleCheckpointHooks(record, plan.original.get(module, {})).register(module)
    owners = [
        (m, name, param) for m, names in plan.original.items() for name in names if (param := m._parameters.get(name)) is not None
    ]
    plan.model.register_forward_pre_hook(RefuseSharded(owners))
    if not plan.root_kept:
        plan.model.register_forward_pre_hook(CastInputs(low, record), with_kwargs=True)
    for module in plan.norm_modules:
        islands.norm.register(module)
    for module in plan.excluded_roots:
        islands.excluded.register(module)


class _Islands:
    """The float32 islands of one decorate call."""

    def __init__(self, resolved: ResolvedDevice, low: torch.dtype) -> None:
        name, index = resolved.backend.name, resolved.index
        device = name if index is None else f"{name}:{index}"
        self.norm = Float32Island(device, output_dtype=low)
        self.excluded = Float32Island(device)
