"""``level="auto"``: a measured cost model picks float32 or low precision per module call
and shape class.

Modules:

* :mod:`._shapes`: which module kinds are planned, and their shape classes;
* :mod:`._costs`: :class:`Costs`, the pure :func:`decide` and the plausibility checks;
* :mod:`._measure`: the micro-benchmarks (warmed, interleaved, medians and spread) and the
  adapter's clock;
* :mod:`._plan`: :class:`AutoPlan` (export, load, table), checked when read;
* :mod:`._cache`: this process's plans and the disk cache that heals;
* :mod:`._hooks`: the global module hooks that apply a plan, registered while a
  ``level="auto"`` region is active;
* :mod:`._roots`, :mod:`._program`, :mod:`._guard`: a root call's program, and the guard
  that decides when a later call may run it;
* :mod:`._entered`: a ``torch.autocast`` a forward enters inside a float32-default program;
* :mod:`._castcache`: autocast's weight cache around the whole-call check's runs.

See docs/auto.md.
"""

from __future__ import annotations

import torch

from .._backends.registry import DeviceLike, resolve_device
from .._backends.support import resolve_dtype
from .._policy.level_hooks import register_level_hooks
from . import _roots
from ._cache import current_plan
from ._costs import MARGIN, Costs, Decision, decide
from ._load import load_plan
from ._plan import AutoPlan, PlanEntry, fingerprint

__all__ = ["MARGIN", "AutoPlan", "Costs", "Decision", "PlanEntry", "auto_plan", "decide", "load_plan"]

register_level_hooks("auto", _roots)  # ampcore.autocast(level="auto") calls them


def auto_plan(device: DeviceLike = None, dtype: torch.dtype | str | None = None) -> AutoPlan:
    """This process's ``level="auto"`` plan for a backend and dtype (the one its regions use;
    read from the disk cache the first time, empty when nothing was measured).

    Example::

        >>> import ampcore
        >>> plan = ampcore.auto_plan("cpu")
        >>> plan.fingerprint["dtype"]
        'bfloat16'
        >>> print(plan.table().splitlines()[1].split()[:2])
        ['shape', 'class']
    """
    from .._dtypes import parse_dtype

    resolved = resolve_device(device)
    backend = resolved.backend
    wanted = None if dtype is None else parse_dtype(dtype, "ampcore.auto_plan")
    checked = resolve_dtype(backend, wanted, resolved.index, "ampcore.auto_plan")
    return current_plan(fingerprint(backend.name, backend.device_name(resolved.index or 0), checked))
