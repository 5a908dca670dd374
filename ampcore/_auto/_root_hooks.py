"""Where the sentinel and a root's hooks go in torch's hook dicts.

A region with programs keeps one global pre-hook, the *sentinel* (:func:`._roots._sentinel`),
while no root call is in progress (:func:`sentinel_on`, :func:`sentinel_off`), and marks
each of its roots: our key in the root's with-kwargs pre-hook dict, so torch gives the
sentinel the root's kwargs (:func:`hook_root`).  A root with forward pre-hooks of its own
(FSDP2's, ZeRO-3's, an offload hook's, a user's) gets the sentinel as its *last* pre-hook
instead (:func:`last_pre`): it then sees the arguments and weights those hooks give.  Where
torch's dicts cannot take our keys, the root hooks go through torch's public registration
(:func:`hook_public`).  At a place in the code of many roots the roots without pre-hooks
of their own are marked as they are called, by the *marker* (:func:`mark_called`), a
global pre-hook that goes in and out just before the sentinel.  The hooks themselves are
:mod:`._roots`' (read through the module); :func:`finish` ends a root call's recording.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from . import _hooks, _roots
from ._guard import holds_objects
from ._hook_probe import probe
from ._program import _LOW, signature
from ._program import local as _prog
from ._roots_state import (
    _GLOBAL_ALWAYS,
    _GLOBAL_POST,
    _compiled,
    _idle_region,
    _Key,
    _local,
    _set_autocast,
    _thread,
    drop_strays,
)
from ._shapes import float32_weights, planned_ops, shape_class
from ._store import program_for, raised, store
from ._twins import call_kwargs, drop_walk

if TYPE_CHECKING:
    from ._recording import Recording

__all__ = [
    "after_own",
    "drop_post",
    "finish",
    "global_after",
    "hold_place",
    "hook_public",
    "hook_root",
    "last_pre",
    "mark_called",
    "new_root",
    "post_first",
    "registered_from",
    "sentinel_off",
    "sentinel_on",
    "user_hooks_last",
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


def new_root(module: torch.nn.Module, args: tuple[Any, ...]) -> Any:
    """The sentinel's call for a module called directly in an eligible region that is not
    one of its roots (not marked): it becomes one, and this call is recorded."""
    local = _local
    if id(module) in local.public or local.late_key in module._forward_pre_hooks:
        # (a root with public hooks, or the sentinel as its last pre-hook: that decides)
        if planned_ops(module) is not None:
            _own_hooks_off(module, args)
        if local.late_key in module._forward_pre_hooks and (region := _prog.settled) is not None:
            probe(module, region.spec.backend.device_type, _outside)  # (not probed yet: ._hook_probe)
        return None
    region = _idle_region()
    if region is None or _compiled(module):
        return None
    if module._forward_pre_hooks:
        drop_strays(module)  # a copy of a root made while hooked
    plan = _hooks.plan_of(region)
    if hook_root(module):  # its later calls in this region run its program
        probe(module, region.spec.backend.device_type, _outside)  # its own hooks' low work (._hook_probe)
        if program_for(module, None, plan) is not None:  # pre-hooks of its own run after this
            local.called[id(module)] = weakref.ref(module)  # call: applied call by call, the site learns it
        return _roots._record(module, args, region, plan, unsigned=True)
    kwargs = call_kwargs(module, args, plan)
    if kwargs is not None:  # a copy of a root with a program for this call: it runs one (_twins)
        local.called[id(module)] = weakref.ref(module)
        try:
            new = _roots._sentinel(module, args, kwargs)
        finally:
            drop_walk()  # (adopt took it, or the call went another way)
        return None if new is None else new[0]
    return _roots._record(module, args, region, plan)


def _own_hooks_off(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    """Autocast off for the own pre-hooks of a root that is itself a planned layer the plan
    decides float32 for these arguments (a bare ``Linear`` called in the region): a fixed
    choice decides it before them, so a product such a hook makes (a LoRA merge's, a
    spectral norm's power step) is float32 there too; the root's sentinel, after them, turns
    the region's state back on first (as after a float32 root) and runs its program."""
    prog = _prog
    region = prog.settled
    if region is None or prog.run is not None or prog.rec is not None or prog.measuring:
        return
    stack, device = _thread.stack, region.spec.backend.device_type
    if stack and stack[-1] is region and torch.is_autocast_enabled(device) and _fp32_layer(module, args, region):
        _set_autocast(device, False)
        _local.between = device


def _fp32_layer(module: torch.nn.Module, args: tuple[Any, ...], region: Any) -> bool:
    """Whether the plan of ``region`` runs the planned layer ``module`` float32 on ``args``
    (float32 weights; a leaf on float32 inputs runs float32 throughout)."""
    key = shape_class(module, args, region.spec.backend.device_type)
    return key is not None and _hooks.plan_of(region).decision(key) == "fp32" and float32_weights(module)


def _outside() -> bool:
    """Whether an op runs outside planned modules and programs (:mod:`._hook_probe`)."""
    rec = _prog.rec
    return _prog.run is None and (rec is None or not rec.planned)


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
    handles.append(module.register_forward_pre_hook(_root_pre, with_kwargs=True))
    handles.append(module.register_forward_hook(_roots._root_post, always_call=True))


def _root_pre(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A root's pre-hook registered through torch's public API (see :func:`hook_public`)."""
    return _roots._sentinel(module, args, kwargs)


def drop_post(module: torch.nn.Module) -> None:
    """Remove the post-hook :func:`_roots._sentinel` gave a root for the call that runs a program."""
    if _GLOBAL_POST is not None and _local.key in _GLOBAL_POST:  # (post_first)
        _GLOBAL_POST.pop(_local.key, None)
        _GLOBAL_ALWAYS.pop(_local.key, None)  # type: ignore[union-attr]
    if id(module) not in _local.public:
        dicts: Any = module
        dicts._forward_hooks.pop(_local.key, None)
        dicts._forward_hooks_always_called.pop(_local.key, None)


def user_hooks_last() -> None:
    """The global pre- and forward hooks the user registered inside the region (after its
    entry) after ours (a recording's, :mod:`._hooks`'): in the reference (torch.autocast
    with the decisions) the decisions' hooks go in at the block's entry, so those see each
    decision made and a root call's end handled.  A dict's order is its keys' insertion
    order: a key popped and put back goes last; torch's handles keep their ids."""
    later = set(_registered_in_region())  # (torch's handle ids are unique across both dicts)
    for hooks in (_roots._GLOBAL_PRE, _GLOBAL_POST) if later else ():
        if hooks is not None and len(hooks) > 1:
            for key in [k for k in hooks if k in later]:
                hooks[key] = hooks.pop(key)


def _registered_in_region() -> list[int]:
    """The ids of the global hooks the user registered inside the region (after its entry;
    not :mod:`._hooks`' own, which another region or thread may hold on)."""
    since, ours = _local.hooks_from, {handle.id for handle in _hooks._process.handles}
    hooks = [h for h in (_roots._GLOBAL_PRE, _GLOBAL_POST) if h]
    return [k for h in hooks for k in h if type(k) is int and k >= since and k not in ours]


def registered_from(local: Any) -> None:
    """At an eligible region's entry (the hooks registered in it have ids from torch's next
    one, ``local.hooks_from``): a program recorded while global hooks registered in its
    region were in place (their low work counted as the root's, as the reference's block
    counts it) is recorded again where such a hook is still registered, now before this
    region (the reference runs it before its decisions: not the root's work)."""
    hooks = [h for h in (_roots._GLOBAL_PRE, _GLOBAL_POST) if h]
    for stale, keys in local.among:
        if any(k in h for h in hooks for k in keys):
            stale[0] = True
    local.among = []


def post_first(module: torch.nn.Module) -> bool:
    """The post-hook of a root call that runs a program in torch's global forward hooks,
    before those the user registered in the region (as the reference's post-hook, which
    goes in at the block's entry: they see the state it leaves after a float32 root), where
    there are such (True; False: the root's own dict, after every global one, as usual)."""
    hooks: Any = _GLOBAL_POST
    always: Any = _GLOBAL_ALWAYS
    later = [k for k in hooks if type(k) is int and k >= _local.hooks_from]
    if not later:
        return False
    key: Any = _local.key
    hooks[key] = _global_post
    always[key] = True
    for k in later:
        hooks[k] = hooks.pop(k)
    return True


def _global_post(module: torch.nn.Module, args: tuple[Any, ...], output: Any = None) -> None:
    """:func:`post_first`'s hook: the root's post-hook at its call's end (a module inside it: nothing)."""
    run = _prog.run
    if run is not None and run.root is module:
        drop_post(module)
        _roots._root_post(module, args, output)


def mark_called(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    """The *marker*: a global pre-hook just before the sentinel while a region at a site of
    many roots lasts (and with it off during a root call that runs a program).  A root of
    the site called gets its mark (our key in its with-kwargs dict: torch checks that dict
    at each global hook's turn, so the sentinel after it gets the kwargs), kept until the
    region exits.  Another thread's call, a module that is not one of the site's roots or a
    dict that refuses our key (the sentinel then meets it as a new root): nothing."""
    local = _local
    roots = local.marking
    if roots is None:
        return
    ref = roots.get(id(module))
    if ref is None or ref() is not module:
        return
    dicts: Any = module._forward_pre_hooks_with_kwargs
    key = local.sentinel_key
    if key in dicts:  # (called before in this region)
        return
    try:
        dicts[key] = True
    except (AttributeError, TypeError):
        return
    local.marked.append(module)


def sentinel_on() -> None:
    local = _local
    if local.sentinel is None:
        if _roots._GLOBAL_PRE is not None:
            if local.marking is not None:  # the marker goes just before it
                _roots._GLOBAL_PRE[local.marker_key] = mark_called
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
            glob = _roots._GLOBAL_PRE
            if glob is not None:
                if len(glob) > 1 and type(next(reversed(glob))) is not _Key:
                    hold_place(glob)
                else:
                    glob.pop(sentinel, None)
                    glob.pop(local.marker_key, None)
        else:
            sentinel.remove()


def hold_place(glob: Any) -> None:
    """The sentinel (and the marker) off, their places in torch's global pre-hook dict
    held: a global pre-hook registered inside the region comes after them (in the
    reference, torch.autocast with the decisions, the decision's hook runs before it), so
    they go back there (a key assigned keeps its place), not last.  Rare: the hook-free
    path inside a root call is lost anyway while a global hook of the user's is in place."""
    local = _local
    glob[local.sentinel_key] = _held
    if local.marker_key in glob:
        glob[local.marker_key] = _held


def _held(module: torch.nn.Module, args: tuple[Any, ...], kwargs: Any = None) -> None:
    """The sentinel's and the marker's place in torch's global dict while off (:func:`hold_place`)."""
    return None


def global_after(module: torch.nn.Module) -> bool:
    """Whether a global pre-hook (of the user's: registered inside the region, after the
    sentinel) runs after this call's sentinel: this call is applied call by call (the
    arguments that hook gives are not known yet: its plan follows it, as the reference's
    decision); the sentinel keeps its place, before that hook (as the reference's hook),
    and becomes the root's last own pre-hook too, after every global one (:func:`last_pre`:
    the global sentinel sets the state, the root's runs its program), for this region and,
    the place in the code learning it, for the roots of its regions from their entry.
    False: the sentinel is the root's own last pre-hook already."""
    local = _local
    if local.late_key in module._forward_pre_hooks:
        return False
    if id(module) not in local.public:
        site = local.entered[-1][1] if local.entered else None
        if site is not None:
            site.late = True
        module._forward_pre_hooks_with_kwargs.pop(local.sentinel_key, None)  # type: ignore[call-overload]
        last_pre(module, local.late_key)
    return True


def finish(rec: Recording, args: tuple[Any, ...], kwargs: dict[str, Any] | None, ok: bool) -> None:
    """The root call of ``rec`` returned (``ok``) or failed: keep the program it gives; where it runs
    float32 throughout (none low before it in the region), autocast off for the region's ops after it."""
    _prog.rec = None
    fp32 = False  # the program it gives runs float32 throughout (as _roots._root_post)
    rec.root._forward_hooks.pop(_local.key, None)  # type: ignore[call-overload]
    rec.close()
    _hooks.release()
    deferred = _local.deferred
    if deferred:
        _local.deferred = []
        _hooks.undefer(deferred)
    if ok and not rec.kept:  # its sentinel went late (global_after): no program from it
        fp32 = rec.all_fp32()
    elif ok and rec.mode is not None:
        sig = rec.sig if rec.sig is not None else signature(rec.args, kwargs, rec.root)
        if rec.sig is None and sig is not None and holds_objects(sig):
            sig = None  # taken after a forward that may have changed them (a cache grown): recorded again
        found = None if sig is None else program_for(rec.root, sig, rec.plan)
        if found is not None and sig is not None:
            tries = found if isinstance(found, int) else 0
            program = rec.program(sig, tries, _hooks.can_measure(rec.region, rec.plan))
            store(rec.root, sig, program if program is not None else tries + 1)
            fp32 = program is not None and program.throughout()
            if program is not None and (later := _registered_in_region()):
                _local.among.append((program.stale, later))
    elif ok and not rec.root._modules and planned_ops(rec.root) is not None:  # a bare layer applied call by call
        fp32 = not any(isinstance(a, torch.Tensor) and a.dtype in _LOW for a in args)
        fp32 = fp32 and _fp32_layer(rec.root, args, rec.region)  # (its first call after pre-hooks of its own)
    elif not ok and rec.mode is not None:
        raised(rec.root, rec.sig)  # a setting's value the forward raises on (_store._by_settings)
    if _prog.settled is rec.region:
        sentinel_on()
        fp32 = fp32 and _local.between is not False
        between: str | Literal[False] = rec.region.spec.backend.device_type if fp32 else False
        if between:
            _set_autocast(between, False)
        _local.between = between
