"""Which parts of a model level O2 keeps in float32, and the forward hooks that feed them.

Parameters go to the low-precision dtype (floating buffers too with ``cast_buffers=True``;
by default they keep their dtype: rotary frequencies, running statistics and position
tables are constants that low precision would make wrong) except in:

* BatchNorm-like layers, always: their running statistics accumulate over many steps;
* LayerNorm-, GroupNorm-, InstanceNorm- and RMSNorm-like layers when the backend says so
  for the dtype (core default: for float16 only, as Paddle does); ``keep_norm_fp32``
  overrides;
* ``excluded_layers`` (instances or types) and everything inside them.

Which layers are "-like" (torch's classes, names such as ``LlamaRMSNorm``, registered
types) is ``_fp32_modules.py``'s business; a kept layer keeps its whole subtree.

A kept norm layer and an excluded layer run as float32 islands: float32 inputs, autocast off
inside (forward hooks).  A kept norm layer's outputs go back to the low-precision dtype, so
the model runs even without autocast; an excluded layer's outputs stay float32.  The model's own floating inputs
are cast to the low-precision dtype.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._errors import AmpcoreError
from .._nest import map_tensors
from .fp32_modules import ALWAYS, fp32_group, plain_batch_norm

if TYPE_CHECKING:
    from .._backends.backend import Backend
    from .checkpoint import DecoratedModel

__all__ = [
    "ModelPlan",
    "cast_floating",
    "default_keep_norm_fp32",
    "plan_model",
]


def default_keep_norm_fp32(backend: Backend, dtype: torch.dtype) -> bool:
    """Whether LayerNorm/GroupNorm/InstanceNorm/RMSNorm stay float32 for ``dtype`` on
    ``backend``: float16 only, as Paddle does (the user's ``keep_norm_fp32`` overrides it)."""
    return dtype == torch.float16


@dataclass(eq=False)
class ModelPlan:
    """What decorate converts in one model, decided before anything is touched."""

    model: nn.Module
    #: parameters to convert (each once, even when shared between modules)
    params: list[nn.Parameter] = field(default_factory=list)
    #: (module, buffer name) to convert
    buffers: list[tuple[nn.Module, str]] = field(default_factory=list)
    #: per module: its converted entries (local names) and their dtype before decorate
    original: dict[nn.Module, dict[str, torch.dtype]] = field(default_factory=dict)
    #: kept norm layers (float32 inputs)
    norm_modules: list[nn.Module] = field(default_factory=list)
    #: kept BatchNorm layers run on low-precision inputs (the device mixes dtypes)
    mixed_norms: list[nn.Module] = field(default_factory=list)
    #: roots of excluded subtrees (float32 inputs, autocast off)
    excluded_roots: list[nn.Module] = field(default_factory=list)
    #: whether the model itself stays float32 (then its inputs are not cast)
    root_kept: bool = False


def plan_model(
    model: nn.Module,
    keep_norm: bool,
    excluded_types: tuple[type[nn.Module], ...],
    excluded_instances: set[int],
    cast_buffers: bool = False,
    mixed_batch_norm: bool = False,
) -> ModelPlan:
    """Decide what level O2 converts in ``model`` (reads the model, changes nothing).
    ``mixed_batch_norm``: the device's batch-norm kernel takes low-precision inputs with
    float32 weights (:func:`ampcore._o2.mixed_norm.mixed_batch_norm`), so torch's BatchNorm layers need no island."""
    plan = ModelPlan(model)
    kept: set[int] = set()  # ids of modules whose own tensors stay float32
    for module in model.modules():
        if id(module) in kept:
            continue
        if id(module) in excluded_instances or (excluded_types and isinstance(module, excluded_types)):
            plan.excluded_roots.append(module)
        else:
            group = fp32_group(module)
            if group is None or (group != ALWAYS and not keep_norm):
                continue
            mixed = mixed_batch_norm and plain_batch_norm(module)
            (plan.mixed_norms if mixed else plan.norm_modules).append(module)
        kept.update(id(sub) for sub in module.modules())
    plan.root_kept = id(model) in kept
    keep_params = {id(p) for m in model.modules() if id(m) in kept for p in m._parameters.values() if p is not None}
    seen: set[int] = set()
    for module in model.modules():
        if id(module) in kept:
            continue
        for name, param in module._parameters.items():
            if param is None or not param.is_floating_point() or id(param) in keep_params:
                continue
            plan.original.setdefault(module, {})[name] = param.dtype
            if id(param) not in seen:
                seen.add(id(param))
                plan.params.append(param)
        if not cast_buffers:
            continue
        for name, buf in module._buffers.items():
            if buf is not None and buf.is_floating_point():
                plan.original.setdefault(module, {})[name] = buf.dtype
                plan.buffers.append((module, name))
    return plan


def cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every floating tensor in it (through tuples, lists, dicts) in ``dtype``."""

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor

    return map_tensors(value, cast, keep_types=False)


class CastInputs:
    """Forward pre-hook (``with_kwargs=True``) casting floating inputs to ``dtype``."""

    def __init__(self, dtype: torch.dtype, record: DecoratedModel | None = None) -> None:
        self.dtype = dtype
        self.record = record

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        if self.record is not None and self.record.master_grad:
            _refuse_ddp_with_master_grad(module)
        return cast_floating(args, self.dtype), cast_floating(kwargs, self.dtype)


class Float32Island:
    """Forward pre/post hooks that run a layer in float32 with autocast off.

    Excluded layers keep their float32 outputs; kept norm layers (``output_dtype`` given)
    hand the low-precision model low-precision activations, as Paddle's mixed norm kernels
    do.  Autocast is off inside so that nothing, not even level O2's "everything low
    precision", casts the layer's float32 weights or running statistics (an O2 cast of
    BatchNorm's running mean would update a temporary copy).
    """

    def __init__(self, device: str, output_dtype: torch.dtype | None = None) -> None:
        self.device = device
        self.output_dtype = output_dtype
        self._setup()

    def _setup(self) -> None:
        from .._policy.autocast import autocast

        self.region: autocast = autocast(device=self.device, enabled=False)
        self._depth = threading.local()

    def __getstate__(self) -> dict[str, Any]:  # torch.save(model), copy.deepcopy(model)
        return {"device": self.device, "output_dtype": self.output_dtype}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.device, self.output_dtype = state["device"], state["output_dtype"]
        self._setup()

    def register(self, module: nn.Module) -> None:
        module.register_forward_pre_hook(self.enter, with_kwargs=True)
        module.register_forward_hook(self.exit, always_call=True)

    def enter(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        self.region.__enter__()
        self._depth.value = getattr(self._depth, "value", 0) + 1
        return cast_floating(args, torch.float32), cast_floating(kwargs, torch.float32)

    def exit(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if getattr(self._depth, "value", 0) > 0:
            self._depth.value -= 1
            self.region.__exit__(None, None, None)
        return output if self.output_dtype is None else cast_floating(output, self.output_dtype)


def _refuse_ddp_with_master_grad(module: nn.Module) -> None:
    from torch.nn.parallel import DistributedDataParallel

    getter = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    active = getter() if getter is not None else None
    if active is not None and getattr(active, "module", None) is module:
        raise AmpcoreError(
            "DistributedDataParallel over a model decorated with master_grad=True: DDP's reducer "
            "requires gradients in the parameters' (low-precision) dtype, and master_grad=True "
            "makes backward produce float32 gradients. Decorate with master_grad=False (DDP then "
            "reduces low-precision gradients, and ampcore converts them to float32 before "
            "unscaling, clipping and the update)."
        )


def excluded_spec(excluded_layers: object, call: str) -> tuple[tuple[type[nn.Module], ...], list[nn.Module]]:
    """Split ``excluded_layers`` (an instance, a type, or a list/tuple of them) into types
    and instances; raise on anything else."""
    if excluded_layers is None:
        return (), []
    items: Iterable[object] = excluded_layers if isinstance(excluded_layers, (list, tuple)) else (excluded_layers,)
    types: list[type[nn.Module]] = []
    instances: list[nn.Module] = []
    for item in items:
        if isinstance(item, type) and issubclass(item, nn.Module):
            types.append(item)
        elif isinstance(item, nn.Module):
            instances.append(item)
        else:
            raise AmpcoreError(
                f"{call}(excluded_layers=...): {item!r} is neither an nn.Module instance nor an "
                "nn.Module subclass; pass layers (e.g. model.head) or layer types (e.g. nn.Embedding)"
            )
    return tuple(types), instances
