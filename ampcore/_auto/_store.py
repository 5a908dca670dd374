"""The table of programs: for each root, its :class:`~._program.Program` per input signature.

A root keeps up to :data:`_MAX_SIGNATURES` signatures, a new one replacing the oldest, and
the programs of other plans (a region's dtype or torch's thread count taking turns) for a
signature in :data:`_others`.  A root fed a stream of signatures its table cannot hold stops
recording (:func:`churning`).  Entries are weak in the root: a collected model drops them.
A program whose watched settings (:mod:`._settings`) changed is kept for their values in
:data:`_by_value` (:func:`_by_settings`).
"""

from __future__ import annotations

import weakref
from typing import Any, Final

from torch import nn

from ._early import forget as forget_early
from ._early import look, rebase, stayed
from ._guard import unchanged
from ._heal import quiet
from ._loose import loosen
from ._plan import AutoPlan
from ._program import Program
from ._settings import Settings, unheld
from ._twins import forget as forget_twins
from ._twins import keep

__all__ = ["churning", "forget", "program_for", "raised", "same_program", "store"]


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
#: root -> {(signature, its watched settings' values): the program for them, or
#: :data:`_RAISED`} (:func:`_by_settings`)
_by_value: weakref.WeakKeyDictionary[nn.Module, dict[tuple[Any, Any], Any]] = weakref.WeakKeyDictionary()
#: a value of settings whose recording raised (the forward checks a flag and raises)
_RAISED: Final = "raised"
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
        valid = found.valid(plan)
        if (not valid or found.recheck is not None) and (calm := quiet(found)) is not found:  # nothing
            found = programs[sig] = calm  # left to measure here (._heal): its plain cell, not recorded again
            valid = found.valid(plan)
        if not valid:  # a setting changed: the program of its new value, if any
            return _by_settings(root, sig, found, plan, programs) or 0
        recorded = stayed(root, sig, found)  # re-baselined at a change, unchanged since: a setting
        if recorded is not None:  # (._early): recorded again; the program as recorded kept for its values
            _keep_value(root, sig, recorded, found)
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
    watched = _settings_of(known) if isinstance(known, Program) else None
    if isinstance(known, Program) and watched is not None and not watched[0].same(watched[1]):
        _keep_value(root, sig, known, found)  # its settings' values': kept for when they come back
    elif isinstance(known, Program) and (not isinstance(found, Program) or found.plan is not known.plan):
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


def _settings_of(program: Program) -> tuple[Settings, tuple[Any, ...]] | None:
    """The watched settings of ``program`` (:mod:`._settings`) and their recorded values."""
    entry = program.plain[-1] if program.plain else None
    return (entry[2], entry[3]) if entry is not None and type(entry[2]) is Settings else None


def _keep_value(root: nn.Module, sig: tuple[Any, ...], known: Program, found: Program | int) -> None:
    """Keep ``known``, the program ``found`` (a program, or a count of failed recordings)
    replaces for ``sig``, for its settings' values (where they differ from ``found``'s:
    not the same values recorded or checked again)."""
    was = _settings_of(known)
    now = _settings_of(found) if isinstance(found, Program) else None
    if was is None or (now is not None and now[0].labels == was[0].labels and now[1] == was[1]):
        return
    kept = _by_value.setdefault(root, {})
    if len(kept) >= _MAX_OTHERS:
        del kept[next(iter(kept))]  # the oldest
    kept[(sig, was[1])] = known
    if now is not None:
        kept.pop((sig, now[1]), None)  # (a value that raised once and now records)


