"""Where ``level="auto"`` acts: two process-global module hooks that apply the plan.

``torch.nn.modules.module.register_module_forward_pre_hook`` / ``..._forward_hook`` are
installed once per process, by the first use of ``level="auto"`` (``check_level``), and never removed (like
ampcore's dispatcher kernels).  While installed, every ``nn.Module`` call in the process
takes torch's hook path (a few microseconds); the hooks return at once unless the calling
thread's innermost ampcore region is an enabled ``level="auto"`` region and the module is a
planned kind (:data:`ampcore._auto._shapes.PLANNED_OPS`).  Then, by the plan's decision for
the call's shape class:

* ``"low"``: nothing; the region's O1 lists run it in low precision (black-list ops in
  float32, exactly as O1);
* ``"fp32"``: autocast is switched off for the module's forward (``torch.autocast(...,
  enabled=False)``) and its low-precision floating inputs are cast to float32;
* no decision yet: the call runs with the O1 lists, then the forward hook takes the costs
  from the adapter's ``ampcore_auto_costs`` hook or measures it
  (:func:`ampcore._auto._costs.measure`) within the process's warm-up budget
  (``AMPCORE_AUTO_BUDGET`` seconds, default 10) and records the decision.

Custom lists win: a module whose ops a region's custom list names is left to the lists.
Inside ``torch.compile``d code the hooks do nothing (the O1 lists apply).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Final, NamedTuple

import torch

from .._backends.memory import synchronize
from .._errors import AmpcoreError, AmpcoreWarning, warn_user
from .._policy.thread_state import thread_state
from .._validate import check_real
from ._costs import Costs, measure
from ._plan import AutoPlan, cache_file, current_plan, fingerprint, write_cache
from ._shapes import planned_ops, shape_class

__all__ = ["BUDGET_ENV", "install", "installed", "uninstall"]

#: Environment variable: seconds of measurement a process may spend (default 10).
BUDGET_ENV: Final = "AMPCORE_AUTO_BUDGET"
_PER_CLASS_MS: Final = 400.0
_LOW: Final = (torch.bfloat16, torch.float16)

_thread = thread_state()
_is_compiling = torch.compiler.is_compiling


class _Frame(NamedTuple):
    """A planned module's forward in progress: either run in float32 with ``off`` (a
    ``torch.autocast(enabled=False)`` to exit), or measured for the shape class ``key``."""

    module: torch.nn.Module
    off: Any  # the entered torch.autocast(enabled=False), or None
    key: Any  # the shape class being measured, or None
    plan: Any  # the AutoPlan that records the measurement, or None
    region: Any  # the region's spec, or None


class _Local(threading.local):
    def __init__(self) -> None:
        self.frames: list[_Frame] = []
        self.measuring = False


class _Process:
    """The hooks' handles, the warm-up budget and the fingerprint cache (process-wide)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handles: list[Any] = []
        self.spent_s = 0.0
        self.warned = False
        self.exhausted_warned = False
        self.fingerprints: dict[tuple[Any, ...], dict[str, Any]] = {}


_local = _Local()
_process = _Process()


def _budget_s() -> float:
    try:
        return max(0.0, float(os.environ.get(BUDGET_ENV, "10")))
    except ValueError:
        return 10.0


def _fingerprint(region: Any) -> dict[str, Any]:
    spec = region.spec
    index = getattr(region.owner, "device_index", None) or 0
    key = (spec.backend.name, index, spec.dtype, torch.get_num_threads())
    found = _process.fingerprints.get(key)
    if found is None:
        found = fingerprint(spec.backend.name, spec.backend.device_name(index), spec.dtype)
        _process.fingerprints[key] = found
    return found


def _auto_region() -> Any:
    stack = _thread.stack
    if not stack:
        return None
    region = stack[-1]
    spec = region.spec
    if spec.level != "auto" or not spec.enabled or _local.measuring:
        return None
    return region


def _to_fp32(value: Any, device_type: str) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _LOW and value.device.type == device_type:
        return value.float()
    return value


