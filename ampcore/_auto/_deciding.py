"""The call-by-call path's undecided classes: measure one shape class and decide it; watch
the first call of a class that may be a planned kind (:mod:`._kinds`).

A planned module call whose shape class the plan lacks runs with the O1 lists
(:func:`undecided` notes it); after its forward, :func:`decide` takes the costs from the
adapter's ``ampcore_auto_costs`` hook (:func:`adapter_costs`) or measures the call
(:func:`ampcore._auto._measure.measure`, with the adapter's clock) within the process's
warm-up budget (:func:`._hooks.budget_s`).  A figure the plausibility checks flag is
measured again before it decides, and a cached neighbour it contradicts is dropped.  The
process's state (budget spent, clocks, warnings given) is :mod:`._hooks`' (read through
the module, so tests that replace its clock or budget reach this path too).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Final

import torch

from .._errors import AmpcoreError, AmpcoreWarning, warn_user
from .._validate import check_real
from . import _hooks
from ._cache import cache_file, write_cache
from ._costs import Costs, merge
from ._guard import in_transform
from ._heal import MAX_HEAL, marked, renewed, wait
from ._hostclock import exposure
from ._kinds import Watch, candidate
from ._measure import Clock, measure
from ._plan import AutoPlan
from ._program import local as _prog
from ._shapes import set_kind
from ._twins import torch_kwargs

__all__ = ["adapter_costs", "again", "decide", "measure_now", "undecided", "warn_once", "warn_untimed", "watch"]

#: the most one class's measurement may take (ms; less when the budget is nearly spent)
_PER_CLASS_MS: Final = 400.0


def undecided(module: torch.nn.Module, key: str, plan: AutoPlan, region: Any) -> None:
    """A call of a class the plan lacks: runs with the O1 lists, measured by :func:`_post`
    within the budget."""
    if not plan.frozen and _hooks._process.spent_s < _hooks.budget_s() and not in_transform():  # (torch.func: later)
        if _hooks._clock(region) is None:
            warn_untimed(region.spec)
        else:
            _hooks._local.frames.append(_hooks._Frame(module, None, key, plan, region))


def measure_now(module: torch.nn.Module, args: tuple[Any, ...], key: str, plan: AutoPlan, region: Any) -> Any:
    """A program's guard met ``key``, a class the plan lacks (a data-dependent path or row
    count): measure it before the call, within the budget, and return its decision (None:
    not measured).  Before, the guard only made the root's next call record, and that call,
    routed otherwise (the next batch of a mixture of experts), did not meet the class: it
    was never measured, a recording each time it came back.  The call's keyword arguments
    come from torch's call frame (the guard is given the positional ones only)."""
    if plan.frozen or _hooks._process.spent_s >= _hooks.budget_s() or in_transform() or _hooks._clock(region) is None:
        return None
    kwargs = torch_kwargs(sys._getframe(2))  # torch's closure calling the pre-hooks <- the guard <- here
    if kwargs is None:
        return None
    decide(module, args, kwargs, key, plan, region)
    return plan.decision(key)


def decide(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], key: str, plan: AutoPlan, region: Any
) -> None:
    spec = region.spec
    entry = plan.entries.get(key)
    if (entry is not None and key not in plan.due) or key in plan.unmeasurable:
        return
    plan.due.discard(key)
    if entry is not None:  # a provisional class measured again (._heal)
        plan.healed[key] = plan.healed.get(key, 0) + 1
    elif (given := adapter_costs(spec.backend, key, spec.dtype)) is not None:
        plan.set(key, given, source="adapter")
        write_cache(plan)
        return
    clock = _hooks._clock(region)
    if clock is None or _hooks.budget_s() <= _hooks._process.spent_s:
        return
    warn_once(spec, plan)
    short = (
        _hooks.budget_s() - _hooks._process.spent_s
    ) * 1e3 < _PER_CLASS_MS  # the process's budget bounds this class
    load, exposed = _hooks.load_of(region), exposure(clock)
    try:
        costs = _measure(module, args, kwargs, spec, clock)
        if plan.suspect(key, costs) is not None and _hooks.budget_s() > _hooks._process.spent_s:
            costs = merge(costs, _measure(module, args, kwargs, spec, clock))  # the lower median per side
    except AmpcoreError:  # ours or a plugin's (a bad adapter clock): said as it is
        raise
    except Exception as exc:  # a side that cannot run here: the O1 lists run it, as torch.autocast
        if entry is not None:  # measured before (a provisional class due again): kept, not measured again
            plan.healed[key] = MAX_HEAL
        else:
            _unmeasurable(key, plan, exc)
        return
    after = _hooks.load_of(region)
    shielded = exposed is not None and exposure(clock) == exposed  # no run counted that other work could lengthen
    costs = marked(costs, after if load is None else load if after is None else max(load, after), shielded=shielded)
    if costs.runs >= 2 or not short:  # one round because the budget ran out: no decision (O1 lists), measured later
        if entry is not None and entry.costs is not None:  # measured again: replaces it unless noisier
            plan.renew(key, renewed(entry.costs, costs, here=entry.source != "cache"))
        else:
            plan.set(key, costs)
        wait(plan, key)  # provisional still: measured again in a while (call by call; programs: ._heal.Heal)
        for other, theirs in list(plan.neighbours(key)):  # a later measurement replaces an outlier
            if plan.entries[other].source in ("cache", "measured") and plan.suspect(other, theirs) is not None:
                plan.drop(other)
        write_cache(plan)
    if _hooks._process.spent_s >= _hooks.budget_s() and not _hooks._process.exhausted_warned:
        _hooks._process.exhausted_warned = True
        warn_user(
            f"ampcore.autocast(level='auto'): the warm-up budget of {_hooks.budget_s():g} s "
            f"({_hooks.BUDGET_ENV}) is spent; shape classes not measured yet run with the O1 lists",
            AmpcoreWarning,
        )


