"""Class decisions that heal: a shape class measured busy or noisy is *provisional* and is
measured again, in a later process and later in this one.

Whole-call verdicts have had this since the tenth stop (:mod:`._checks`, :mod:`._again`);
a class decision was decided once and cached for good unless its figures were implausible
(:func:`~._costs.implausible`).  Now a class's :class:`~._costs.Costs` carry the adapter's
``load`` while measured and the count of ``checks``, and are ``provisional``
(:func:`provisional`) when

* *busy*: the adapter reported other work keeping more than half the device busy
  (:data:`~._checks.BUSY_LOAD`, the whole-call rule) and either the clock could see that
  work (the wall clock with no count of waits, device events, a clock that cannot tell) or
  the two sides lie within twice their runs' spread (:func:`close`).  A clock that leaves other work's time out of
  every run it counted (:func:`~._hostclock.exposure` unchanged over the measurement: a
  thread's CPU time with one intra-op thread, or runs pre-empted timed again and one try
  clean) measured figures the load did not reach unless their own spread says so; before,
  on a machine busy for good every class was provisional and the next two processes
  measured every class again, for nothing (the fourteenth stop);
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
* *in this process*, at most :data:`MAX_HEAL` (once) per class: a program whose recording
  ran a provisional class gets a :class:`Heal` cell as its ``stale`` flag (programs of
  settled classes keep their plain cell: their settled path is unchanged), shared by the
  copies that adopt it (:func:`portable`, :mod:`._twins`: a fresh copy per step heals too);
  a class applied call by call (a root with no program) counts down per class
  (:func:`wait`, :func:`tick`, from :func:`._hooks._pre`).  Every :data:`~._again.CALLS`
  calls it reads the clock; once :data:`~._again.AFTER_S` seconds have passed, while the
  adapter does not report the device busy or the clock leaves other work out (else it
  looks again, :data:`~._again.MAX_LOOKS` times) and less than :data:`~._again.SPARE` of
  the budget is spent, the classes due are measured again after their calls (run as
  decided meanwhile; a program's root records again for them), *paced*: as many as fit in
  :data:`STEP_MS` of estimated measuring (:func:`estimate_ms`) per root call and window of
  :data:`~._again.AFTER_S`, one at least; the others wait for the next window (before: all
  of a root's classes in one call, one very slow step on a large model).  A measurement
  here never makes a class final by the count (a later, quieter process still measures it)
  and its time is the process's budget's (:func:`._deciding._measure`).

The new figures replace the old (:func:`renewed`) unless they are provisional too and spread
more; a changed decision makes every program record again (the plan's ``changes``), the same
decision does not.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from ._again import AFTER_S, CALLS
from ._checks import BUSY_LOAD, MAX_CHECKS, NOISY_SPREAD
from ._costs import Costs
from ._plan import AutoPlan, Stale

if TYPE_CHECKING:
    from ._program import Program

__all__ = [
    "MAX_HEAL",
    "STEP_MS",
    "Heal",
    "Waits",
    "cell",
    "close",
    "estimate_ms",
    "healable",
    "marked",
    "noisy",
    "portable",
    "provisional",
    "quiet",
    "renewed",
    "tick",
    "wait",
]

#: measurements again of one class in one process (within the process's budget): one; a class
#: still noisy then is left to a later process
MAX_HEAL: Final = 1
#: estimated milliseconds of measurements again one root call (or one :data:`~._again.AFTER_S`
#: window) may start: more classes due wait for the next (at least one class each)
STEP_MS: Final = 200.0
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
    return (_spread(costs) > NOISY_SPREAD and close(costs)) or 3 * costs.spikes > costs.runs + costs.spikes


def close(costs: Costs) -> bool:
    """Whether the two sides lie within twice the spread of their runs of each other (the
    runs' noise could have made the decision).

    Example::

        >>> close(Costs(1.0, 0.95, 0.0, fp32_spread=0.04)), close(Costs(1.0, 0.6, 0.0, low_spread=0.13))
        (True, False)
    """
    return abs(costs.ratio - 1.0) <= 2 * _spread(costs)


def _spread(costs: Costs) -> float:
    return max(costs.fp32_spread, costs.low_spread)


def provisional(costs: Costs, load: float | None, checks: int, shielded: bool = False) -> bool:
    """Whether a class measured as ``costs`` at ``load`` (the adapter's; None: not said), its
    ``checks``-th measurement, is to be measured again: :func:`noisy`, or *busy*: the load
    over :data:`~._checks.BUSY_LOAD` while the clock could see other work (the wall clock,
    events), or, ``shielded`` (the clock left other work's time out of every run counted:
    a thread's CPU time, runs pre-empted timed again), while the sides are :func:`close`
    (within twice their spread, however small: under load the spread is what the load
    left in the figures).  Figures not timed here (``runs`` 0) never are.

    Example::

        >>> clear = Costs(1.0, 0.5, 0.1, runs=7, low_spread=0.08)
        >>> provisional(clear, 0.1, 1), provisional(clear, 2.0, 1), provisional(clear, 2.0, MAX_CHECKS)
        (False, True, False)
        >>> tie = Costs(1.0, 0.95, 0.1, runs=7, low_spread=0.04)
        >>> provisional(clear, 2.0, 1, shielded=True), provisional(tie, 2.0, 1, shielded=True), provisional(tie, 0.1, 1)
        (False, True, False)
    """
    busy = load is not None and load > BUSY_LOAD and (not shielded or close(costs))
    return costs.runs > 0 and checks < MAX_CHECKS and (busy or noisy(costs))


def marked(costs: Costs, load: float | None, checks: int = 1, shielded: bool = False) -> Costs:
    """``costs`` with the ``load`` it was measured at, its count and its provisional mark."""
    mark = provisional(costs, load, checks, shielded)
    return replace(costs, load=load, checks=checks, provisional=mark)


def renewed(old: Costs, new: Costs, here: bool) -> Costs:
    """What a class measured again keeps: ``new`` unless it is provisional too and spreads
    more than ``old``; one more measurement counted (final at :data:`~._checks.MAX_CHECKS`).
    ``here``: ``old`` was measured in this process, which never makes a class final by the
    count (a later process measures it).

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
    return replace(best, checks=checks, provisional=best.provisional and checks < MAX_CHECKS)


def healable(plan: AutoPlan, key: str) -> bool:
    """Whether ``key``'s class is provisional and may still be measured again in this process
    (measured here or read from the disk cache: a plan file's figures stay as loaded)."""
    entry = plan.entries.get(key)
    costs = None if entry is None or entry.source not in ("measured", "cache") else entry.costs
    return costs is not None and costs.provisional and plan.healed.get(key, 0) < MAX_HEAL


def estimate_ms(costs: Costs | None) -> float:
    """What measuring a class again takes, about (ms): its timed rounds, the left-out ones and
    a warm-up, of both sides, at most one class's share of the budget.

    Example::

        >>> estimate_ms(Costs(2.0, 1.0, 0.1, runs=7)), estimate_ms(Costs(30.0, 20.0, 0.1, runs=7))
        (27.0, 400.0)
    """
    from ._deciding import _PER_CLASS_MS

    if costs is None:
        return _PER_CLASS_MS
    return min(_PER_CLASS_MS, (costs.runs + costs.spikes + 2) * (costs.fp32_ms + costs.low_ms))


class Waits(dict[str, list[Any]]):
    """A plan's classes measured provisional in this process, each ``[calls left, since,
    looks]`` (:func:`tick`: a root applied call by call), and the pace of measurements
    again: ``at`` the window's start, ``used_ms`` the estimated milliseconds started in it."""

    at: float = float("-inf")
    used_ms: float = 0.0


def _waits(plan: AutoPlan) -> Waits:
    waits = plan.waits
    if waits is None:
        waits = plan.waits = Waits()
    return waits  # type: ignore[no-any-return]


def wait(plan: AutoPlan, key: str) -> None:
    """``key``'s class was just measured provisional here: a call of it applied call by call
    (no program, so no :class:`Heal` cell) counts down to its measurement again (:func:`tick`)."""
    if healable(plan, key):
        _waits(plan)[key] = [CALLS, _now(), 0]
    elif plan.waits:
        plan.waits.pop(key, None)


def _pace(plan: AutoPlan, keys: list[str]) -> list[str]:
    """The ``keys`` to measure again now: as many as fit in this window's :data:`STEP_MS`
    (one at least where nothing started in it; a window: :data:`~._again.AFTER_S`)."""
    waits, now = _waits(plan), _now()
    if now - waits.at >= AFTER_S:
        waits.at, waits.used_ms = now, 0.0
    picked = []
    for key in keys:
        entry = plan.entries.get(key)
        cost = estimate_ms(None if entry is None else entry.costs)
        if waits.used_ms > 0 and waits.used_ms + cost > STEP_MS:
            continue
        picked.append(key)
        waits.used_ms += cost
    return picked


def _look(plan: AutoPlan, keys: list[str], region: Any, looks: int) -> tuple[list[str] | None, bool]:
    """Which of ``keys`` (whose time has come) to measure again now (marked due), and whether
    the device was busy: None, not now (busy with ``looks`` made so far, or this window's
    measurements started); ``[]``: none in this process (given up: frozen, no budget to
    spare, busy for good).  A clock that leaves other work out (:func:`~._hostclock.shields`)
    measures whatever the load."""
    from . import _hooks
    from ._again import MAX_LOOKS, _spare
    from ._hostclock import shields

    keys = [key for key in keys if healable(plan, key)]
    if keys and not plan.frozen and _spare():
        load = _hooks.load_of(region)
        busy = load is not None and load > BUSY_LOAD and not shields(_hooks._clock(region))
        if not busy:
            picked = _pace(plan, keys)
            plan.due.update(picked)
            return picked or None, False
        if looks + 1 < MAX_LOOKS:
            return None, True  # a measurement now would be provisional again
    for key in keys:  # not measured again in this process
        plan.healed[key] = MAX_HEAL
    return [], False


def tick(plan: AutoPlan, key: str, region: Any) -> None:
    """A call of ``key``'s class (provisional, measured here) applied call by call: every
    :data:`~._again.CALLS` calls, once :data:`~._again.AFTER_S` seconds have passed, it is
    due to be measured again (the program path's :class:`Heal`, per class)."""
    waits = plan.waits
    state = waits[key]
    state[0] -= 1
    if state[0] > 0:
        return
    state[0] = CALLS
    if _now() - state[1] < AFTER_S:
        return
    found, busy = _look(plan, [key], region, state[2])
    if found is None:
        state[1], state[2] = _now(), state[2] + busy
    else:
        waits.pop(key, None)


def cell(plan: AutoPlan, keys: Iterable[str], region: Any, can_measure: bool) -> Stale:
    """The ``stale`` cell of a program whose recording ran the classes ``keys``: a
    :class:`Heal` where some are provisional and may be measured again here, else a plain one."""
    found = [key for key in dict.fromkeys(keys) if healable(plan, key)] if can_measure and not plan.frozen else []
    return Heal(plan, found, region) if found else Stale([False])


def portable(stale: list[bool]) -> Stale:
    """The ``stale`` cell of a program kept for copies of its root (:func:`._twins.keep`):
    the copies share it, so a workload of a fresh copy per step counts down and heals too."""
    if isinstance(stale, Heal):
        return cell(stale.plan, stale.keys, stale.region, True)
    return Stale([False])


class Heal(Stale):
    """A program's ``stale`` cell while classes it ran are provisional, shared by the copies
    that adopt it (:mod:`._twins`): true once set (a module collected, a class added); once
    some are due to be measured again, true while they are (the next root call records, and
    its recording measures them: :meth:`~._plan.AutoPlan.due`; one root call of the many
    sharing the cell, not each); then counting down again for those still provisional, or,
    nothing left to measure here (measured, given up, no budget), true once more per program
    holding it: its lookup swaps it for :attr:`plain` (:func:`quiet`), without recording.
    Before, the cell stayed set: every root sharing it recorded again (an ensemble of 20
    models of one class: 20 recordings for one measurement)."""

    __slots__ = ("at", "due", "keys", "left", "looks", "plain", "plan", "region")

    def __init__(self, plan: AutoPlan, keys: list[str], region: Any) -> None:
        super().__init__([False])
        self.plan, self.keys, self.region = plan, keys, region
        self.left, self.at, self.looks, self.due = CALLS, _now(), 0, False
        #: the plain cell its programs swap to once nothing is left to measure here (:func:`quiet`)
        self.plain: Stale | None = None

    def __setitem__(self, index: Any, value: Any) -> None:  # set (a module collected, a class added): its plain too
        _set(self, index, value)
        if self.plain is not None:
            self.plain[index] = value

    def __getitem__(self, index: Any) -> Any:
        if _get(self, 0) or self.plain is not None:
            return True
        if self.due:  # its classes due: true until a root call's recording measured them
            if not self.plan.due.isdisjoint(self.keys):
                return True
            self.due, self.keys = False, [key for key in self.keys if healable(self.plan, key)]
            if not self.keys:
                return self._quiet()
            self.left, self.at = CALLS, _now()  # others, paced to a later window: counting down again
            return False
        self.left -= 1
        if self.left > 0:
            return False
        self.left = CALLS
        return _now() - self.at >= AFTER_S and self._due()

    def _due(self) -> bool:
        """Due: mark the classes to measure again and record again; or look again later
        (busy, this window's measurements started elsewhere); or, none left to measure
        here, the plain cell."""
        found, busy = _look(self.plan, self.keys, self.region, self.looks)
        if found is None:
            self.looks, self.at = self.looks + busy, _now()
            return False
        if not found:
            return self._quiet()
        self.due = True  # record again: the classes due are measured there
        return True

    def _quiet(self) -> bool:
        """Nothing left to measure here: the plain cell its programs swap to (registered as
        this one is for a class added)."""
        plain = self.plain = Stale([False])
        if self.plan.waiting.get(id(self)) is self:
            self.plan.waiting[id(plain)] = plain
        return True


def quiet(program: Program) -> Program:
    """``program`` with its :class:`Heal` cell's plain one once nothing is left to measure
    here (and nothing set it): the settled path as for a settled class, no recording; else
    ``program``.  A provisional verdict's countdown (:class:`~._again.Recheck`) reading such
    a cell reads its plain one from now on."""
    recheck = program.recheck
    cell = _calm(getattr(recheck, "cell", None))  # (a kept program's is not a countdown: ._twins)
    if cell is not None:
        recheck.cell = cell
    plain = _calm(program.stale)
    return program if plain is None else program._replace(stale=plain)


def _calm(cell: Any) -> Stale | None:
    """The plain cell of ``cell``, a :class:`Heal` with nothing left to measure here, not set; else None."""
    return cell.plain if type(cell) is Heal and cell.plain is not None and not _get(cell, 0) else None


_get: Final = list.__getitem__
_set: Final = list.__setitem__
