"""torch's Adam function, called as ``Adam.step`` calls it, for ampcore's own master updates.

``master_adam.py`` (the update's walks) and ``adam_plans.py`` (what the whole-tensor walk
keeps between steps) both end in one call of ``torch.optim.adam.adam`` on lists of float32
masters, widened gradients, states and step counts.  This module holds what makes that
call torch's: the state created exactly as ``Adam._init_group`` creates it, the flavour
(single-tensor, foreach, fused) chosen as torch's ``adam()`` would choose it for the group,
GradScaler's tensors for fused groups, and the hyperparameters read from the group at
every call (an LR scheduler changes them between steps).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, Final

import torch

__all__ = [
    "ADAM_KEYS",
    "adam_function",
    "adam_state",
    "call_adam",
    "check_tensor_lr",
    "default_foreach",
    "flavour",
    "run_adam",
    "scaler_tensors",
    "state_tensors",
]

#: The param-group keys of the torch versions whose Adam ampcore reproduces.
ADAM_KEYS: Final = frozenset(
    (
        "lr",
        "betas",
        "eps",
        "weight_decay",
        "amsgrad",
        "maximize",
        "foreach",
        "capturable",
        "differentiable",
        "fused",
        "decoupled_weight_decay",
    )
)

_ADAM: list[Any] = []
_EXP_AVG: Final = operator.itemgetter("exp_avg")
_EXP_AVG_SQ: Final = operator.itemgetter("exp_avg_sq")
_MAX_EXP_AVG_SQ: Final = operator.itemgetter("max_exp_avg_sq")
_STEP: Final = operator.itemgetter("step")


def adam_function() -> Any:
    """``torch.optim.adam.adam``, or None on a torch without it (looked up once)."""
    if not _ADAM:
        found: Any = None
        try:
            from torch.optim.adam import adam as found
        except ImportError:  # another torch: do not guess
            pass
        _ADAM.append(found)
    return _ADAM[0]


def scaler_tensors(optimizer: torch.optim.Optimizer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``grad_scale`` and ``found_inf``, which GradScaler sets on a fused optimizer for the
    duration of its step (torch's protocol), or None."""
    return getattr(optimizer, "grad_scale", None), getattr(optimizer, "found_inf", None)


def adam_state(optimizer: torch.optim.Optimizer, group: Mapping[str, Any], param: torch.Tensor) -> dict[str, Any]:
    """``optimizer.state[param]``, created on first use exactly as ``Adam._init_group`` does."""
    state: dict[str, Any] = optimizer.state[param]
    if len(state) == 0:
        from torch.optim.optimizer import _get_scalar_dtype

        if group["fused"]:
            from torch.optim.optimizer import _device_dtype_check_for_fused

            _device_dtype_check_for_fused(param)
        state["step"] = (
            torch.zeros((), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=param.device)
            if group["capturable"] or group["fused"]
            else torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
        )
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    check_tensor_lr(group)
    return state


def check_tensor_lr(group: Mapping[str, Any]) -> None:
    """torch's refusal of a tensor ``lr`` for a foreach group that is not capturable."""
    if group["foreach"] and torch.is_tensor(group["lr"]) and not group["capturable"]:
        raise RuntimeError("lr as a Tensor is not supported for capturable=False and foreach=True")


def default_foreach(params: list[torch.Tensor]) -> bool:
    """Whether torch's ``adam()`` defaults ``params`` to its foreach flavour."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    return bool(_default_to_fused_or_foreach(params, False, use_fused=False)[1])


def flavour(
    group: Mapping[str, Any],
    params: list[torch.Tensor],
    scaler: tuple[torch.Tensor | None, torch.Tensor | None],
    foreach_default: bool | None = None,
) -> dict[str, Any]:
    """The flavour torch's ``adam()`` would pick for the group's parameters with gradients
    (decided once for the whole group, not per chunk; ``foreach_default``: what
    :func:`default_foreach` gives for ``params``, where the caller knows it already), and
    the GradScaler's ``grad_scale`` and ``found_inf`` (:func:`scaler_tensors`)."""
    foreach, fused = group["foreach"], group["fused"]
    if fused is None and foreach is None:
        foreach = default_foreach(params) if foreach_default is None else foreach_default
        if foreach and isinstance(group["lr"], torch.Tensor) and not group["capturable"]:
            foreach = False
    return {"foreach": bool(foreach), "fused": bool(fused), "grad_scale": scaler[0], "found_inf": scaler[1]}


def state_tensors(group: Mapping[str, Any], state: Mapping[str, Any]) -> list[torch.Tensor]:
    """A parameter's ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad)."""
    names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")
    return [state[name] for name in names]


def call_adam(
    adam: Any,
    options: dict[str, Any],
    group: Mapping[str, Any],
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    states: list[dict[str, Any]],
    has_complex: bool | None = None,
) -> None:
    """torch's Adam on whole tensors with their own step counts (advanced by torch)
    (``has_complex``: whether a parameter is complex, where the caller knows it)."""
    run_adam(
        adam,
        options,
        group,
        params,
        grads,
        list(map(_EXP_AVG, states)),
        list(map(_EXP_AVG_SQ, states)),
        list(map(_MAX_EXP_AVG_SQ, states)) if group["amsgrad"] else [],
        list(map(_STEP, states)),
        has_complex,
    )


def run_adam(
    adam: Any,
    options: dict[str, Any],
    group: Mapping[str, Any],
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    max_exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    has_complex: bool | None = None,
) -> None:
    """One call of torch's ``adam()`` with the group's hyperparameters as they are now
    (``has_complex``: whether a parameter is complex, where the caller knows it)."""
    beta1, beta2 = group["betas"]
    adam(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        steps,
        foreach=options["foreach"],
        capturable=group["capturable"],
        differentiable=False,
        fused=options["fused"],
        grad_scale=options["grad_scale"],
        found_inf=options["found_inf"],
        has_complex=any(torch.is_complex(p) for p in params) if has_complex is None else has_complex,
        decoupled_weight_decay=group["decoupled_weight_decay"],
        amsgrad=group["amsgrad"],
        beta1=beta1,
        beta2=beta2,
        lr=group["lr"],
        weight_decay=group["weight_decay"],
        eps=group["eps"],
        maximize=group["maximize"],
    )
