"""Which module types level O2 keeps in float32: torch's norms, norm-like classes of other
libraries recognised by name, and the types users register.

Two groups, as in Paddle's ``decorate``:

* **always float32** (:data:`ALWAYS`): BatchNorm-like layers, whose running statistics
  accumulate over many steps, and rotary position embeddings, whose cos/sin tables are
  wrong in low precision;
* **norms** (:data:`NORM`): LayerNorm-, RMSNorm-, GroupNorm- and InstanceNorm-like layers,
  kept float32 where the dtype rule says so (float16 by default; ``keep_norm_fp32``).

A module type is in a group when it subclasses one of torch's classes of the group, when a
class in its MRO is named like one (``LlamaRMSNorm``, ``T5LayerNorm``, ``FrozenBatchNorm2d``,
``LlamaRotaryEmbedding``:
see :data:`NAME_PATTERNS`), or when :func:`register_fp32_module` put it there.  The
registry is process-global (module types are); registration is meant for import time.
"""

from __future__ import annotations

import re
import threading
from typing import Final, Literal

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .._errors import AmpcoreError
from .._validate import check_bool

__all__ = [
    "ALWAYS",
    "NAME_PATTERNS",
    "NORM",
    "fp32_group",
    "plain_batch_norm",
    "register_fp32_module",
    "unregister_fp32_module",
]

Group = Literal["always", "norm"]
ALWAYS: Final = "always"
NORM: Final = "norm"

#: torch's own classes of each group.
_TORCH_CLASSES: Final[dict[str, tuple[type[nn.Module], ...]]] = {
    ALWAYS: (nn.modules.batchnorm._BatchNorm,),
    NORM: tuple(
        t
        for t in (nn.LayerNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm, getattr(nn, "RMSNorm", None))
        if t is not None
    ),
}
#: Class names (anywhere in the MRO) that put a module type of another library in a group.
NAME_PATTERNS: Final[dict[str, re.Pattern[str]]] = {
    # rotary embeddings: their cos/sin tables must be computed in float32, and O2 would
    # run every op of them in low precision (wrong by up to 2.0 at position 2048)
    ALWAYS: re.compile(r"(BatchNorm(\d[dD])?|RotaryEmbedding|RotaryEmbedding\w*|RoPE|Rotary)$"),
    NORM: re.compile(r"(RMSNorm|RmsNorm|LayerNorm|LayerNormalization|GroupNorm|InstanceNorm)(\d[dD])?$"),
}

_lock = threading.Lock()
_registered: dict[type[nn.Module], str] = {}


def register_fp32_module(module_type: type[nn.Module], *, norm: bool = False) -> type[nn.Module]:
    """Make level O2 keep layers of ``module_type`` (and its subclasses) in float32.

    ``ampcore.decorate(level="O2")`` then leaves their parameters and buffers (and those of
    their submodules) in float32 and runs them as float32 islands: float32 inputs, autocast
    off inside, outputs cast back to the model's low-precision dtype.

    Args:
        module_type: an ``nn.Module`` subclass.
        norm: ``False`` (default): float32 for every dtype, as BatchNorm.  ``True``: a norm
            layer, kept float32 where norms are (float16 by default, or with
            ``decorate(keep_norm_fp32=True)``), as LayerNorm.

    Returns:
        ``module_type``, so that it works as a class decorator.

    Raises:
        AmpcoreError: ``module_type`` is not an ``nn.Module`` subclass, or is registered
            already in the other group.

    Example::

        >>> import torch, ampcore
        >>> @ampcore.register_fp32_module
        ... class Stats(torch.nn.Module):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.register_buffer("mean", torch.zeros(4))
        ...     def forward(self, x: torch.Tensor) -> torch.Tensor:
        ...         return x - self.mean
        >>> model = ampcore.decorate(torch.nn.Sequential(torch.nn.Linear(4, 4), Stats()), device="cpu")
        >>> model[0].weight.dtype, model[1].mean.dtype
        (torch.bfloat16, torch.float32)
        >>> ampcore.unregister_fp32_module(Stats)
    """
    if not isinstance(module_type, type) or not issubclass(module_type, nn.Module):
        raise AmpcoreError(
            f"ampcore.register_fp32_module({module_type!r}): expected an nn.Module subclass (a class, "
            "not an instance; for single layers use decorate(excluded_layers=[...]))"
        )
    check_bool("ampcore.register_fp32_module", "norm", norm)
    group = NORM if norm else ALWAYS
    with _lock:
        other = _registered.get(module_type)
        if other is not None and other != group:
            raise AmpcoreError(
                f"ampcore.register_fp32_module({module_type.__qualname__}, norm={norm}): it is registered "
                f"already with norm={other == NORM}; unregister_fp32_module() it first"
            )
        _registered[module_type] = group
    return module_type


def unregister_fp32_module(module_type: type[nn.Module]) -> None:
    """Undo :func:`register_fp32_module` (nothing happens for a type not registered).

    Name-based recognition (``*RMSNorm``, ``*LayerNorm``...) is not affected; turn norms off
    with ``decorate(keep_norm_fp32=False)`` or keep a layer in low precision by not
    decorating it as a norm (see docs/o2.md).

    Example::

        >>> import ampcore, torch
        >>> class Gate(torch.nn.Module): ...
        >>> ampcore.register_fp32_module(Gate)
        <class '...Gate'>
        >>> ampcore.unregister_fp32_module(Gate)  # decorate casts Gate to low precision again
    """
    with _lock:
        _registered.pop(module_type, None)


def fp32_group(module: nn.Module) -> str | None:
    """``"always"``, ``"norm"`` or ``None``: the float32 group of ``module``'s type."""
    cls = type(module)
    for klass in cls.__mro__:
        registered = _registered.get(klass)
        if registered is not None:
            return registered
    for group in (ALWAYS, NORM):
        if isinstance(module, _TORCH_CLASSES[group]):
            return group
    for group in (ALWAYS, NORM):
        pattern = NAME_PATTERNS[group]
        if any(pattern.search(klass.__name__) for klass in cls.__mro__ if klass is not nn.Module):
            return group
    return None


def plain_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` is a torch BatchNorm layer running torch's own forward
    (``F.batch_norm``): not ``SyncBatchNorm`` (other kernels), not a subclass with its own
    forward, not a BatchNorm-like class of another library (``FrozenBatchNorm2d``).

    Example::

        >>> plain_batch_norm(nn.BatchNorm2d(4)), plain_batch_norm(nn.SyncBatchNorm(4))
        (True, False)
    """
    return isinstance(module, _BatchNorm) and type(module).forward is _BatchNorm.forward
