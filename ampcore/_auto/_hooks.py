"""The global module hooks that apply a plan call by call.

``torch.nn.modules.module.register_module_forward_pre_hook`` / ``..._forward_hook`` are
registered (a count across threads, under a lock) only while something needs them: a root
call of a region with programs that is being *recorded* (:mod:`._roots`), or a whole
``level="auto"`` region that cannot have programs (nested in another ampcore region, with
custom lists, on a device type ampcore's kernels serve).  Outside auto regions, and inside
root calls that run a program, module calls take torch's path without global hooks.  While
registered (in any thread), every ``nn.Module`` call in the process runs the two hooks; they
return at once unless the calling thread's innermost ampcore region is an enabled
``level="auto"`` region and the module is a planned kind (:data:`._shapes.PLANNED_OPS`, or a
class whose forward is one product with its own matrix: :mod:`._kinds`).  Then, by the
plan's decision for the call's shape class:

* ``"low"``: nothing; the region's O1 lists run it in low precision (black-list ops in
  float32, exactly as O1);
* ``"fp32"``: autocast is switched off for the module's forward (on again after it) and
  its low-precision floating inputs are cast to float32;
* no decision yet: the call runs with the O1 lists, then the forward hook measures it
  within the process's warm-up budget (``AMPCORE_AUTO_BUDGET`` seconds, default 10) and
  decides (:mod:`._deciding`).  A device that cannot be timed measures nothing: auto runs
  as torch.autocast.

A recording notes each planned call and its decision (:class:`~._recording.Recording`).
A planned call inside ``torch.utils.checkpoint`` is left to the autocast state (its
recompute runs with that state and no hooks: :func:`~._guard.in_checkpoint`).  Custom
lists win: a module whose ops a region's custom list names is left to the lists.  Inside
``torch.compile``d code the hooks do nothing (the O1 lists apply).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Final, NamedTuple

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from .._policy.thread_state import thread_state
from .._validate import env_number
from . import _cache, _deciding, _heal
from ._cache import current_plan
from ._deferral import defer as _defer
from ._deferral import defer_children as _defer_children
from ._deferral import local as _deferral
from ._deferral import undefer as undefer
from ._guard import in_checkpoint, in_transform
from ._kinds import Watch, watched
from ._measure import Clock, device_clock
from ._plan import AutoPlan, fingerprint
from ._program import cast_floating
from ._program import local as _prog
from ._roots_state import _compiler, _dynamo_compiling, _num_threads, _tracing
from ._roots_state import _local as _roots_local
from ._shapes import (
    PENDING,
    VARIES,
    device_type_of,
    float32_weights,
    known_kind,
    planned_ops,
    shape_class,
    variant_kind,
)
from ._stale import Stale, drop_strays

__all__ = [
    "BUDGET_ENV",
    "acquire",
    "budget_s",
    "can_measure",
    "clock_of",
    "check",
    "fingerprint_of",
    "installed",
    "plan_of",
    "release",
]

#: Environment variable: seconds of measurement a process may spend (default 10).
BUDGET_ENV: Final = "AMPCORE_AUTO_BUDGET"
_LOW: Final = (torch.bfloat16, torch.float16)

_thread = thread_state()
_autocast_enabled: Final = torch.is_autocast_enabled
_set_autocast: Final = torch.set_autocast_enabled
_new_tuple: Final = tuple.__new__  # a _Frame without its generated __new__ (a Python call)


class _Frame(NamedTuple):
    """A planned module's forward in progress: either run in float32 with autocast switched
    off for device type ``off`` (switched on again after), or measured for the shape class
    ``key``."""

    module: torch.nn.Module
    off: Any  # the device type whose autocast the forward switched off, or None
    key: Any  # the shape class being measured, or None
    plan: Any  # the AutoPlan that records the measurement, or None
    region: Any  # the region's spec, or None


class _Local(threading.local):
    def __init__(self) -> None:
        self.frames: list[_Frame] = []
        self.watches: list[Watch] = []  # classes whose first call is watched (:mod:`._kinds`)
        #: (region, thread count, the plans' generation, its plan): :func:`plan_of`'s last
        self.plan: tuple[Any, int, int, AutoPlan] | None = None


class _Process:
    """The hooks' handles and the count of active auto regions, the warm-up budget, the
    fingerprints and clocks (process-wide: torch's global module hooks are)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handles: list[Any] = []
        self.active = 0
        self.spent_s = 0.0
        self.warned = False
        self.exhausted_warned = False
        self.untimed_warned: set[str] = set()
        self.fingerprints: dict[tuple[Any, ...], dict[str, Any]] = {}
        #: (backend, index, dtype, threads) -> (the plans' generation, the plan) for plan_of
        self.plans: dict[tuple[Any, ...], tuple[int, AutoPlan]] = {}
        self.clocks: dict[tuple[str, int], Clock | None] = {}


_local = _Local()
_process = _Process()
#: thread id -> True while the thread is in a region with programs (its hooks are in place; no lock)
region_threads: dict[int, bool] = {}


def budget_s() -> float:
    """The process's measuring budget in seconds (``AMPCORE_AUTO_BUDGET``, default 10).

    Raises:
        AmpcoreError: the variable holds anything but a finite number >= 0.
    """
    return env_number(BUDGET_ENV, 10.0, "seconds")


def _clock(region: Any) -> Clock | None:
    backend = region.spec.backend
    key = (backend.name, getattr(region.owner, "device_index", None) or 0)
    if key not in _process.clocks:
        _process.clocks[key] = device_clock(backend, key[1])
    return _process.clocks[key]


def clock_of(region: Any) -> Clock | None:
    """The clock of ``region``'s device (None: it can be neither timed nor synchronised)."""
    return _clock(region)


def load_of(region: Any) -> float | None:
    """How busy other work keeps ``region``'s device, by the adapter's ``ampcore_auto_load``
    hook (None: the adapter does not say)."""
    hook = region.spec.backend.hook("ampcore_auto_load")
    if hook is None:
        return None
    found: float | None = hook(device_index=getattr(region.owner, "device_index", None) or 0)
    return found


def can_measure(region: Any, plan: AutoPlan) -> bool:
    """Whether a class ``plan`` lacks can still be measured in ``region``."""
    return not plan.frozen and _process.spent_s < budget_s() and _clock(region) is not None and not in_transform()


def plan_of(region: Any) -> AutoPlan:
    """``current_plan(fingerprint_of(region))`` with one dictionary lookup when nothing
    changed, none for the thread's last region (a planned call applied call by call asks)."""
    threads, generation = _num_threads(), _cache.plans.generation
    last = _local.plan
    if last is not None and last[0] is region and last[1] == threads and last[2] == generation:
        return last[3]
    spec = region.spec
    key = (spec.backend.name, getattr(region.owner, "device_index", None) or 0, spec.dtype, threads)
    found = _process.plans.get(key)
    if found is not None and found[0] == generation:
        plan = found[1]
    else:
        plan = current_plan(_fingerprint(region))
        _process.plans[key] = (generation, plan)
    _local.plan = (region, threads, generation, plan)
    return plan


def fingerprint_of(region: Any) -> dict[str, Any]:
    """The fingerprint of ``region``'s plan (the same dict object for the same setting)."""
    return _fingerprint(region)


def _fingerprint(region: Any) -> dict[str, Any]:
    spec = region.spec
    index = getattr(region.owner, "device_index", None) or 0
    key = (spec.backend.name, index, spec.dtype, torch.get_num_threads())
    found = _process.fingerprints.get(key)
    if found is None:
        found = fingerprint(spec.backend.name, spec.backend.device_name(index), spec.dtype)
        _process.fingerprints[key] = found
    return found


def _to_fp32(value: Any, device_type: str) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _LOW and device_type_of(value.device) == device_type:
        return value.float()
    return value


def _set_by_forward(enabled: bool, device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch's autocast state at a planned call of a recorded root is not the
    region's (on, in its dtype) nor one of this thread's float32 calls': the forward entered
    ``torch.autocast`` itself (``enabled=False``, another dtype)."""
    if enabled and torch.get_autocast_dtype(device_type) == dtype:
        return False
    return not any(frame.off is not None for frame in _local.frames)


def _pre(module: torch.nn.Module, args: tuple[Any, ...], late: Any = None) -> Any:
    if _dynamo_compiling() or _compiler._is_compiling_flag:  # first: dynamo folds it (no flag read)
        return None
    if module._forward_pre_hooks:  # (late: a thread's key, as its own last pre-hook: see defer)
        mine: Any = _deferral.key  # (torch types the dict as keyed by handle ids)
        if mine in module._forward_pre_hooks:
            if late is not mine:
                return None  # this thread's key as its own last pre-hook decides (or another's: not here)
        elif late is not None:  # another thread's (this thread's global one ran), or a copy's stray
            if type(late) is Stale:
                drop_strays(module)
            return None
        elif _deferral.direct(module, _pre, _roots_local.entered, _prog):  # called by a region call by call
            return None  # for its life: planned after its own pre-hooks from its next call (this one: O1)
    prog, stack = _prog, _thread.stack
    if not stack or prog.measuring:
        return None
    top = stack[-1]
    run = prog.run  # a program applies (its own instance hooks) unless the forward entered a region since
    if run is not None and top is run.region:
        return None
    rec = prog.rec
    if rec is None:
        if prog.settled is not None and top is prog.settled:
            return None  # a root of a region with programs: its own hooks decide
        if module._modules and top.spec.level == "auto":  # a region call by call for its life
            entered = _roots_local.entered  # (its entry's list, undone at its exit)
            if entered and entered[-1][0] is top and entered[-1][1] is None:
                _defer_children(module, _pre, entered[-1][2])  # children with pre-hooks: after them
    elif rec.stack and rec.stack[0][0] is module and len(rec.stack) == 1:
        return None  # the root being recorded: entered already
    ops = planned_ops(module)
    if ops is not None and (not float32_weights(module) or _tracing()):
        ops = None  # weights of another dtype (it cannot run in float32), torch.jit.trace: the O1 lists
    if rec is not None:  # the recording's stack of calls entered, and how many are planned
        rec.stack.append((module, ops is not None))
        rec.planned += ops is not None
    if ops is None:
        kind = known_kind(type(module))  # a class (or a class's flags: VARIES) met for the first time: a matmul kind?
        if (kind is PENDING or (kind is VARIES and variant_kind(module) is PENDING)) and not _tracing():
            _deciding.watch(module, top)
        return None
    spec = top.spec  # the innermost region: an enabled level="auto" one (not measuring: checked above)
    if spec.level != "auto" or not spec.enabled:
        return None
    device_type = spec.backend.device_type
    if (spec.custom_white or spec.custom_black) and ops & (spec.custom_white | spec.custom_black):
        return None
    enabled = _autocast_enabled(device_type)
    if (
        rec is not None
        and rec.mode is not None
        and not rec.outside
        and _set_by_forward(enabled, device_type, spec.dtype)
    ):
        rec.outside = True  # a float32 default could not tell the forward's autocast state from its own
    if not enabled:
        return None
    if in_checkpoint():  # its recompute runs with the autocast state of its entry, no hooks: so does this
        if rec is not None:
            rec.in_checkpoint(module)
        return None
    key = shape_class(module, args, device_type)
    if key is None:
        return None
    plan = plan_of(top)
    entry = plan.entries.get(key)  # plan.decision(key), inline
    decision = None if entry is None else entry.decision
    if rec is not None and rec.mode is not None:  # recorded (a call applied call by call notes nothing)
        costs = None if entry is None or decision != "fp32" else entry.costs
        rec.note(module, decision, 0.0 if costs is None else costs.low_ms - costs.fp32_ms, args, key)
    if plan.waits and key in plan.waits:  # provisional, measured here: due in a while (call by call)
        _heal.tick(plan, key, top)
    if plan.due and key in plan.due:  # provisional, due to be measured again (._heal)
        return _deciding.again(module, args, key, plan, top, decision, rec)
    if decision == "fp32":
        return _fp32(module, args, device_type, rec)
    if decision is None:
        _deciding.undecided(module, key, plan, top)
    return None


def defer(root: torch.nn.Module) -> list[torch.nn.Module]:
    """While ``root``'s call applies the plan through the global hooks, the modules inside
    it with forward pre-hooks of their own get :func:`_pre` as their last one, under this
    thread's key (:mod:`._deferral`).  Returns them, for :func:`undefer`."""
    return _defer(root, _pre)


def _fp32(module: torch.nn.Module, args: tuple[Any, ...], device_type: str, rec: Any) -> tuple[Any, ...]:
    """A call the plan runs in float32: autocast off for its forward (on again in
    :func:`_post`; it was on), its low-precision inputs cast to float32."""
    _set_autocast(device_type, False)
    _local.frames.append(_new_tuple(_Frame, (module, device_type, None, None, None)))
    if len(args) == 1:  # the common call: no generator
        one = args[0]
        if isinstance(one, torch.Tensor) and one.dtype in _LOW and device_type_of(one.device) == device_type:
            if rec is not None:
                rec.outside = True  # a low tensor reached it: a float32 default (no hook here) would not cast it
            return (one.float(),)
        return args
    cast = tuple(_to_fp32(a, device_type) for a in args)
    if rec is not None and any(c is not a for c, a in zip(cast, args, strict=True)):
        rec.outside = True  # as above
    return cast


def _post(module: torch.nn.Module, args: tuple[Any, ...], *rest: Any) -> Any:
    if _dynamo_compiling() or _compiler._is_compiling_flag or _prog.measuring:
        return None
    run = _prog.run  # as in _pre: an auto region the forward entered inside a program gets these hooks
    if run is not None and (not _thread.stack or _thread.stack[-1] is run.region):
        return None
    watches = _local.watches
    if watches and watches[-1].module is module:
        watch = watches.pop()
        if watched(watch, len(rest) == 2):
            watch.plan.changes += 1  # a planned kind new to the plan's programs: they record again
    frames = _local.frames
    output = None  # None: the output as the forward gave it
    if frames and frames[-1].module is module:
        _, off, key, plan, region = frames.pop()
        if off is not None:
            torch.set_autocast_enabled(off, True)
            if key is not None and len(rest) == 2:  # a float32 class measured again (._heal)
                _deciding.decide(module, args, rest[0], key, plan, region)
        elif len(rest) == 2:  # torch calls always-call hooks as (module, args, None) after an exception
            _deciding.decide(module, args, rest[0], key, plan, region)
            if plan.decision(key) == "fp32":  # it ran with the O1 lists: the dtype of later calls
                output = cast_floating(rest[1], torch.float32, region.spec.backend.device_type, low=True)
    rec = _prog.rec
    if rec is not None:  # the call on top of the recording's stack left (another was not entered here)
        stack = rec.stack
        if stack and stack[-1][0] is module:
            rec.planned -= stack.pop()[1]
            if not stack and module is rec.root:  # the root call ended
                rec.done(rec, args, rest[0] if len(rest) == 2 else None, len(rest) == 2)
    return output


#: ``os.environ``'s own dict and the budget's key in it: :func:`check` finds the variable unset
#: without ``Mapping.get``, which raises and catches a KeyError (0.6 us per region made)
_ENVIRON: Final = os.environ
_ENV_DATA: Final[dict[Any, Any] | None] = getattr(os.environ, "_data", None)
_BUDGET_KEY: Final = os.environ.encodekey(BUDGET_ENV) if _ENV_DATA is not None else None


def check() -> None:
    """A ``level="auto"`` region is being made: :func:`budget_s` raises for a bad budget."""
    if _ENV_DATA is not None and _BUDGET_KEY not in _ENV_DATA and os.environ is _ENVIRON:
        return  # unset: the default budget
    budget_s()


def acquire() -> None:
    """Register the global hooks if no region or recording of the process holds them."""
    with _process.lock:
        _process.active += 1
        if _process.active == 1:
            _process.handles = [
                register_module_forward_pre_hook(_pre),
                register_module_forward_hook(_post, with_kwargs=True, always_call=True),
            ]


def release() -> None:
    with _process.lock:
        _process.active = max(0, _process.active - 1)
        if _process.active == 0:
            for handle in _process.handles:
                handle.remove()
            _process.handles = []


def installed() -> bool:
    """Whether hooks of auto are registered now: the global ones or a region's (any thread)."""
    return bool(_process.handles) or bool(region_threads)
