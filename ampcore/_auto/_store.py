"""The table of programs: for each root, its :class:`~._program.Program` per input signature.

A root keeps up to :data:`_MAX_SIGNATURES` signatures, a new one replacing the oldest, and
the programs of other plans (a region's dtype or torch's thread count taking turns) for a
signature in :data:`_others`.  A root fed a stream of signatures its table cannot hold stops
recording (:func:`churning`).  Entries are weak in the root: a collected model drops them.
"""

from __future__ import annotations

import weakref
from typing import Any, Final

from torch import nn

from ._loose import loosen
from ._plan import AutoPlan
from ._program import Program
from ._twins import forget as forget_twins
from ._twins import keep

__all__ = ["churning", "forget", "program_for", "same_program", "store"]


#: root module -> {input signature: its Program, or the number of recordings that failed}
_programs: weakref.WeakKeyDictionary[nn.Module, dict[tuple[Any, ...], Program | int]] = weakref.WeakKeyDictionary()


#: signatures a root keeps programs for; a new one beyond it replaces the oldest
_MAX_SIGNATURES: Final = 256
#: the key, in a root's dict of programs, of how many it dropped unrun for new signatures
_DROPPED: Final = ("dropped",)
#: root -> {(id of its plan, signature): Program}: the programs of plans other than the one
#: its table's program has, for a signature (each dtype and thread count has its plan)
_others: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, Any], Program]] = weakref.WeakKeyDictionary()
#: programs of other plans a root keeps
_MAX_OTHERS: Final = 64
#: programs dropped unrun before a root stops recording (:func:`churning`; one-offs do not)
_SETTLE_AFTER: Final = 4
#: root -> the signatures of its programs that have not run since they were recorded
_unrun: weakref.WeakKeyDictionary[nn.Module, set[tuple[Any, ...]]] = weakref.WeakKeyDictionary()


def program_for(root: nn.Module, sig: tuple[Any, ...] | None, plan: AutoPlan) -> Program | int | None:
    """The valid program of ``root`` for ``sig`` under ``plan`` (``sig`` None: for any
    signature), else the number of recordings of it that failed; None: ``root`` cannot have
    programs (a module class that is not hashable)."""
    try:
        programs = _programs.get(root, {})
    except TypeError:
        return None
    if sig is None:
        # (a copy first: another thread may store a program of the root while this looks)
        return next((p for p in list(programs.values()) if isinstance(p, Program) and p.valid(plan)), 0)
    found = programs.get(sig, 0)
    if isinstance(found, Program) and found.plan is not plan or found == 0:
        found = _other_plan(root, sig, plan, programs, found)
    if isinstance(found, Program):
        if not found.valid(plan):
            return 0
        unrun = _unrun.get(root)
        if unrun:
            unrun.discard(sig)  # it runs
    return found


def _other_plan(
    root: nn.Module, sig: tuple[Any, ...], plan: AutoPlan, programs: dict[tuple[Any, ...], Program | int], found: Any
) -> Any:
    """The program ``root`` keeps for ``sig`` under ``plan`` among those of other plans (a
    region's dtype or torch's thread count that changes between steps: each has its plan),
    swapped with ``found``, the table's; else ``found``."""
    others = _others.get(root)
    kept = None if others is None else others.pop((id(plan), sig), None)
    if kept is None or kept.plan is not plan:
        return found
    if isinstance(found, Program):
        _keep_other(root, sig, found)
    programs[sig] = kept
    return kept


def _keep_other(root: nn.Module, sig: tuple[Any, ...], program: Program) -> None:
    others = _others.setdefault(root, {})
    if len(others) >= _MAX_OTHERS:
        del others[next(iter(others))]  # the oldest
    others[(id(program.plan), sig)] = program


def churning(root: nn.Module, sig: tuple[Any, ...] | None) -> bool:
    """Whether a call of ``root`` with ``sig``, a signature it has no entry for, is one more
    of a stream its table cannot hold (lengths over more than :data:`_MAX_SIGNATURES` values):
    the table dropped :data:`_SETTLE_AFTER` programs that never ran again.  It then applies
    the plan call by call unrecorded (a recording, with a mixed program's whole-call check,
    per step for a program dropped before it runs: 2.0 x the better fixed choice); a table
    whose programs run before they go (a new phase with its own shapes) keeps recording."""
    try:
        programs = _programs.get(root)
    except TypeError:
        return False
    if not programs or sig in programs:
        return False
    dropped = programs.get(_DROPPED, 0)
    return isinstance(dropped, int) and dropped >= _SETTLE_AFTER


def store(root: nn.Module, sig: tuple[Any, ...], found: Program | int) -> None:
    """Keep the program (or the count of failed recordings) of ``root`` for ``sig``: up to
    :data:`_MAX_SIGNATURES` signatures, a new one replacing the oldest (those dropped unrun
    are counted: see :func:`churning`)."""
    try:
        programs = _programs.setdefault(root, {})
        unrun = _unrun.setdefault(root, set())
    except TypeError:  # a module class that is not hashable or weak-referenceable: no program
        return
    known = programs.get(sig)
    if isinstance(known, Program) and (not isinstance(found, Program) or found.plan is not known.plan):
        _keep_other(root, sig, known)  # another plan's: kept for when it applies again
    dropped = programs.get(_DROPPED, 0)
    if sig not in programs and len(programs) - (_DROPPED in programs) >= _MAX_SIGNATURES:  # dynamic shapes
        oldest = next(k for k in programs if k is not _DROPPED)
        del programs[oldest]
        programs[_DROPPED] = (dropped if isinstance(dropped, int) else 0) + (oldest in unrun)
        unrun.discard(oldest)
    if isinstance(found, Program) and not isinstance(programs.get(sig), Program):
        unrun.add(sig)  # (a program checked or recorded again keeps whether it ran)
    programs[sig] = found
    if isinstance(found, Program):  # a number that changed and gave the same program: held by type
        keep(root, sig, found)  # for copies of the root (_twins)
        loose = loosen(root, sig, programs, lambda other: isinstance(other, Program) and same_program(found, other))
        if loose is not None:
            programs[loose] = found


def same_program(a: Program, b: Program) -> bool:
    """Whether ``a`` and ``b`` apply the same decisions to the same modules (under the same plan)."""

    def ids(refs: tuple[weakref.ref[nn.Module], ...]) -> set[int]:
        return {id(m) for r in refs if (m := r()) is not None}

    return (
        a.plan is b.plan
        and a.changes == b.changes
        and a.default_fp32 == b.default_fp32
        and ids(a.switched) == ids(b.switched)
        and ids(a.unseen) == ids(b.unseen)
        and {(id(r()), c) for r, c in a.steps} == {(id(r()), c) for r, c in b.steps}
    )


def forget() -> None:
    """Drop every program (tests, ``ampcore plan clear``)."""
    _programs.clear()
    _others.clear()
    _unrun.clear()
    forget_twins()
