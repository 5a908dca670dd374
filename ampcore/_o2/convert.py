"""Steps 4 and 5 of ``ampcore.decorate``: convert each model in place (fp32 masters aliasing
the original storage), install its hooks (checkpoints, input casting, float32 islands),
then give each optimizer its master weights."""

from __future__ import annotations

import torch
from torch import nn

from .._backends.registry import ResolvedDevice
from .checkpoint import DecoratedModel, ModuleCheckpointHooks, OptimizerCheckpointHooks
from .decorate_checks import DecorateRequest
from .fsdp import RefuseSharded
from .master import MasterPair, MasterWeights
from .mixed_norm import LowOutput
from .model_plan import CastInputs, Float32Island, ModelPlan

__all__ = ["convert_models", "install_masters"]


def convert_models(
    request: DecorateRequest, plans: list[ModelPlan], optimizers: list[torch.optim.Optimizer]
) -> list[DecoratedModel]:
    """Step 4: convert each model in place (masters for the optimized parameters) and
    install its hooks (checkpoints, input casting, float32 islands)."""
    optimized = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    records = [DecoratedModel(request.low, request.save_dtype, request.master_grad) for _ in plans]
    islands = _Islands(request.resolved, request.low)
    for plan, record in zip(plans, records, strict=True):
        _convert(plan, record, request.low, request.master_weight, optimized)
        _install_hooks(plan, record, request.low, islands)
    return records


def install_masters(
    request: DecorateRequest, records: list[DecoratedModel], optimizers: list[torch.optim.Optimizer]
) -> None:
    """Step 5: give each optimizer its master weights (and their checkpoint hooks)."""
    pairs = {pair.model: pair for record in records for pair in record.pairs.values()}
    backend = request.resolved.backend
    may_share = not backend.needs_loss_scaling(request.low)
    for opt in optimizers:
        own = [pairs[p] for g in opt.param_groups for p in g["params"] if p in pairs]
        if not own:  # master_weight=False, or only float32 parameters: nothing to do
            continue
        weights = MasterWeights(
            opt,
            own,
            request.master_grad,
            may_share=may_share,
            chunk=backend.master_update_chunk_elements,
            onepass=backend.master_update_onepass,
        )
        weights.install()
        OptimizerCheckpointHooks(weights).register(opt)
        for record in records:
            if any(pair.model in record.pairs for pair in own):
                record.master_weights.append(weights)


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
        (m, name, param)
        for m, names in plan.original.items()
        for name in names
        if (param := m._parameters.get(name)) is not None
    ]
    plan.model.register_forward_pre_hook(RefuseSharded(owners))
    if not plan.root_kept:
        plan.model.register_forward_pre_hook(CastInputs(low, record), with_kwargs=True)
    for module in plan.norm_modules:
        islands.norm.register(module)
    for module in plan.mixed_norms:  # no island: low-precision inputs as they come
        module.register_forward_hook(islands.low_output)
    for module in plan.excluded_roots:
        islands.excluded.register(module)


class _Islands:
    """The float32 islands of one decorate call."""

    def __init__(self, resolved: ResolvedDevice, low: torch.dtype) -> None:
        name, index = resolved.backend.name, resolved.index
        device = name if index is None else f"{name}:{index}"
        self.norm = Float32Island(device, output_dtype=low)
        self.excluded = Float32Island(device)
        self.low_output = LowOutput(low)
