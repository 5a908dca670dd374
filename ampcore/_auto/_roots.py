"""Where ``level="auto"`` regions act: the roots of a region and their programs.

An enabled ``level="auto"`` region that is a thread's outermost ampcore region and runs torch's own lists
(no custom list, a device type with native autocast) is *eligible*: the modules it calls directly (its
*roots*, normally the model) run the programs of :mod:`._program`.  When it is entered, one global
pre-hook (the *sentinel*) goes in, and the roots that regions entered at the same place in the code
called before are *marked* (:mod:`._root_hooks`: torch calls the sentinel with a marked root's kwargs,
after the root's own pre-hooks); both go when it exits.  At a place of many roots (an ensemble) a
second global pre-hook before the sentinel, the *marker*, marks a root as it is called instead.

* A marked root with a program for its input signature runs it (the sentinel adds the root's post-hook
  for that call): the sentinel is off for the call, so the modules inside run torch's hook-free path.
* A root without one (a module called directly that is not marked, a new signature, a plan that
  changed) is recorded and marked: the global hooks of :mod:`._hooks` apply the plan to every module
  of the call (measuring new shape classes within the budget): the recording becomes its program.
* After a root call that ran float32 throughout, none before it in the region low, autocast stays off
  for the region's ops after it (a similarity of two towers), as the float32 step, until the next root
  call or a ``torch.autocast`` entered (:mod:`._entered`); after one that ran anything low: the O1 lists.

Other regions (nested in another ampcore region, with custom lists, on a device type ampcore's kernels
serve, or while compiling) register the global hooks for their whole life.  Outside auto regions nothing
of auto is registered (nor ``torch.autocast.__enter__`` wrapped: :mod:`._entered`).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Final

import torch
from torch.utils.hooks import RemovableHandle as _HANDLE

from . import _hooks
from ._cache import plans as _plans
from ._early import pending
from ._entered import _ENTERED_LOCK, _TORCH_AUTOCAST, _enter, _torch_enter
from ._guard import unchanged
from ._plan import AutoPlan
from ._program import Program, Running, signature
from ._program import local as _prog
from ._recording import Recording
from ._root_hooks import (
    after_own,
    drop_post,
    finish,
    global_after,
    hold_place,
    hook_public,
    last_pre,
    mark_called,
    new_root,
    post_first,
    registered_from,
    sentinel_off,
    sentinel_on,
    user_hooks_last,
)
from ._roots_state import (  # noqa: F401 (_AskCompiling: for tests)
    _GLOBAL_POST,
    _MAX_SITES,
    _PACKAGE,
    _alone,
    _AskCompiling,
    _autocast_enabled,
    _compiled,
    _compiler,
    _dynamo_compiling,
    _Key,
    _Last,
    _local,
    _Module,
    _num_threads,
    _set_autocast,
    _site_at,
    _thread,
    _tracing,
    _white,
    drop_strays,
    turn,
)
from ._roots_state import _GLOBAL_PRE as _GLOBAL_PRE  # (_root_hooks reads it here: tests replace it)
from ._store import churning, program_for, store
from ._store import forget as forget_programs
from ._twins import adopt
from ._verify import settle

__all__ = ["check", "forget", "region_entered", "region_exited"]


#: A region being made checks ``AMPCORE_AUTO_BUDGET``: :func:`._hooks.check` itself (no call between)
check: Final = _hooks.check


def region_entered() -> None:
    """An enabled ``level="auto"`` region was entered (the thread's innermost region)."""
    stack = _thread.stack
    region = stack[-1]
    local = _local
    site = None
    if len(stack) == 1 and region.spec.policy is None and not _compiler._is_compiling_flag:
        # the site: where the user's code entered it, the first frame outside ampcore above the one that called
        # us (autocast.__enter__, entry.enter); its instruction, not its line (f_lineno decodes the line table)
        frame = sys._getframe(2)
        if frame.f_code is local.site_code and frame.f_lasti == local.site_at:
            site = local.site  # the place of the last region (a site's code is never ampcore's)
        else:
            while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
                frame = frame.f_back
            site = _site_at(local, frame.f_code, frame.f_lasti)
        if site.overflow:
            site = None
    if site is None:
        _hooks.acquire()
        local.entered.append((region, None, []))
        return
    _prog.settled = region
    if local.among:  # programs recorded among global hooks registered in a region (_root_hooks)
        registered_from(local)
    local.hooks_from = _HANDLE.next_id  # the global hooks registered in it: those from here
    handles: list[Any] = []
    local.entered.append((region, site, handles))
    _hooks.region_threads[local.ident] = True
    if _TORCH_AUTOCAST.__enter__ is not _enter:  # watched while a thread is in a region (_entered)
        _TORCH_AUTOCAST.__enter__ = _enter
    skey = local.sentinel_key
    if _GLOBAL_PRE is None:  # a torch without the global dict: public registrations only
        for ref in site.roots:
            if (root := ref()) is not None:
                hook_public(root, handles)
        sentinel_on()
        return
    roots, late = site.roots, site.late  # late: global pre-hooks registered in its regions
    if site.marking and not late:  # many roots: the marker marks those the region calls
        roots, local.marking, local.marked = site.early, site.called, handles
        _GLOBAL_PRE[local.marker_key] = mark_called
    for ref in roots:  # (a few roots: few lines each)
        if (root := ref()) is not None:
            try:  # our key in its with-kwargs dict: the sentinel is its pre-hook, given its kwargs
                # (torch types these dicts as keyed by handle ids; any hashable key works)
                if late or root._forward_pre_hooks:  # pre-hooks of its own: the sentinel goes after them
                    last_pre(root, local.late_key)
                else:
                    root._forward_pre_hooks_with_kwargs[skey] = True
            except (AttributeError, TypeError):  # no torch dicts: the public registration
                hook_public(root, handles)
            else:
                handles.append(root)
    _GLOBAL_PRE[skey] = _sentinel
    local.sentinel = skey


def region_exited() -> None:
    """An enabled ``level="auto"`` region exited: undo what :func:`region_entered` did."""
    local = _local
    if not local.entered:
        return
    region, site, handles = local.entered.pop()
    if site is None:
        _hooks.undefer(handles)  # the layers its calls deferred (_hooks._pre)
        _hooks.release()
        return
    prog = _prog
    run, rec = prog.run, prog.rec
    if run is not None:  # an exception skipped its hooks (a run is always the outermost region's)
        prog.run = None
        if run.root is not None:
            drop_post(run.root)
        run.stop()
    if rec is not None and rec.region is region:
        finish(rec, (), None, False)
    skey = local.sentinel_key
    if (local.sentinel is skey or local.sentinel is None) and _GLOBAL_PRE is not None:  # (None: held)
        _GLOBAL_PRE.pop(skey, None)
        local.sentinel = None
    else:
        sentinel_off()
    marking = local.marking
    if marking is not None:
        _GLOBAL_PRE.pop(local.marker_key, None)  # type: ignore[union-attr]
        local.marking, local.marked = None, []
    early = None
    for handle in handles:
        if isinstance(handle, _Module):
            handle._forward_pre_hooks_with_kwargs.pop(skey, None)  # type: ignore[call-overload]
            if handle._forward_pre_hooks:  # the sentinel as its last pre-hook (last_pre)
                lkey: Any = local.late_key
                handle._forward_pre_hooks.pop(lkey, None)
                handle._forward_pre_hooks_with_kwargs.pop(lkey, None)
                if marking is not None and id(handle) in marking:  # marked at entry from now on
                    early = [*(early or ()), id(handle)]
        else:
            handle.remove()
    if site.late and _HANDLE.next_id == local.hooks_from:  # no hook registered in it: its roots marked as before
        site.late = False
    threads = _hooks.region_threads
    threads.pop(local.ident, None)
    if not threads:  # torch.autocast's own entry again, then a look: a thread that entered meanwhile keeps it
        with _ENTERED_LOCK:
            _TORCH_AUTOCAST.__enter__ = _torch_enter
            if threads:
                _TORCH_AUTOCAST.__enter__ = _enter
    prog.settled = local.between = None  # (the region's exit puts torch's autocast state back)
    if local.public:
        if marking is not None or local.called:  # their dicts refuse our key: marked at entry
            early = [*(early or ()), *(local.public - site.early_ids)]
        local.public.clear()
    if local.called or early:
        site.update(list(local.called.values()), early or ())
        local.called.clear()


def _sentinel(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    """The global pre-hook of an eligible region while no root call is in progress: a root
    (our key is in its with-kwargs dict, so torch gives its kwargs) runs its program for this
    signature, else is recorded; another module called directly becomes a root.  Settled
    calls inline: the root's :class:`_Last` holds while what :func:`_hooks.plan_of` keys on,
    the signature and the program's guard are unchanged."""
    if (between := _local.between) and _thread.stack and _thread.stack[-1] is _prog.settled:
        _set_autocast(between, True)  # left off by the last root for the ops after it: the region's again
        _local.between = None
    if kwargs is None:
        return new_root(module, args)
    prog = _prog
    region = prog.settled
    if region is None:  # no region of ours in this thread: a copy's stray, or another thread's root
        drop_strays(module)
        return None
    if prog.run is not None or prog.rec is not None or prog.measuring:
        return None
    if _dynamo_compiling() or _compiler._is_compiling_flag:  # first: dynamo folds it (no flag read)
        return None
    stack, spec = _thread.stack, region.spec
    if not stack or stack[-1] is not region or not _autocast_enabled(spec.backend.device_type):
        return None
    glob = _GLOBAL_PRE  # a global pre-hook registered after the sentinel runs after it (rare; alone: last)
    behind = glob is not None and len(glob) > 1 and type(next(reversed(glob))) is not _Key
    if behind and global_after(module):  # its sentinel goes late: this call applied call by call
        new = None if _tracing() else _record(module, args, region, _hooks.plan_of(region), unsigned=True, kept=False)
        return None if new is None else (new, kwargs)
    sig = signature(args, kwargs, module)
    local = _local
    threads = _num_threads()
    last = local.last.get(id(module))
    if last is not None and (last.sig != sig or last.spec is not spec or last.threads != threads):
        # micro-batches, dtypes in turn: an entry for this signature (a sig of None, a call the
        # guard cannot see, has none), thread count and spec (or plan), else None
        last = turn(last, sig, spec, threads, region, module)
    if (  # (so the signature, the spec and the thread count are the last's: compared once)
        last is None
        or last.generation != _plans.generation
        or last.ref() is not module
        or last.plan.changes != last.changes
        or last.stale[0]
        or not unchanged(last.tree, last.values, last.weights, last.plain)  # Program.same_tree
    ):
        last = _find(module, args, kwargs, region, sig)
        if type(last) is not _Last:
            return last  # recorded: the new arguments, or None
    sentinel = local.sentinel  # off while the program runs (with the marker, if any)
    if sentinel is local.sentinel_key and _GLOBAL_PRE is not None:
        local.sentinel = None
        if behind:  # their places held, before the hooks registered in the region
            hold_place(_GLOBAL_PRE)
        else:
            _GLOBAL_PRE.pop(sentinel, None)
            if local.marking is not None:
                _GLOBAL_PRE.pop(local.marker_key, None)
    else:
        sentinel_off()
    if id(module) not in local.public and not (_GLOBAL_POST and post_first(module)):
        dicts: Any = module  # its post-hook for this call (torch reads them after the forward)
        key = local.key
        dicts._forward_hooks[key] = _root_post
        dicts._forward_hooks_always_called[key] = True
    run = last.run
    if run is None:
        run = last.run = Running(last.program, module, region)
    elif run.simple:  # Running.start's steps for a program that hooks no module
        run.root, run.region = module, region
        if run.default_fp32:
            _set_autocast(run.device_type, False)
    else:
        run.start(module, region)
    prog.run = run
    if last.switches_root:  # its own pre-hook came too late
        new = run.switch(module, args)
        return None if new is None else (new, kwargs)
    return None


def _find(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], region: Any, sig: Any) -> Any:
    """The root call of :func:`_sentinel` without a settled program: the program for its signature (checked
    as a whole first where it is mixed) as a new :class:`_Last`, else the call is recorded (its new arguments)."""
    if _tracing():  # torch.jit.trace: as torch.autocast (_roots_state._tracing)
        return None
    generation = _plans.generation  # before plan_of: a plan put since makes _Last miss
    plan = _hooks.plan_of(region)
    if sig is None:  # an argument the guard cannot see, or a pre-hook of its own after the
        if module._forward_pre_hooks:  # sentinel: the plan applies call by call, unrecorded
            after_own(module)
        new = _record(module, args, region, plan, unsigned=True)
        return None if new is None else (new, kwargs)
    local = _local
    found = program_for(module, sig, plan)
    if found == 0 and (found := adopt(module, sig, plan)) is not None:  # a copy of a root with one (_twins)
        store(module, sig, found)
    if not isinstance(found, Program):
        new = _record(module, args, region, plan, sig)
        return None if new is None else (new, kwargs)
    program = found
    if not program.checked or program.recheck is not None:  # timed as a whole (_verify, _again)
        sentinel_off()
        try:
            measure = _hooks.can_measure(region, plan) and _alone()
            clock = _hooks.clock_of(region) if measure else None
            program = settle(module, args, kwargs, program, region, plan, sig, clock)
        finally:
            sentinel_on()
    if len(local.last) > _MAX_SITES:
        local.last.clear()
    last = local.last[id(module)] = _Last(module, sig, program, region.spec, generation, local.last)
    if not program.checked and program.check_tries or pending(module, sig):  # its check raised, or it
        last.stale = _AGAIN  # was re-baselined (._early): looked up again at the next call
    return last


_AGAIN: Final = [True]  # a _Last's stale flag that sends the next call to _find


def _root_post(module: torch.nn.Module, args: tuple[Any, ...], output: Any = None) -> None:
    prog = _prog
    run = prog.run
    if run is not None and run.root is module:
        prog.run = None
        local = _local
        if id(module) not in local.public:
            dicts: Any = module
            key = local.key
            dicts._forward_hooks.pop(key, None)
            dicts._forward_hooks_always_called.pop(key, None)
        region = run.region
        if run.simple:  # Running.stop's steps for a program that hooks no module (autocast: as below)
            fp32 = run.fp32 and local.between is not False
            if run.default_fp32 is not fp32:
                _set_autocast(run.device_type, not fp32)
            run.root = run.region = None
        elif fp32 := run.stop() and local.between is not False:  # all float32, none low before it:
            _set_autocast(run.device_type, False)  # autocast off for the region's ops after it (the float32 step's)
        local.between = run.device_type if fp32 else False
        if prog.settled is region and local.sentinel is None:
            if _GLOBAL_PRE is not None:
                if local.marking is not None:  # the marker just before it
                    _GLOBAL_PRE[local.marker_key] = mark_called
                _GLOBAL_PRE[local.sentinel_key] = _sentinel
                local.sentinel = local.sentinel_key
            else:
                sentinel_on()
    else:  # a copy's stray (a root copied in its forward) or a public hook's call without a program
        drop_strays(module)


def _record(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    region: Any,
    plan: AutoPlan,
    sig: tuple[Any, ...] | None = None,
    unsigned: bool = False,
    kept: bool = True,
) -> Any:
    """Run this root call with the global hooks, recording it when it may have programs (``sig``: the call's
    signature, taken before the forward may change its arguments; ``unsigned``: it has none, an argument the
    guard cannot see: no program, no recording; not ``kept``: for the state after it only).  Its layers with
    pre-hooks of their own are planned after them (``_hooks.defer``), also in a root applied call by call for
    good (unsigned, churning: a walk of its modules per call, beside the global hooks' two per module call)."""
    if _compiled(module):  # its hooks do nothing; a dispatch mode would change what dynamo does
        return None
    found = None  # no program (signatures beyond its table, or none): call by call
    if not unsigned and not churning(module, sig):
        found = program_for(module, None, plan)  # None: a module that cannot have programs
    if found is not None and id(module) not in _local.called:
        _local.called[id(module)] = weakref.ref(module)  # the site learns it when the region exits
    sentinel_off()
    _hooks.acquire()
    user_hooks_last()  # (as the reference's: ours before those registered in the region)
    rec = _prog.rec = Recording(module, region, plan, None if found is None and kept else _white(region), finish)
    rec.args, rec.sig, rec.kept = args, sig, kept  # the signature's: the hooks below may cast them
    if id(module) not in _local.public:  # a copy made in its forward drops its strays (the mark)
        module._forward_hooks[_local.key] = _root_post  # type: ignore[index]
    _local.deferred = _hooks.defer(module)  # layers with pre-hooks of their own: planned after them
    return _hooks._pre(module, args)  # the root's own pre-hook call (the global ones ran before)


def forget() -> None:
    """Forget every program and this thread's roots (``ampcore plan clear``, tests)."""
    forget_programs()
    _local.sites.clear()
    _local.site_code = _local.site = None
    _local.last.clear()
