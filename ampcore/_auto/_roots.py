"""Where ``level="auto"`` regions act: the roots of a region and their programs.

An enabled ``level="auto"`` region that is a thread's outermost ampcore region and runs
torch's own lists (no custom list, a device type with native autocast) is *eligible*: the
modules it calls directly (its *roots*, normally the model) run the programs of
:mod:`._program`.  When it is entered, the roots that regions entered at the same place in
the code called before get two instance hooks each, and one global pre-hook (the
*sentinel*) waits for any other module called directly; both are removed when it exits.

* A root with a program for its input signature runs it: the sentinel is off for the call,
  so the modules inside run torch's hook-free path; only the switched ones run a hook.
* A root without one (a new module, a new signature, a plan that changed) is recorded: the
  global hooks of :mod:`._hooks` apply the plan to every module of the call (measuring new
  shape classes within the budget) and the recording becomes its program.

Other regions (nested in another ampcore region, with custom lists, on a device type
ampcore's kernels serve, or while compiling) register the global hooks for their whole
life, as before.  Outside auto regions nothing of auto is registered.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, Final, NamedTuple

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

from .._policy.lists import compute_oplists
from .._policy.thread_state import thread_state
from . import _hooks
from ._cache import current_plan
from ._plan import AutoPlan
from ._program import Program, Recording, Running, program_for, signature, store
from ._program import forget as forget_programs
from ._program import local as _prog

__all__ = ["check", "forget", "region_entered", "region_exited"]

#: distinct roots a place in the code may have before its regions use the global hooks
_MAX_ROOTS: Final = 16
_MAX_SITES: Final = 256
_PACKAGE: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_thread = thread_state()
_is_compiling = torch.compiler.is_compiling


class _Site:
    """The roots the eligible regions entered at one place in the code called (weak)."""

    def __init__(self) -> None:
        self.roots: list[weakref.ref[torch.nn.Module]] = []
        self.overflow = False  # more than _MAX_ROOTS roots: its regions use the global hooks

    def alive(self) -> list[torch.nn.Module]:
        found = [m for m in (r() for r in self.roots) if m is not None]
        if len(found) != len(self.roots):
            self.roots = [weakref.ref(m) for m in found]
        return found

    def update(self, called: list[weakref.ref[torch.nn.Module]]) -> None:
        if not called:
            return
        known = {id(m): r for r in [*self.roots, *called] if (m := r()) is not None}
        self.overflow = len(known) > _MAX_ROOTS
        self.roots = list(known.values())


class _Entered(NamedTuple):
    """What :func:`region_entered` did for a region (undone by :func:`region_exited`)."""

    region: Any
    site: _Site | None  # None: not eligible, the global hooks were acquired
    handles: list[Any]  # the instance hooks on the site's roots


class _Local(threading.local):
    def __init__(self) -> None:
        self.entered: list[_Entered] = []
        self.sentinel: Any = None  # its global pre-hook's handle while no root call is in progress
        self.hooked: set[int] = set()  # ids of the roots hooked for it
        self.called: dict[int, weakref.ref[torch.nn.Module]] = {}  # the roots called in the active region
        self.sites: dict[tuple[Any, int], _Site] = {}


_local = _Local()


def _site() -> tuple[Any, int]:
    """Where the user's code entered the region (the first frame outside ampcore)."""
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return frame.f_code, frame.f_lineno


def check() -> None:
    """A ``level="auto"`` region is being made: its settings must be valid before anything
    changes (``AMPCORE_AUTO_BUDGET``)."""
    _hooks.check()


def region_entered() -> None:
    """An enabled ``level="auto"`` region was entered (the thread's innermost region)."""
    stack = _thread.stack
    region = stack[-1]
    site = None
    if len(stack) == 1 and region.spec.policy is None and not _is_compiling():
        key = _site()
        site = _local.sites.get(key)
        if site is None:
            if len(_local.sites) > _MAX_SITES:
                _local.sites.clear()
            site = _local.sites[key] = _Site()
        if site.overflow:
            site = None
    if site is None:
        _hooks.acquire()
        _local.entered.append(_Entered(region, None, []))
        return
    roots = site.alive()
    _hooks.count_region(1)
    _prog.settled, _local.hooked, _local.called = region, set(), {}
    _local.entered.append(_Entered(region, site, []))
    for root in roots:
        _hook_root(root)
    _sentinel_on()


def region_exited() -> None:
    """An enabled ``level="auto"`` region exited: undo what :func:`region_entered` did."""
    if not _local.entered:
        return
    entered = _local.entered.pop()
    if entered.site is None:
        _hooks.release()
        return
    run, rec = _prog.run, _prog.rec
    if run is not None and run.region is entered.region:  # an exception skipped its hooks
        _prog.run = None
        run.stop()
    if rec is not None and rec.region is entered.region:
        _finish(rec, (), None, False)
    _sentinel_off()
    for handle in entered.handles:
        _unhook(handle)
    _hooks.count_region(-1)
    entered.site.update(list(_local.called.values()))
    _prog.settled, _local.hooked, _local.called = None, set(), {}


def _note_called(module: torch.nn.Module) -> None:
    if id(module) not in _local.called:
        _local.called[id(module)] = weakref.ref(module)


