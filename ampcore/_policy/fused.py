"""Composite ops whose fused kernels swallow the ops a custom list names.

A custom list reaches the ops inside a composite (``linear``'s ``addmm``, the ``bmm`` of
attention's math path) by decomposing it under the policy.  Some composites do not
decompose into those ops on every device: ``scaled_dot_product_attention`` picks a fused
kernel (flash attention on CPU, flash or memory-efficient on CUDA) in which ``softmax`` or
``bmm`` never run as ops, so a custom list naming them has no effect inside attention.
ampcore warns (once per region policy and op) when that happens, naming the way to make the
list apply: the math backend (``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``), or
listing the composite itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Final

import torch

from .._errors import AmpcoreWarning, warn_user

__all__ = ["FUSED_CHOICE", "FusedKernelWarning", "SWALLOWING", "check_swallowed", "named_swallowed", "warn_swallowed"]


class FusedKernelWarning(AmpcoreWarning):
    """A custom list names an op that a fused kernel runs inside itself, out of the list's reach."""


def _sdpa_fused(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    math = int(torch.nn.attention.SDPBackend.MATH.value)
    return int(torch.ops.aten._fused_sdp_choice(*args, **kwargs)) != math


#: composite overload -> (does this call take a fused kernel?, ops of its unfused path, hint)
SWALLOWING: Final[dict[str, tuple[Callable[[tuple[Any, ...], dict[str, Any]], bool], frozenset[str], str]]] = {
    "scaled_dot_product_attention": (
        _sdpa_fused,
        frozenset("matmul bmm mm baddbmm mul div add softmax _softmax _safe_softmax dropout masked_fill where".split()),
        "wrap the call in `torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH)` to run "
        "attention as separate ops the list reaches, or list 'scaled_dot_product_attention' itself",
    ),
}

_warned: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


#: composite overload -> (the op that says which kernel a call takes, the value for the
#: unfused path): what the compiled policy kernel calls itself for :data:`SWALLOWING`.
FUSED_CHOICE: Final = {
    "scaled_dot_product_attention": ("_fused_sdp_choice", int(torch.nn.attention.SDPBackend.MATH.value))
}


def named_swallowed(overload: str, policy: Any) -> frozenset[str]:
    """The ops ``policy``'s custom lists name that a fused kernel of ``overload`` swallows."""
    lists = policy.lists
    named: frozenset[str] = (lists.custom_white | lists.custom_black) & SWALLOWING[overload][1]
    return named


def check_swallowed(overload: str, policy: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Warn when ``policy``'s custom lists name ops that this call's fused kernel swallows."""
    if not named_swallowed(overload, policy) or overload in _warned.get(policy, ()):
        return
    if SWALLOWING[overload][0](args, kwargs):
        warn_swallowed(overload, policy)


def warn_swallowed(overload: str, policy: Any) -> None:
    """The warning of a call of ``overload`` that takes a fused kernel (once per policy)."""
    named, hint = named_swallowed(overload, policy), SWALLOWING[overload][2]
    seen = _warned.setdefault(policy, set())
    if not named or overload in seen:
        return
    seen.add(overload)
    warn_user(
        f"ampcore.autocast: the custom list names {sorted(named)}, but this call of "
        f"{overload} runs a fused kernel in which they are not separate ops, so the list does "
        f"not apply inside it; {hint}",
        FusedKernelWarning,
    )
