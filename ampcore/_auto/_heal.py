"""Class decisions that heal: a shape class measured busy or noisy is *provisional* and is
measured again, in a later process and later in this one.

Whole-call verdicts have had this since the tenth stop (:mod:`._checks`, :mod:`._again`);
a class decision was decided once and cached for good unless its figures were implausible
(:func:`~._costs.implausible`).  Now a class's :class:`~._costs.Costs` carry the adapter's
``load`` while measured and the count of ``checks``, and are ``provisional``
(:func:`provisional`) when

* *busy*: the adapter reported other work keeping more than half the device busy
  (:data:`~._checks.BUSY_LOAD`, the whole-call rule), or
* *noisy*: the runs spread over :data:`~._checks.NOISY_SPREAD` and the two sides lie
  closer than twice that spread (one run's noise could have made the decision; a wide gap
  decides whatever the spread), or more than a third of the timed rounds were left out as
  hit by other work (:mod:`._spikes`: a side's own spikes stay in where they are more than a
  third of its runs, so more left out means both sides were hit in turn: a noisy period),

and fewer than :data:`~._checks.MAX_CHECKS` measurements were made.  A provisional class is
measured again:

* *in a later process*: an entry read from the disk cache provisional is measured again at
  its first call there (:meth:`~._plan.AutoPlan.due`), whatever the load, within the budget;
  the measurement counts (final after :data:`~._checks.MAX_CHECKS`);
* *in this process*: a program whose recording ran a provisional class gets a
  :class:`Heal` cell as its ``stale`` flag (programs of settled classes keep their plain cell:
  their settled path is unchanged).  Every :data:`~._again.CALLS` settled root calls it
  reads the clock; once :data:`~._again.AFTER_S` seconds have passed, while the adapter does
  not report the device busy (else it looks again, :data:`~._again.MAX_LOOKS` times) and
  less than :data:`~._again.SPARE` of the budget is spent, the root records again and its
  provisional classes are measured again after their calls (run as decided meanwhile), at
  most :data:`MAX_HEAL` times per class and process; a measurement here never makes a class
  final by the count (a later, quieter process still measures it).

The new figures replace the old (:func:`renewed`) unless they are provisional too and spread
more; a changed decision makes every program record again (the plan's ``changes``), the same
decision does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Final

from ._again import AFTER_S, CALLS
from ._checks import BUSY_LOAD, MAX_CHECKS, NOISY_SPREAD
from ._costs import Costs
from ._plan import AutoPlan, Stale

__all__ = ["MAX_HEAL", "Heal", "cell", "healable", "marked", "noisy", "provisional", "renewed"]

#: measurements again of one class in one process (each within the process's budget)
MAX_HEAL: Final = 2
_now = time.perf_counter  # (tests replace it)


def noisy(costs: Costs) -> bool:
    """Whether a class measurement was too noisy to trust: its runs spread over
    :data:`~._checks.NOISY_SPREAD` and its two sides lie within twice that spread of each
    other, or more than a third of its timed rounds were left out as spikes (at 7 rounds: 3).

    Example::

        >>> noisy(Costs(1.0, 1.2, 0.1, fp32_spread=0.3, runs=7))   # 20% apart, runs spread 30%
        True
        >>> noisy(Costs(1.0, 0.4, 0.1, fp32_spread=0.25, runs=7))  # 60% apart: clear anyway
        False
        >>> noisy(Costs(1.0, 1.01, 0.1, fp32_spread=0.02, runs=7)) # a quiet tie
        False
        >>> noisy(Costs(1.0, 0.5, 0.1, runs=5, spikes=2)), noisy(Costs(1.0, 0.5, 0.1, runs=4, spikes=3))
        (False, True)
    """
    spread = max(costs.fp32_spread, costs.low_spread)
    close = spread > NOISY_SPREAD and abs(costs.ratio - 1.0) <= 2 * spread
    return close or 3 * costs.spikes > costs.runs + costs.spikes


def provisional(costs: Costs, load: float | None, checks: int) -> bool:
    """Whether a class measured as ``costs`` at ``load`` (the adapter's; None: not said), its
    ``checks``-th measurement, is to be measured again (busy or :func:`noisy`; figures not
    timed here, ``runs`` 0, never are).

    Example::

        >>> quiet = Costs(1.0, 0.5, 0.1, runs=7)
        >>> provisional(quiet, 0.1, 1), provisional(quiet, 2.0, 1), provisional(quiet, 2.0, MAX_CHECKS)
        (False, True, False)
    """
    busy = load is not None and load > BUSY_LOAD
    return costs.runs > 0 and checks < MAX_CHECKS and (busy or noisy(costs))


def marked(costs: Costs, load: float | None, checks: int = 1) -> Costs:
    """``costs`` with the ``load`` it was measured at, its count and its provisional mark."""
    return replace(costs, load=load, checks=checks, provisional=provisional(costs, load, checks))


def renewed(old: Costs, new: Costs, here: bool) -> Costs:
    """What a class measured again keeps: ``new`` unless it is provisional too and spreads
    more than ``old``; one more measurement counted.  ``here``: ``old`` was measured in this
    process, which never makes a class final by the count (a later process measures it).

    Example::

        >>> busy = marked(Costs(1.0, 1.3, 0.1, low_spread=0.3, runs=7), 2.0)
        >>> quiet = marked(Costs(1.0, 0.6, 0.1, low_spread=0.02, runs=7), 0.1)
        >>> kept = renewed(busy, quiet, here=True)
        >>> kept.low_ms, kept.checks, kept.provisional
        (0.6, 2, False)
        >>> kept = renewed(renewed(busy, busy, here=True), busy, here=True)
        >>> kept.checks, kept.provisional    # busy again: not final here
        (2, True)
        >>> renewed(renewed(busy, busy, here=False), busy, here=False).provisional  # three processes: final
        False
    """
    spread = max(new.fp32_spread, new.low_spread)
    best = new if not new.provisional or spread <= max(old.fp32_spread, old.low_spread) else old
    checks = old.checks + 1
    if here and new.provisional:
        checks = min(checks, MAX_CHECKS - 1)
    return replace(best, checks=checks, provisional=provisional(best, best.load, checks))


def healable(plan: AutoPlan, key: str) -> bool:
    """Whether ``key``'s class is provisional and may still be measured again in this process
    (measured here or read from the disk cache: a plan file's figures stay as loaded)."""
    entry = plan.entries.get(key)
    costs = None if entry is None or entry.source not in ("measured", "cache") else entry.costs
    return costs is not None and costs.provisional and plan.healed.get(key, 0) < MAX_HEAL


def cell(plan: AutoPlan, keys: Iterable[str], region: Any, can_measure: bool) -> Stale:
    """The ``stale`` cell of a program whose recording ran the classes ``keys``: a
    :class:`Heal` where some are provisional and may be measured again here, else a plain one."""
    found = [key for key in dict.fromkeys(keys) if healable(plan, key)] if can_measure and not plan.frozen else []
    return Heal(plan, found, region) if found else Stale([False])


class Heal(Stale):
    """A program's ``stale`` cell while classes it ran are provisional: true once set (a
    module collected, a class added) or once they are due to be measured again (the root
    then records, and its recording measures them: :meth:`~._plan.AutoPlan.due`)."""

    __slots__ = ("at", "keys", "left", "looks", "plan", "region")

    def __init__(self, plan: AutoPlan, keys: list[str], region: Any) -> None:
        super().__init__([False])
        self.plan, self.keys, self.region = plan, keys, region
        self.left, self.at, self.looks = CALLS, _now(), 0

    def __getitem__(self, index: Any) -> Any:
        if _get(self, 0):
            return True
        self.left -= 1
        if self.left > 0:
            return False
        self.left = CALLS
        return _now() - self.at >= AFTER_S and self._due()

    def _due(self) -> bool:
        """Due: mark the classes to measure again (or, busy, look again later; busy for good,
        no budget to spare: given up in this process) and record again."""
        from . import _hooks
        from ._again import MAX_LOOKS, _spare

        plan = self.plan
        keys = [key for key in self.keys if healable(plan, key)]
        if keys and not plan.frozen and _spare():
            load = _hooks.load_of(self.region)
            if load is not None and load > BUSY_LOAD and self.looks + 1 < MAX_LOOKS:
                self.looks, self.at = self.looks + 1, _now()  # a measurement now would be provisional again
                return False
            if load is None or load <= BUSY_LOAD:
                plan.due.update(keys)
                keys = []
        for key in keys:  # not measured again in this process: the recording gives a plain cell
            plan.healed[key] = MAX_HEAL
        _set(self, 0, True)  # record again (the classes due are measured there)
        return True


_get: Final = list.__getitem__
_set: Final = list.__setitem__
