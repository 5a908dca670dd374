"""Settings changed before their program's first look: a setting, a flag or a step number.

A program is recorded at a root's first call with its watched settings' values
(:mod:`._settings`); its first look is the next call of that signature (its whole-call
check).  A watched setting that changed in between may be a step number the loop or a
pre-hook sets every call (``model.step = i``, ``self.calls += 1``: state, to hold), a
setting set once after the first call (``model.depth = 6``) or a flag flipped every step or
within one (``model.use_cache = i % 2 == 0``, a ``no_sync`` context): settings, one verdict
per value.  One change cannot tell them apart, so at the first change the program is
*re-baselined* (:func:`rebase`: its watched values become the values now, the call runs it
and its check judges it at them) and the next look decides, per setting that changed
(:func:`look`):

* still at its new value: a setting set once: the root records again (the program was
  recorded for the old value; it is kept for that value, the new one gets its own);
* back at its recorded value: a flag: the program as recorded runs for it (checked then),
  the re-baselined one is kept for the new value (:mod:`._store`): each value its program;
* a third value: a step number: held (:func:`._settings.hold`), the program runs on.

A step counter so costs one more look than holding at the first change (no recording; with
a flag flipped every call, the flag's programs are the two above); a setting set once costs
one recording more (its program recorded for its value).
"""

from __future__ import annotations

import weakref
from typing import Any, Final

from torch import nn

from ._program import Program
from ._setting_values import Settings
from ._settings import hold

__all__ = ["forget", "look", "pending", "rebase", "stayed"]

#: an entry of :data:`_early`: the watched settings, their recorded values, their values at
#: the first change, the program as recorded
_Entry = tuple[Settings, tuple[Any, ...], tuple[Any, ...], Program]
#: root -> {signature: :data:`_Entry`}: programs re-baselined, not yet looked at again
_early: weakref.WeakKeyDictionary[nn.Module, dict[Any, _Entry]] = weakref.WeakKeyDictionary()
_OTHER: Final = object()


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a is b or a == b)


def rebase(
    root: nn.Module,
    sig: Any,
    found: Program,
    watched: tuple[Settings, tuple[Any, ...]],
    programs: dict[Any, Any],
) -> Program:
    """``found``, whose watched settings changed before its first look, with their values
    now as its baseline (put in ``programs`` for ``sig``): it runs, and the next look
    decides (:func:`look`)."""
    settings, recorded = watched
    now = settings.now()
    try:
        _early.setdefault(root, {})[sig] = (settings, recorded, now, found)
    except TypeError:  # a module class that is not hashable: held as before
        hold(settings, recorded)
        return found
    program = found._replace(plain=(*found.plain[:-1], (None, "", settings, now)))
    programs[sig] = program
    return program


def pending(root: nn.Module, sig: Any) -> bool:
    """Whether ``root``'s program for ``sig`` was re-baselined and awaits its next look
    (its next call goes to the lookup, not straight to the program: :mod:`._roots`)."""
    if not _early:
        return False
    try:
        return sig in _early.get(root, ())
    except TypeError:
        return False


def _entry(root: nn.Module, sig: Any, settings: Settings) -> _Entry | None:
    """The re-baselining of ``settings`` for ``root`` and ``sig``, dropped (None: none)."""
    try:
        entries = _early.get(root)
    except TypeError:
        return None
    entry = None if entries is None else entries.pop(sig, None)
    if entries is not None and not entries:
        del _early[root]
    return entry if entry is not None and entry[0] is settings else None


def stayed(root: nn.Module, sig: Any, found: Program) -> Program | None:
    """At the next look of a re-baselined program ``found`` whose settings are unchanged
    since (a setting set once): the program as recorded (for the old values; the root
    records again for the new ones); else None."""
    watched = found.plain[-1] if found.plain else None
    if watched is None or type(watched[2]) is not Settings:
        return None
    entry = _entry(root, sig, watched[2])
    return None if entry is None else entry[3]


def look(root: nn.Module, sig: Any, watched: tuple[Settings, tuple[Any, ...]]) -> Program | list[Program] | bool | None:
    """At the next look of a re-baselined program whose settings changed again: the ones
    that took a third value are held (step numbers); then the program as recorded where
    the others are back at their recorded values (a flag: it runs for them), a list of it
    where one is still at its new value (a setting: record again; the program as recorded
    kept for its values), False where none changed but the held; None: no re-baselining
    pending for these settings."""
    settings = watched[0]
    entry = _entry(root, sig, settings)
    if entry is None:
        return None
    _, recorded, early, program = entry
    now = settings.now()
    kept = back = False
    counters = list(now)
    for i, (was, first, value) in enumerate(zip(recorded, early, now, strict=False)):
        if _same(was, first):
            continue  # not changed at the first change
        if _same(value, first):
            kept = True
        elif _same(value, was):
            back = True
        else:
            counters[i] = _OTHER  # a third value: a step number
    if any(c is _OTHER for c in counters):
        hold(settings, tuple(counters))
    return [program] if kept else program if back else False


def forget() -> None:
    """Forget pending re-baselinings (tests, ``ampcore plan clear``)."""
    _early.clear()