def _pre(module: torch.nn.Module, args: tuple[Any, ...]) -> Any:
    if _is_compiling() or not _thread.stack:  # dynamo folds is_compiling(): nothing traced
        return None
    ops = planned_ops(module)
    if ops is None:
        return None
    region = _auto_region()
    if region is None:
        return None
    spec = region.spec
    device_type = spec.backend.device_type
    if ops & (spec.custom_white | spec.custom_black) or not torch.is_autocast_enabled(device_type):
        return None
    key = shape_class(module, args, device_type)
    if key is None:
        return None
    plan = current_plan(_fingerprint(region))
    decision = plan.decision(key)
    if decision is None:
        if not plan.frozen and _process.spent_s < _budget_s():
            _local.frames.append(_Frame(module, None, key, plan, region))
        return None
    if decision == "low":
        return None
    off = torch.autocast(device_type, enabled=False)
    off.__enter__()
    _local.frames.append(_Frame(module, off, None, None, None))
    return tuple(_to_fp32(a, device_type) for a in args)


def _post(module: torch.nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
    if _is_compiling():
        return
    frames = _local.frames
    if not frames or frames[-1].module is not module:
        return
    _, off, key, plan, region = frames.pop()
    if off is not None:
        off.__exit__(None, None, None)
        return
    if len(rest) != 2:  # torch calls always-call hooks as (module, args, None) after an exception
        return
    _measure(module, args, rest[0], key, plan, region)


def _measure(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], key: str, plan: AutoPlan, region: Any
) -> None:
    spec = region.spec
    if plan.decision(key) is not None:
        return
    given = adapter_costs(spec.backend, key, spec.dtype)
    if given is not None:
        plan.set(key, given, source="adapter")
        write_cache(plan)
        return
    left_ms = (_budget_s() - _process.spent_s) * 1e3
    if left_ms <= 0:
        return
    _warn_once(spec, plan)
    start = time.perf_counter()
    _local.measuring = True
    try:
        costs = measure(
            module, args, kwargs, spec.backend.device_type, spec.dtype,
            lambda: synchronize(spec.backend), budget_ms=min(_PER_CLASS_MS, left_ms),
        )
    finally:
        _local.measuring = False
        with _process.lock:
            _process.spent_s += time.perf_counter() - start
    plan.set(key, costs)
    write_cache(plan)
    if _process.spent_s >= _budget_s() and not _process.exhausted_warned:
        _process.exhausted_warned = True
        warn_user(
            f"ampcore.autocast(level='auto'): the warm-up budget of {_budget_s():g} s "
            f"({BUDGET_ENV}) is spent; shape classes not measured yet run with the O1 lists",
            AmpcoreWarning,
        )


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
            f"'fp32_ms', 'low_ms' and optionally 'cast_ms' (numbers); {type(exc).__name__}: {exc}",
            backend.distribution,
        ) from None


def _warn_once(spec: Any, plan: AutoPlan) -> None:
    if _process.warned:
        return
    _process.warned = True
    where = cache_file(plan.fingerprint)
    warn_user(
        "ampcore.autocast(level='auto'): measuring the costs of new shape classes; calls of a class "
        f"run with the O1 lists until it is measured (at most {_budget_s():g} s in all, {BUDGET_ENV}). "
        + (f"Decisions are cached in {where}." if where else "The disk cache is off (AMPCORE_AUTO_CACHE).")
        + " See ampcore.debugging.auto_plan_table().",
        AmpcoreWarning,
    )


def install() -> None:
    """Install the two global module hooks (once per process; thread-safe)."""
    if _process.handles:
        return
    with _process.lock:
        if not _process.handles:
            from torch.nn.modules.module import (
                register_module_forward_hook,
                register_module_forward_pre_hook,
            )

            _process.handles = [
                register_module_forward_pre_hook(_pre),
                register_module_forward_hook(_post, with_kwargs=True, always_call=True),
            ]


def installed() -> bool:
    """Whether the hooks are installed in this process."""
    return bool(_process.handles)


def uninstall() -> None:
    """Remove the hooks (for benchmarks that time other modes without them; the next
    ``level="auto"`` region does not reinstall them: call :func:`install`)."""
    with _process.lock:
        for handle in _process.handles:
            handle.remove()
        _process.handles = []
