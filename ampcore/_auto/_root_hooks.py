"""Where the sentinel and a root's hooks go in torch's hook dicts.

A region with programs keeps one global pre-hook, the *sentinel* (:func:`._roots._sentinel`),
while no root call is in progress (:func:`sentinel_on`, :func:`sentinel_off`), and marks
each of its roots: our key in the root's with-kwargs pre-hook dict, so torch gives the
sentinel the root's kwargs (:func:`hook_root`).  A root with forward pre-hooks of its own
(FSDP2's, ZeRO-3's, an offload hook's, a user's) gets the sentinel as its *last* pre-hook
instead (:func:`last_pre`): it then sees the arguments and weights those hooks give.  Where
torch's dicts cannot take our keys, the root hooks go through torch's public registration
(:func:`hook_public`).  The hooks themselves are :mod:`._roots`' (read through the module).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from . import _roots
from ._roots_state import _Key, _local

__all__ = [
    "after_own",
    "drop_post",
    "global_after",
    "hook_public",
    "hook_root",
    "last_pre",
    "sentinel_off",
    "sentinel_on",
]


def hook_root(module: torch.nn.Module) -> bool:
    """Make ``module`` (met through the sentinel) a root until the active region exits.
    True: it has pre-hooks of its own, which run after this call's sentinel (the arguments
    and weights they give are not known yet); its later calls' sentinel runs after them."""
    local = _local
    handles = local.entered[-1][2]
    own = bool(getattr(module, "_forward_pre_hooks", None))
    try:
        if local.sentinel is not local.sentinel_key:
            raise TypeError  # the sentinel has a public handle: public root hooks
        dicts: Any = module
        if own:
            last_pre(dicts, local.late_key)
        else:
            dicts._forward_pre_hooks_with_kwargs[local.sentinel_key] = True
        handles.append(module)
    except (AttributeError, TypeError):
        hook_public(module, handles)  # (its pre-hook goes after the module's own)
    return own


def last_pre(module: Any, key: _Key) -> None:
    """The sentinel as ``module``'s last pre-hook (given its kwargs) under ``key``: it runs
    after the root's own pre-hooks (FSDP2's and ZeRO-3's that gather the parameters, an
    offload hook's that moves them, a user's that changes the arguments), so it takes the
    signature of the arguments they return and checks the weights they put in place.  One
    of ours already there goes last again (a hook registered after it)."""
    pre = module._forward_pre_hooks
    pre.pop(key, None)
    pre[key] = _roots._sentinel
    module._forward_pre_hooks_with_kwargs[key] = True


def after_own(module: Any) -> None:
    """A root of this region whose sentinel ran before one of its own pre-hooks (one
    registered since it was marked, while the region lasts): its later calls' sentinel
    runs after them (:func:`last_pre`)."""
    local = _local
    if id(module) in local.public:
        return
    late, dicts = local.late_key, module._forward_pre_hooks_with_kwargs
    if dicts.pop(local.sentinel_key, None) is not None or late in module._forward_pre_hooks:
        last_pre(module, late)


def hook_public(module: torch.nn.Module, handles: list[Any]) -> None:
    """The root hooks through torch's public registration (where our keys cannot go)."""
    _local.public.add(id(module))
    handles.append(module.register_forward_pre_hook(_roots._root_pre, with_kwargs=True))
    handles.append(module.register_forward_hook(_roots._root_post, always_call=True))


def drop_post(module: torch.nn.Module) -> None:
    """Remove the post-hook :func:`_roots._sentinel` gave a root for the call that runs a program."""
    if id(module) not in _local.public:
        dicts: Any = module
        dicts._forward_hooks.pop(_local.key, None)
        dicts._forward_hooks_always_called.pop(_local.key, None)


def sentinel_on() -> None:
    local = _local
    if local.sentinel is None:
        if _roots._GLOBAL_PRE is not None:
            _roots._GLOBAL_PRE[local.sentinel_key] = _roots._sentinel
            local.sentinel = local.sentinel_key
        else:
            local.sentinel = register_module_forward_pre_hook(_roots._sentinel)


def sentinel_off() -> None:
    local = _local
    sentinel = local.sentinel
    if sentinel is not None:
        local.sentinel = None
        if sentinel is local.sentinel_key:
            if _roots._GLOBAL_PRE is not None:
                _roots._GLOBAL_PRE.pop(sentinel, None)
        else:
            sentinel.remove()


def global_after(module: torch.nn.Module) -> bool:
    """Whether a global pre-hook (of the user's: registered inside the region, after the
    sentinel) runs after this call's sentinel: the sentinel goes last again for later calls
    (this call is applied call by call).  False: the sentinel is the root's own last
    pre-hook (:func:`last_pre`), after every global one."""
    local = _local
    if local.late_key in module._forward_pre_hooks:
        return False
    key: Any = local.sentinel_key
    if _roots._GLOBAL_PRE is not None and key in _roots._GLOBAL_PRE:
        _roots._GLOBAL_PRE[key] = _roots._GLOBAL_PRE.pop(key)
    return True
