"""``ampcore.decorate`` and FSDP2 (``torch.distributed.fsdp.fully_shard``) refuse each other.

FSDP2 replaces every parameter of a module it shards by a new sharded parameter (a DTensor),
and has its own mixed precision (``MixedPrecisionPolicy(param_dtype=...)``), for which its
sharded float32 parameters already are the master weights.  decorate's masters belong to
the parameters it converted: after ``fully_shard`` the optimizer would update masters that
nothing reads (the weights never change); decorating a sharded model would hand the
optimizer DTensors it cannot mix with plain masters.  So both orders raise, with the
combination that works: ``fully_shard(mp_policy=...)`` for the weights, ``ampcore.autocast``
for the ops.
"""

from __future__ import annotations

from typing import Any, Final

from torch import nn

from .._errors import AmpcoreError

__all__ = ["FSDP2_ADVICE", "RefuseSharded", "check_not_sharded", "is_sharded"]

FSDP2_ADVICE: Final = (
    "With FSDP2 do not decorate: let fully_shard keep the low-precision copies "
    "(fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
    "reduce_dtype=torch.float32)); its sharded float32 parameters are the master weights) and "
    "run the forward pass under ampcore.autocast(...) for the op lists (see docs/integrations.md)."
)


def _fsdp_module_type() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return None
    return FSDPModule


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module`` or a submodule was given to ``fully_shard``."""
    fsdp = _fsdp_module_type()
    return fsdp is not None and any(isinstance(m, fsdp) for m in module.modules())


def check_not_sharded(models: list[nn.Module], call: str) -> None:
    """Raise when a model (or a submodule) is already sharded by FSDP2."""
    for index, model in enumerate(models):
        if is_sharded(model):
            raise AmpcoreError(
                f"{call}(models[{index}]): the model (or a submodule) is already sharded by FSDP2's "
                f"fully_shard, whose parameters are DTensors that decorate cannot give master weights. " + FSDP2_ADVICE
            )


class RefuseSharded:
    """Forward pre-hook on a decorated model: raise if ``fully_shard`` came after decorate.

    The root is checked at every forward (one ``isinstance``); at the first forward also
    whether any converted parameter was replaced (``fully_shard`` on a submodule, or on a
    module that holds the model; replacing a parameter by hand has the same effect).

    Args:
        owners: (module, name, parameter) of every parameter decorate converted.
    """

    def __init__(self, owners: list[tuple[nn.Module, str, nn.Parameter]]) -> None:
        self.owners = owners
        self.scanned = False

    def __getstate__(self) -> dict[str, Any]:  # copies: the check starts again
        return {"owners": self.owners, "scanned": False}

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        fsdp = _fsdp_module_type()
        if fsdp is None:
            return
        if isinstance(module, fsdp) or (not self.scanned and self._replaced()):
            raise AmpcoreError(
                f"{type(module).__name__}: parameters of this model were replaced after "
                "ampcore.decorate(level='O2'), as FSDP2's fully_shard does when it shards the model "
                "(or a module holding it): the optimizer's master weights are no longer the model's, "
                "and training would not change the weights. " + FSDP2_ADVICE
            )
        self.scanned = True

    def _replaced(self) -> bool:
        return any(owner._parameters.get(name) is not param for owner, name, param in self.owners)
