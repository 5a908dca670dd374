"""A provisional whole-call verdict measured again in the process that measured it.

A whole-call check (:mod:`._verify`) is *provisional* when it was measured on a busy device
or its ratios spread widely (:func:`~._checks.provisional`); a later process measures it
again.  But the process that measured it would run its verdict for its whole life: a first
check taken in a noisy moment (another process's burst, the first steps' allocator growth,
oneDNN's first kernels) kept a possibly slower program until the process ended.  So a
provisional verdict's program carries a :class:`Recheck`: the cell its settled root calls
already read (:class:`._roots_state._Last`'s ``stale``: a program that is not provisional
keeps its plain cell and pays nothing).  It counts the settled calls down; every
:data:`CALLS` calls it looks at the clock, and once :data:`AFTER_S` seconds have passed
since the check the next root call measures it again (:func:`again`), between root calls
(the root's pre-hook, before its forward), with the first check's machinery and its
protections (parameters, ``.grad``, buffers, RNG state; the process's budget, of which it
starts only in the first :data:`SPARE`: the rest stays for first checks), not while the
adapter reports the device busy (a check measured busy is provisional whatever its
figures: it waits for a quieter moment, :data:`MAX_LOOKS` looks at most), where the
first check could run (budget left, a clock, not frozen, one process, no transform; under
``torch.compile`` the sentinel never reads the cell).

The new rounds replace the old ones (:func:`~._checks.recheck`: the new figures unless
they are noisy too and spread more): rounds are not kept, only their medians, and the first
ones were the noisy moment being shed (merging them would keep its bias).  A verdict now
clear replaces the provisional one in memory and in the disk cache; one still noisy stays
provisional for a later process (a re-check here never makes it final by count) and is
measured again here at most :data:`MAX_AGAIN` times in all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ._checks import BUSY_LOAD, MAX_CHECKS, RootCheck, recheck, renewed

if TYPE_CHECKING:
    from ._plan import AutoPlan
    from ._program import Program

__all__ = ["AFTER_S", "CALLS", "MAX_AGAIN", "MAX_LOOKS", "SPARE", "Recheck", "again", "merged", "pending"]

#: settled root calls between two looks at the clock (a look: one clock read)
CALLS: Final = 8
#: seconds since the check before a provisional verdict is measured again: past the first
#: steps (allocator growth, first kernels) and a burst of other work (a time slice: 4-50
#: ms); 8 calls of a 50 ms step are 0.4 s, 8 decoding calls of 1-5 ms are within one burst
AFTER_S: Final = 1.0
#: re-checks of one whole call in one process (each within the process's budget)
MAX_AGAIN: Final = 2
#: looks at a device still busy (the adapter's load over :data:`~._checks.BUSY_LOAD`: a
#: re-check would be provisional again) before the re-check is dropped: at least a minute
MAX_LOOKS: Final = 60
#: the share of the process's budget re-checks may start in: the rest stays for first
#: measurements (a new signature's check, a new class), which decide more
SPARE: Final = 0.5
_now = time.perf_counter  # (tests replace it)


class Recheck:
    """The ``stale`` cell of a provisional verdict's program (read by each settled root
    call): true while the program's own ``cell`` is, or once the re-check is due; holds
    the recorded ``program`` the check compared and its ``key`` (:func:`._verify.root_key`)."""

    __slots__ = ("at", "cell", "due", "key", "left", "looks", "program")

    def __init__(self, program: Program, key: str) -> None:
        self.program, self.key, self.cell = program, key, program.stale
        self.left, self.at, self.due, self.looks = CALLS, _now(), False, 0

    def later(self) -> None:
        """Look again after :data:`CALLS` more calls and :data:`AFTER_S` more seconds."""
        self.left, self.at, self.due, self.looks = CALLS, _now(), False, self.looks + 1

    def __getitem__(self, index: int) -> bool:
        if self.due or self.cell[0]:
            return True
        self.left -= 1
        if self.left > 0:
            return False
        self.left = CALLS
        self.due = _now() - self.at >= AFTER_S
        return self.due


def pending(chosen: Program, program: Program, key: str, check: RootCheck | None, plan: AutoPlan) -> Program:
    """``chosen`` (what the root runs after the check of ``program``), carrying a
    :class:`Recheck` where ``check`` is provisional and may still be measured again here."""
    if check is None or not check.provisional or plan.frozen or plan.again.get(key, 0) >= MAX_AGAIN:
        return chosen
    return chosen._replace(recheck=Recheck(program, key))


def merged(old: RootCheck, new: RootCheck) -> RootCheck:
    """What a re-check in the same process keeps (:func:`~._checks.recheck`), except that a
    verdict still noisy here is not made final by the count: a later process measures it.

    Example::

        >>> from dataclasses import replace
        >>> noisy = RootCheck.of({"plan": [8.0] * 3, "low": [10.0] * 3, "fp32": [20.0] * 3}, load=2.0)
        >>> kept = merged(replace(noisy, checks=2), noisy)
        >>> kept.checks, kept.provisional
        (2, True)
    """
    kept = recheck(old, new)
    if new.provisional and kept.checks >= MAX_CHECKS:
        kept = renewed(kept, MAX_CHECKS - 1)
    return kept


def again(
    program: Program, plan: AutoPlan, measure: Callable[[Program], RootCheck] | None, load: float | None = None
) -> Program:
    """What a root runs once ``program``'s re-check is due (before: ``program`` itself): the
    verdict of its whole-call check measured again by ``measure`` (the first check's
    :func:`._verify._check` on the recorded program; None, or a frozen plan: not measured,
    the verdict as it is and no re-check left).  While the device's ``load`` (the
    adapter's, now) is busy, a re-check would be provisional again: it waits, looking
    again later, up to :data:`MAX_LOOKS` times, then is dropped (also with a clock that leaves
    other work out: under load its spread is what the load left, noisy again, and each
    re-check costs the user's step a whole check)."""
    pending_: Recheck = program.recheck
    if not pending_.due:
        return program
    if measure is not None and load is not None and load > BUSY_LOAD:
        if pending_.looks < MAX_LOOKS:
            pending_.later()
            return program
        measure = None  # busy for good: dropped (its countdown leaves the settled path)
    key, recorded = pending_.key, pending_.program
    check = plan.roots.get(key)
    measured = False
    if check is not None and check.provisional and measure is not None and not plan.frozen and _spare():
        plan.again[key] = plan.again.get(key, 0) + 1
        try:
            found = measure(recorded)
        except Exception:  # a forward that raised now (a bad batch): the verdict stays, not checked here again
            plan.again[key] = MAX_AGAIN
        else:
            check, measured = merged(check, found), True
            plan.set_root(key, check)
            from ._cache import write_cache

            write_cache(plan)
    from ._verify import fp32_exact

    own = recorded.uniform()
    verdict = "plan" if check is None or check.verdict == own else check.verdict
    chosen = recorded.fixed("low" if verdict == "fp32" and not fp32_exact(recorded) else verdict)
    return pending(chosen, recorded, key, check, plan) if measured else chosen


def _spare() -> bool:
    """Whether the process has spent less than :data:`SPARE` of its measuring budget."""
    from . import _hooks

    return _hooks._process.spent_s < SPARE * _hooks.budget_s()