def _unmeasurable(key: str, plan: AutoPlan, exc: Exception) -> None:
    """A class whose measurement raised (a side the call cannot run in: a weight computed in
    low precision under the region, as ``nn.utils.parametrize.cached()`` keeps it, given a
    float32 input): not measured again in this process, it runs with the O1 lists (the
    call the user made ran so, and did not raise); warned once per class."""
    plan.unmeasurable.add(key)
    warn_user(
        f"ampcore.autocast(level='auto'): the shape class {key} could not be measured "
        f"({type(exc).__name__}: {exc}); it runs with the O1 lists, as torch.autocast",
        AmpcoreWarning,
    )


def again(
    module: torch.nn.Module, args: tuple[Any, ...], key: str, plan: AutoPlan, region: Any, decision: Any, rec: Any
) -> Any:
    """A call of ``key``, a provisional class due to be measured again (:mod:`._heal`): it
    runs as decided (what :func:`._hooks._pre` returns) and is measured after its forward;
    where nothing can be measured it is no longer due in this process."""
    if decision is None:  # (dropped meanwhile: a first measurement)
        undecided(module, key, plan, region)
        return None
    if not _hooks.can_measure(region, plan):
        plan.due.discard(key)
        plan.healed[key] = MAX_HEAL
        return _hooks._fp32(module, args, region.spec.backend.device_type, rec) if decision == "fp32" else None
    if decision == "fp32":  # autocast off for its forward; on again, and measured, after it
        found = _hooks._fp32(module, args, region.spec.backend.device_type, rec)
        _hooks._local.frames[-1] = _hooks._Frame(module, region.spec.backend.device_type, key, plan, region)
        return found
    _hooks._local.frames.append(_hooks._Frame(module, None, key, plan, region))
    return None


def _measure(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], spec: Any, clock: Clock) -> Costs:
    left_ms = (_hooks.budget_s() - _hooks._process.spent_s) * 1e3
    start = time.perf_counter()
    _prog.measuring = True
    try:
        return measure(
            module, args, kwargs, spec.backend.device_type, spec.dtype, clock, budget_ms=min(_PER_CLASS_MS, left_ms)
        )
    finally:
        _prog.measuring = False
        with _hooks._process.lock:
            _hooks._process.spent_s += time.perf_counter() - start


def adapter_costs(backend: Any, key: str, dtype: torch.dtype) -> Costs | None:
    """The costs the backend's ``ampcore_auto_costs`` hook gives for ``key`` (None: measure)."""
    hook = backend.hook("ampcore_auto_costs")
    if hook is None:
        return None
    raw = hook(shape_class=key, dtype=dtype)
    if raw is None:
        return None
    try:  # finite, non-negative numbers (nan or "a" would decide every class wrongly)
        values = {"fp32_ms": raw["fp32_ms"], "low_ms": raw["low_ms"], "cast_ms": raw.get("cast_ms", 0.0)}
        checked = [check_real("ampcore_auto_costs()", k, v, low=0.0, entry=True) or 0.0 for k, v in values.items()]
        return Costs(checked[0], checked[1], checked[2])
    except (KeyError, TypeError, ValueError, AttributeError, AmpcoreError) as exc:
        from .._errors import PluginError

        raise PluginError(
            backend.plugin_name,
            f"ampcore_auto_costs() returned {raw!r} for {key!r}: expected None or a mapping with "
            f"'fp32_ms', 'low_ms' and optionally 'cast_ms' (finite numbers); {exc}",
            backend.distribution,
        ) from None


def warn_once(spec: Any, plan: AutoPlan) -> None:
    if _hooks._process.warned:
        return
    _hooks._process.warned = True
    where = cache_file(plan.fingerprint)
    warn_user(
        "ampcore.autocast(level='auto'): measuring the costs of new shape classes; calls of a class "
        f"run with the O1 lists until it is measured (at most {_hooks.budget_s():g} s in all, {_hooks.BUDGET_ENV}). "
        + (f"Decisions are cached in {where}." if where else "The disk cache is off (AMPCORE_AUTO_CACHE).")
        + " See ampcore.debugging.auto_plan_table().",
        AmpcoreWarning,
    )


def warn_untimed(spec: Any) -> None:
    name = spec.backend.name
    if name in _hooks._process.untimed_warned:
        return
    _hooks._process.untimed_warned.add(name)
    warn_user(
        f"ampcore.autocast(level='auto'): the {name!r} device can be neither timed with events nor "
        "synchronised (no ampcore_synchronize hook, not torch's current accelerator): nothing is "
        "measured, and level='auto' runs as torch.autocast (the O1 lists) there",
        AmpcoreWarning,
    )


def watch(module: torch.nn.Module, region: Any) -> None:
    """The first call of a class not planned by its type in an enabled auto region: watch
    its ops (:mod:`._kinds`; a class that cannot be a matmul kind is settled at once)."""
    spec = region.spec
    if spec.level != "auto" or not spec.enabled or in_transform():
        return  # watched at a call in an auto region
    if not candidate(module):
        set_kind(type(module), None)  # (per class: no matrix of its own, whatever its flags)
        return
    watch = Watch(module)
    watch.plan = _hooks.plan_of(region)
    watch.__enter__()  # type: ignore[no-untyped-call]
    _hooks._local.watches.append(watch)