def _hook_root(module: torch.nn.Module) -> None:
    """Give ``module`` the root hooks until the active region exits."""
    _local.hooked.add(id(module))
    handles = _local.entered[-1].handles
    key = _Key()
    try:  # torch's hook dicts of the module under a key of ours: no handle objects per region
        dicts: Any = module  # torch types these dicts as keyed by handle ids; any hashable key works
        dicts._forward_pre_hooks[key] = _root_pre
        dicts._forward_pre_hooks_with_kwargs[key] = True
        dicts._forward_hooks[key] = _root_post
        dicts._forward_hooks_always_called[key] = True
        handles.append((module, key))
    except (AttributeError, TypeError):  # a module without torch's dicts: the public registration
        _unhook((module, key))
        handles.append(module.register_forward_pre_hook(_root_pre, with_kwargs=True))
        handles.append(module.register_forward_hook(_root_post, always_call=True))


def _unhook(handle: Any) -> None:
    if not isinstance(handle, tuple):
        handle.remove()
        return
    module, key = handle
    for name in (
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks",
        "_forward_hooks_always_called",
    ):
        found = getattr(module, name, None)
        if isinstance(found, dict):
            found.pop(key, None)


def _sentinel_on() -> None:
    if _local.sentinel is None:
        _local.sentinel = _GLOBAL_PRE.on()


def _sentinel_off() -> None:
    if _local.sentinel is not None:
        _GLOBAL_PRE.off(_local.sentinel)
        _local.sentinel = None


class _GlobalPreHook:
    """The sentinel as a global forward pre-hook, switched on and off several times per
    region: an entry under a key of its own in torch's dict of global pre-hooks (what
    ``register_module_forward_pre_hook`` fills, without a handle per switch), or the
    public registration where that dict is not there."""

    def __init__(self) -> None:
        self.hooks = getattr(torch.nn.modules.module, "_global_forward_pre_hooks", None)
        if not isinstance(self.hooks, dict):
            self.hooks = None

    def on(self) -> Any:
        if self.hooks is None:
            return register_module_forward_pre_hook(_sentinel)
        key = _Key()  # one key per switch-on: each thread's sentinel is its own entry
        self.hooks[key] = _sentinel
        return key

    def off(self, key: Any) -> None:
        if isinstance(key, _Key) and self.hooks is not None:
            self.hooks.pop(key, None)
        else:
            key.remove()


class _Key:
    """A key of the sentinel in torch's dict of global pre-hooks (hashed by identity)."""

    __slots__ = ("__weakref__",)


_GLOBAL_PRE = _GlobalPreHook()


def _idle_region() -> Any:
    """The eligible region when it is innermost and no root call of it is in progress."""
    if _prog.run is not None or _prog.rec is not None or _prog.measuring or _is_compiling():
        return None
    region, stack = _prog.settled, _thread.stack
    if region is None or not stack or stack[-1] is not region:
        return None
    if not torch.is_autocast_enabled(region.spec.backend.device_type):  # switched off: nothing planned
        return None
    return region


def _sentinel(module: torch.nn.Module, args: tuple[Any, ...]) -> Any:
    """A module called directly in an eligible region that is not one of its hooked roots."""
    region = _idle_region()
    if region is None or id(module) in _local.hooked or _compiled(module):
        return None
    _hook_root(module)  # its later calls in this region run its program
    return _record(module, args, region, current_plan(_hooks.fingerprint_of(region)))


def _root_pre(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    region = _idle_region()
    if region is None:
        return None
    plan = current_plan(_hooks.fingerprint_of(region))
    found = program_for(module, signature(args, kwargs), plan)
    if isinstance(found, Program):
        _note_called(module)
        _sentinel_off()
        run = _prog.run = Running(found, module, region)
        if any(ref() is module for ref in found.switched):  # its own pre-hook came too late
            new = run.switch(module, args)
            return None if new is None else (new, kwargs)
        return None
    new = _record(module, args, region, plan)
    return None if new is None else (new, kwargs)


def _root_post(module: torch.nn.Module, args: tuple[Any, ...], output: Any = None) -> None:
    run = _prog.run
    if run is not None and run.root is module:
        _prog.run = None
        run.stop()
        if _prog.settled is run.region:
            _sentinel_on()


def _record(module: torch.nn.Module, args: tuple[Any, ...], region: Any, plan: AutoPlan) -> Any:
    """Run this root call with the global hooks, recording it when it may have programs."""
    if _compiled(module):  # its hooks do nothing; a dispatch mode would change what dynamo does
        return None
    found = program_for(module, None, plan)  # None: a module that cannot have programs
    if found is not None:
        _note_called(module)
    _sentinel_off()
    _hooks.acquire()
    rec = _prog.rec = Recording(module, region, plan, None if found is None else _white(region), _finish)
    rec.args = args  # the signature's: the hooks below may cast them
    return _hooks._pre(module, args)  # the root's own pre-hook call (the global ones ran before)


def _finish(rec: Recording, args: tuple[Any, ...], kwargs: dict[str, Any] | None, ok: bool) -> None:
    """The root call of ``rec`` returned (``ok``) or failed: keep the program it gives."""
    _prog.rec = None
    rec.close()
    _hooks.release()
    if ok and rec.mode is not None:
        sig = signature(rec.args, kwargs)
        found = program_for(rec.root, sig, rec.plan)
        if found is not None:
            tries = found if isinstance(found, int) else 0
            program = rec.program(sig, tries, _hooks.can_measure(rec.region, rec.plan))
            store(rec.root, sig, program if program is not None else tries + 1)
    if _prog.settled is rec.region:
        _sentinel_on()


def _white(region: Any) -> frozenset[str]:
    spec = region.spec
    return compute_oplists(spec.backend, spec.dtype, "O1", frozenset(), frozenset()).white


def _compiled(module: torch.nn.Module) -> bool:
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # imported once torch.compile was used
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return optimized is not None and isinstance(module, optimized)


def forget() -> None:
    """Forget every program and this thread's roots (``ampcore plan clear``, tests)."""
    forget_programs()
    _local.sites.clear()
