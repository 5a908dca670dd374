"""The global pre-hook of :mod:`._hooks` as the *last own* pre-hook of a root's layers that
have pre-hooks of their own, while the root's call applies the plan through the global hooks.

torch runs global pre-hooks before a module's own ones, so the global hook saw a layer's
arguments and weights before its own hooks put them in place (FSDP2's per-layer unshard,
which casts them to its ``MixedPrecisionPolicy.param_dtype``; an offload hook; a user's
hook that casts the input).  While a root's call is recorded or applied call by call, each
such layer gets the hook as its last own pre-hook (:func:`defer`; in a region applied call
by call for its whole life, which has no root to walk, a called module's children:
:func:`defer_children`) and the global one leaves it to that (``_hooks._pre`` finds this
thread's key among the layer's own pre-hooks).  The key is the thread's own: two threads
applying the plan to one model at once each defer its layers under its key, and the end of
one's call removes only its own (one key for all let the first to finish remove the
other's: its layers fell back to the global hook for the rest of that call).  A copy of a layer made meanwhile
(``copy.deepcopy``, pickling) holds a :class:`~._stale.Stale` key instead.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from .._policy.thread_state import thread_state
from ._stale import Stale

__all__ = ["defer", "defer_children", "undefer"]


class _Deferred:
    """A thread's key of the global pre-hook among a layer's own pre-hooks."""

    __slots__ = ("__weakref__",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Stale, ())


class _Local(threading.local):
    def __init__(self) -> None:
        self.key = _Deferred()

    def direct(self, module: torch.nn.Module, pre: Callable[..., Any], entered: list[Any], prog: Any) -> bool:
        """Whether ``module``, with pre-hooks of its own but not deferred, is called directly
        by the innermost region, one that applies the plan call by call for its whole life
        (no root, no parent call before it to defer it: its entry's site is None): then it
        is deferred from now on (:func:`defer_children`'s list, undone at the region's
        exit).  torch took this call's hooks before the global one ran, so this call is
        left to the O1 lists (as torch.autocast); before the twelfth stop it was planned on
        the weights and inputs its own hooks had not put in place yet."""
        top = thread_state().stack
        if not entered or not top or prog.rec is not None or prog.run is not None or prog.measuring:
            return False
        region, site, into = entered[-1]
        if region is not top[-1] or site is not None or region.spec.level != "auto":
            return False
        hooks: Any = module._forward_pre_hooks
        hooks.pop(self.key, None)
        hooks[self.key] = functools.partial(pre, late=self.key)
        into.append(module)
        return True


local = _Local()


def defer(root: torch.nn.Module, pre: Callable[..., Any]) -> list[torch.nn.Module]:
    """Give the modules inside ``root`` (not itself) with forward pre-hooks of their own
    ``pre`` (called with ``late=`` this thread's key) as their last one; returns them, for
    :func:`undefer`."""
    key = local.key
    late = functools.partial(pre, late=key)  # (a C call: no Python frame more)
    found = []
    for module in root.modules():
        hooks: Any = module._forward_pre_hooks
        if hooks and module is not root:
            hooks.pop(key, None)
            hooks[key] = late
            found.append(module)
    return found


def defer_children(module: torch.nn.Module, pre: Callable[..., Any], into: list[torch.nn.Module]) -> None:
    """:func:`defer` for the children of ``module`` (being called in a region that applies
    the plan call by call for its whole life: no root to walk), which they then are for the
    region's life: added to ``into``, for :func:`undefer` at its exit."""
    key = local.key
    for child in module._modules.values():
        if child is not None:
            hooks: Any = child._forward_pre_hooks
            if hooks and next(reversed(hooks)) is not key:
                hooks.pop(key, None)
                hooks[key] = functools.partial(pre, late=key)
                into.append(child)


def undefer(modules: list[torch.nn.Module]) -> None:
    """Undo this thread's :func:`defer`."""
    key = local.key
    for module in modules:
        hooks: Any = module._forward_pre_hooks
        hooks.pop(key, None)
