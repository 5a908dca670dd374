"""Low-precision work a root's own forward pre-hooks do, seen once per root.

A root with pre-hooks of its own (a user's, a LoRA merge's, FSDP2's or ZeRO-3's gathers)
runs them before its sentinel (:func:`._root_hooks.last_pre`), so its program, recorded
from there, does not see what they do.  The fixed choice counts a low-precision tensor such
a hook makes (a product of the O1 lists: it sees the region's O1 state) as the root running
low: the O1 lists for the ops after it, not float32.  So once per root, at its first call
in an eligible region (:func:`probe`, from the global sentinel, before its own hooks), a
``TorchFunctionMode`` notes whether an op makes a low-precision tensor outside planned
modules and outside a program's run (the hooks, and the rest of a call applied call by
call, as a recording notes them), until an always-called forward hook of ours ends it in
the same call (also where a hook raises).  A recording of that root then counts it as low
work outside planned modules (:func:`low_hooks`), and a program recorded before that ran
float32 throughout is recorded again.  Nothing of it is left after that call.  Gathers and
moves (FSDP2's, ZeRO-3's, an offload hook's) make no low-precision tensor unless the
parameters are low already.  Seen once: a hook whose low work stops later (a merge done
once) keeps the O1 lists after its root.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ._stale import Stale, drop_strays

__all__ = ["low_hooks", "probe"]

_LOW: Final = (torch.bfloat16, torch.float16)
#: root -> whether its own pre-hooks made a low-precision tensor when probed
_seen: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


class _ProbeKey:
    """Our key in a probed root's hook dicts (hashed by identity); a copy of the root holds
    a :class:`._stale.Stale` instead (its strays dropped at their first call)."""

    __slots__ = ("__weakref__",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Stale, ())


_KEY: Final = _ProbeKey()


class _Local(threading.local):
    def __init__(self) -> None:
        #: the probe running in this thread: (the root, its mode, the region's device type)
        self.active: tuple[nn.Module, _Probe, str] | None = None


_local = _Local()


class _Probe(TorchFunctionMode):
    """Notes whether an op made a low-precision tensor (one level of a tuple or list) while
    ``counts()`` (outside planned modules and programs)."""

    def __init__(self, counts: Callable[[], bool]) -> None:
        super().__init__()
        self.low, self.counts = False, counts

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not self.low and self.counts():
            outs = out if isinstance(out, (tuple, list)) else (out,)
            self.low = any(isinstance(t, torch.Tensor) and t.dtype in _LOW for t in outs)
        return out


def low_hooks(root: nn.Module) -> bool:
    """Whether ``root``'s own pre-hooks made a low-precision tensor when probed."""
    try:
        return _seen.get(root, False)
    except TypeError:  # a module class that is not hashable
        return False


def probe(root: nn.Module, device_type: str, counts: Callable[[], bool]) -> None:
    """Probe this call of ``root`` (not probed yet, no probe running in this thread): see
    the module; ``counts()``: whether an op runs outside planned modules and programs."""
    try:
        if root in _seen or _local.active is not None:
            return
    except TypeError:
        return
    post: Any = root._forward_hooks
    always: Any = root._forward_hooks_always_called
    try:
        post[_KEY] = _end
        always[_KEY] = True
    except (AttributeError, TypeError):  # dicts that refuse our key: not probed
        post.pop(_KEY, None)
        return
    mode = _Probe(counts)
    mode.__enter__()  # type: ignore[no-untyped-call]
    _local.active = (root, mode, device_type)


def _end(root: nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
    """Our always-called forward hook: the call ended (where it raised, torch calls it in
    its ``except`` block: no verdict); note what it made, our hook and mode gone (a copy's
    stray: dropped)."""
    post: Any = root._forward_hooks
    post.pop(_KEY, None)
    root._forward_hooks_always_called.pop(_KEY, None)  # type: ignore[call-overload]
    active = _local.active
    if active is None or active[0] is not root:
        if any(type(k) is Stale for k in post):
            drop_strays(root)
        return
    _local.active = None
    mode, device = active[1], active[2]
    mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
    if sys.exc_info()[1] is None and torch.is_autocast_enabled(device):
        _seen[root] = mode.low
        if mode.low:
            _forget_fp32(root)


def _forget_fp32(root: nn.Module) -> None:
    """Programs of ``root`` recorded before its hooks were probed that ran float32 throughout
    (the ops after it float32): recorded again (their low work is known now)."""
    from ._store import stale_throughout

    stale_throughout(root)