def _by_settings(
    root: nn.Module, sig: tuple[Any, ...], found: Program, plan: AutoPlan, programs: dict[Any, Any]
) -> Program | None:
    """For ``found``, invalid for ``sig``, where its watched settings alone changed: the
    program kept for their values now (swapped in: a flag switched back and forth runs each
    value's program, unrecorded), or ``found`` where those values raised when recorded (a
    flag the forward raises on: recorded once) or the changed settings are held (without
    them); None: record again.  A program not yet looked up since its recording is
    re-baselined at the values now and the next look decides (:mod:`._early`: a step number
    set every call is held then, a setting set once or a flag flipped records)."""
    watched = _settings_of(found)
    if watched is None or plan is not found.plan or plan.changes != found.changes or found.stale[0]:
        return None
    if not unchanged(found.tree, found.tree_values, found.weights, found.plain[:-1]):
        return None
    kept = _by_value.get(root)
    now = (sig, watched[0].now())
    other = None if kept is None else kept.get(now)
    if other is None and kept:  # its settings' layout changed (a shared config given back): one valid now
        now = next((k for k, p in kept.items() if k[0] == sig and isinstance(p, Program) and p.valid(plan)), now)
        other = kept.get(now)
    if other is _RAISED:
        return found
    if kept is not None and isinstance(other, Program) and other.valid(plan):
        del kept[now]
        _keep_value(root, sig, found, other)
        recorded = stayed(root, sig, found)  # re-baselined, swapped out before its look: as recorded kept too
        if recorded is not None and (was := _settings_of(recorded)) is not None:
            _keep_value(root, sig, _unheld(recorded, unheld(*was)), other)
        programs[sig] = other
        return other
    looked = look(root, sig, watched)  # the look after a re-baselining (._early): step numbers held
    if looked is None and not found.checked:  # changed before its first look: re-baselined, runs
        return rebase(root, sig, found, watched, programs)  # (a value whose program is kept: above)
    if isinstance(looked, Program):  # a flag back at its recorded value: the program as recorded
        return _back(root, sig, found, looked, plan, programs)
    if isinstance(looked, list):  # a setting kept at its new value: recorded (as recorded kept for its values)
        was = _settings_of(looked[0])
        _keep_value(root, sig, looked[0] if was is None else _unheld(looked[0], unheld(*was)), found)
        return None
    rest = unheld(*watched)  # settings held since (another program's recording)
    if rest is None or rest[0].same(rest[1]):  # the settings that changed are held
        program = _unheld(found, rest)
        programs[sig] = program
        return program
    return None


def _unheld(program: Program, rest: tuple[Settings, tuple[Any, ...]] | None) -> Program:
    """``program`` watching ``rest`` (:func:`._settings.unheld` of its settings) alone."""
    return program._replace(plain=program.plain[:-1] if rest is None else (*program.plain[:-1], (None, "", *rest)))


def _back(
    root: nn.Module, sig: tuple[Any, ...], rebased: Program, recorded: Program, plan: AutoPlan, programs: dict[Any, Any]
) -> Program | None:
    """``recorded``, the program ``rebased`` was re-baselined from (:mod:`._early`), for
    the settings back at its values (less those held since), ``rebased`` kept for its own;
    None where it is not valid now (something else changed: record again)."""
    was, now = _settings_of(recorded), _settings_of(rebased)
    program = recorded if was is None else _unheld(recorded, unheld(*was))
    if not program.valid(plan):  # another setting changed since too: each kept for its values,
        kept = _by_value.setdefault(root, {})  # then the one kept for the values now, if any
        for one in (program, rebased if now is None else _unheld(rebased, unheld(*now))):
            if (values := _settings_of(one)) is not None:
                if len(kept) >= _MAX_OTHERS:
                    del kept[next(iter(kept))]  # the oldest
                kept[(sig, values[1])] = one
        key = None if was is None else (sig, was[0].now())
        other = None if key is None else kept.get(key)
        if key is None or other is None or not other.valid(plan):
            return None
        del kept[key]
        program = other
    elif now is not None:
        _keep_value(root, sig, _unheld(rebased, unheld(*now)), program)
    programs[sig] = program
    return program


def raised(root: nn.Module, sig: tuple[Any, ...] | None) -> None:
    """A recording of ``root`` for ``sig`` raised: where its program's settings changed
    since (the forward raises on a flag's value), their values are kept as raising
    (:func:`_by_settings` runs the program for them, unrecorded)."""
    try:
        found = None if sig is None else _programs.get(root, {}).get(sig)
    except TypeError:
        return
    watched = None if not isinstance(found, Program) else _settings_of(found)
    if watched is None or watched[0].same(watched[1]):
        return
    kept = _by_value.setdefault(root, {})
    if len(kept) >= _MAX_OTHERS:
        del kept[next(iter(kept))]
    kept[(sig, watched[0].now())] = _RAISED


def stale_throughout(root: nn.Module) -> None:
    """Record ``root`` again where a program of it runs float32 throughout (its own pre-hooks
    were seen making low-precision tensors since: :mod:`._hook_probe`)."""
    try:
        programs = list(_programs.get(root, {}).values())
    except TypeError:
        return
    for program in programs:
        if isinstance(program, Program) and program.throughout():
            program.stale[0] = True


def forget() -> None:
    """Drop every program (tests, ``ampcore plan clear``)."""
    _programs.clear()
    _others.clear()
    _by_value.clear()
    _unrun.clear()
    forget_twins()
    forget_early()
