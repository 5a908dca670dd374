"""Settings: the plain attributes a forward may pick its work from.

A forward can choose what it runs from an attribute the call's signature does not show
(``for _ in range(self.depth)``, ``if self.use_gate:``, a scale ``self.alpha`` that skips a
branch at 0, an inner block's ``self.repeat``, ``self.config.use_cache``).  Its *settings*
are a module's public attributes of simple types (:mod:`._setting_values`: ``bool``,
``int``, ``float``, short ``str``, ``None``, enum members, short tuples of those; not
``training``, which the signature holds as ``"eval"``), and for a class of the user's also
its short lists of them (``dilations``) and the simple fields of its config objects (slotted
ones and ``NamedTuple`` objects too) and dicts of options (``cfg.depth``, ``opts[mode]``, private
ones too: a property reads them; :data:`_DEPTH` levels, ``cfg.attn.heads``): the first
:data:`_MAX_NAMES` of each module and container, past them those whose names the code can
read (:mod:`._read_names`):

* :func:`text` puts them in a whole-call check's key (:func:`._verify.root_key`): two
  instances of one class whose settings differ are two checks;
* :func:`watch` makes them part of a program's guard (:func:`._guard.unchanged`, one C
  ``map`` over the watched attributes per root call; nothing where the root has none):
  the settings of modules of the user's own classes (not ``torch.nn``'s: their
  attributes are in ``extra_repr``), and the flags of planned layers of a class judged per
  flags (:data:`._shapes.VARIES`: a flag that adds a second product) with the size of
  their ``__dict__`` (a flag added later).  A setting changed
  on the same instance after its root's whole-call check (``model.depth = 6``) records the
  root again, and its new value gets its own check; each value's program is kept
  (:mod:`._store`): changed back, the first value's program runs again, unrecorded.

A setting is *held* (neither watched nor keyed, for that module) where it is state, not a
setting: the forward changed it (it differs after the recorded call from before it,
:func:`before`: a counter; held for every module of its class where the class is the user's,
whose forward it is: copies made from a source never called), it took a third value
after changing before its program's first look (:func:`hold`, from :mod:`._early`: a step
number the loop or a pre-hook sets every call), or it took :data:`HELD_AFTER` values.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable
from typing import Any, Final

from torch import nn

from ._read_names import read_names
from ._setting_values import Entry, Settings, config, items, listed, own, simple
from ._shapes import VARIES, flags, known_kind, planned_ops

__all__ = ["HELD_AFTER", "Settings", "any_held", "before", "held_of", "hold", "text", "unheld", "watch", "watch_now"]

#: the values a watched setting may take before it is held (see the module): a setting
#: toggled between a few values is watched for good, an epoch number is held at its eighth
HELD_AFTER: Final = 8
#: module -> the names of its held settings
_held: weakref.WeakKeyDictionary[nn.Module, set[str]] = weakref.WeakKeyDictionary()
#: class -> the names the forward of one of its instances changed: state for every instance
#: (the forward is the class's; a copy made from a source never called holds them too)
_held_by_class: dict[type, set[str]] = {}
#: module -> name -> the (type, value) pairs a watched setting took
_seen: weakref.WeakKeyDictionary[nn.Module, dict[str, set[tuple[type, Any]]]] = weakref.WeakKeyDictionary()
_MISSING: Final = object()
_MAX_NAMES: Final = 64
#: the levels of config objects and dicts of options read below a module (``cfg.attn.heads``)
_DEPTH: Final = 2
#: a setting: its name (``depth``, ``cfg.depth``, ``opts[mode]``, ``cfg.attn.heads``), its
#: value (a list's as a tuple), the dict it is read from, its key there, whether it is a
#: list, and the keys from the module's ``__dict__`` to that dict's object (``("cfg",)``,
#: ``("cfg", "attn")``; None: the module's own attribute)
_Found = tuple[str, Any, dict[Any, Any], Any, bool, "tuple[Any, ...] | None"]


class _Read:
    """The names the code of a root's modules' classes can read (:func:`._read_names.read_names`),
    taken at the first container past :data:`_MAX_NAMES` only; a config object's fields
    also by its class's code (:meth:`of`)."""

    __slots__ = ("by_type", "modules", "names")

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        self.modules = modules
        self.names: frozenset[str] | None = None
        self.by_type: dict[type, frozenset[str]] = {}

    def base(self) -> frozenset[str]:
        """The names the code of the modules' classes can read."""
        if self.names is None:
            self.names = read_names({type(m) for m in self.modules})
        return self.names

    def of(self, value: Any) -> frozenset[str]:
        """:meth:`base` and the names the code of ``value``'s class can read."""
        found = self.by_type.get(type(value))
        if found is None:
            found = self.by_type[type(value)] = self.base() | read_names([type(value)])
        return found


def _found(module: nn.Module, read: _Read | None = None) -> list[_Found]:
    """``module``'s settings now (see the module), held ones left out: its public attributes
    of simple types; for a class of the user's, also its lists of them and the simple fields
    of its config objects and dicts of options (:data:`_MAX_NAMES` each, and past them the
    ones whose names the code of ``read``'s classes can read: :mod:`._read_names`; None:
    ``module``'s)."""
    try:
        held: Any = _held.get(module, ())
    except TypeError:  # a module class that is not hashable
        held = ()
    by_class = _held_by_class.get(type(module))
    if by_class:
        held = by_class.union(held)
    state = module.__dict__
    mine = own(type(module))
    found: list[_Found] = []
    count = 0
    for name, value in state.items():
        if name[0] == "_" or name == "training" or name in held:
            continue
        if simple(value) or (mine and listed(value)):
            count += 1
            if count > _MAX_NAMES and name not in (read := read or _Read((module,))).base():
                continue
            found.append((name, value if simple(value) else tuple(value), state, name, not simple(value), None))
        elif mine and (fields := config(value)) is not None:
            read = read or _Read((module,))
            found.extend(_fields(name, fields, held, type(value) is dict, (name,), read, value))
    return found


def _fields(
    label: str, fields: Any, held: Any, options: bool, path: tuple[Any, ...], read: _Read, value: Any
) -> list[_Found]:
    """The settings of the config object or dict of options ``label`` (``value``, its fields'
    container ``fields``), reached by ``path`` from its module (see :func:`_found`; one in
    it, :data:`_DEPTH` levels down at most)."""
    found: list[_Found] = []
    entries = items(fields)
    wide = (read.base() if options else read.of(value)) if len(entries) > _MAX_NAMES else frozenset()
    count = 0
    for key, value in entries:
        # (a private field too, not a dunder: a property or ``__getattr__`` reads it)
        if type(key) is not str or key[:2] == "__":
            continue
        name = f"{label}[{key}]" if options else f"{label}.{key}"
        if name in held:
            continue
        if simple(value) or listed(value):
            count += 1
            if count > _MAX_NAMES and key not in wide:
                continue
            found.append((name, value if simple(value) else tuple(value), fields, key, not simple(value), path))
        elif len(path) < _DEPTH and (inner := config(value)) is not None:
            found.extend(_fields(name, inner, held, type(value) is dict, (*path, key), read, value))
    return found


def settings(module: nn.Module, read: _Read | None = None) -> list[tuple[str, Any]]:
    """``module``'s settings now (see the module), held ones left out (``read``: the names
    a wide config's fields past the first are watched for, :func:`_found`).

    Example::

        >>> import torch
        >>> net = torch.nn.Dropout(0.25)
        >>> net.depth, net.name, net._private = 3, "x", 1
        >>> settings(net)
        [('p', 0.25), ('inplace', False), ('depth', 3), ('name', 'x')]
    """
    return [(entry[0], entry[1]) for entry in _found(module, read)]


def any_held() -> bool:
    """Whether any module has a held setting."""
    return bool(_held) or bool(_held_by_class)


def held_of(module: nn.Module) -> frozenset[str]:
    """The names of ``module``'s held settings (an empty set for none)."""
    by_class = _held_by_class.get(type(module), ())
    try:
        held = _held.get(module)
    except TypeError:  # a module class that is not hashable
        return frozenset(by_class)
    return frozenset(held).union(by_class) if held else frozenset(by_class)


def text(module: nn.Module) -> str:
    """The settings of ``module`` as a whole-call check's key holds them ('' for none)."""
    found = settings(module, _Read(module.modules()))
    return "" if not found else "{" + ",".join(f"{k}={v!r}" for k, v in found) + "}"


def _watched(module: nn.Module) -> bool:
    """Whether ``module`` is a planned layer of a class judged per flags (:data:`VARIES`)."""
    return known_kind(type(module)) is VARIES and planned_ops(module) is not None


def before(modules: list[nn.Module]) -> dict[tuple[int, str], Any]:
    """The settings of ``modules`` at the start of a recorded call (what the forward changes
    is state, not a setting: :func:`watch` holds it)."""
    read = _Read(modules)
    return {(id(m), k): v for m in modules for k, v in settings(m, read)}


def _keep(module: nn.Module, name: str, value: Any) -> bool:
    """Whether ``name`` of ``module`` stays watched at ``value``: else (its
    :data:`HELD_AFTER`-th value) it is held from now on."""
    try:
        seen = _seen.setdefault(module, {}).setdefault(name, set())
        seen.add((type(value), value))
    except TypeError:  # a module class or value that is not hashable: not watched
        return False
    if len(seen) < HELD_AFTER:
        return True
    _held.setdefault(module, set()).add(name)
    return False


def watch(modules: list[nn.Module], was: dict[tuple[int, str], Any] | None) -> tuple[Settings, tuple[Any, ...]] | None:
    """The settings of ``modules`` a program's guard watches (those of the user's own module
    classes, and the flags of planned layers of classes judged per flags), with their values
    now (None: none); ``was``: :func:`before` at the recorded call's start (None: not taken,
    nothing watched).  A setting the call changed (or made) is state: held.  A config
    object's field several modules read (one object) is watched once (the other modules'
    links to that object checked by identity: one of them given another object records)."""
    if was is None:
        return None
    entries: list[Entry] = []
    shared: list[tuple[dict[str, Any], tuple[Any, ...]]] = []
    seen: set[tuple[int, Any]] = set()
    sized = tuple(m.__dict__ for m in modules if _watched(m))
    read = _Read(modules)
    for module in modules:
        mine = own(type(module))
        found = [(entry, mine) for entry in _found(module, read)]
        if not mine and _watched(module):  # (a torch layer's flags: state checked above, watched here)
            state = module.__dict__
            found += [((n, v, state, n, False, None), True) for n, v in flags(module)]
        for (name, value, where, key, is_list, via), watchable in found:
            start = was.get((id(module), name), _MISSING)
            if start is _MISSING or not _same(start, value):  # state the forward changed (a counter)
                _state(module, name)
            elif watchable and (id(where), key) in seen:
                if via is not None:  # (another holder of a shared config object)
                    shared.append((module.__dict__, via))
            elif watchable and _keep(module, name, value):
                seen.add((id(where), key))
                entries.append((module, name, where, key, is_list, via))
    if not entries and not sized:
        return None
    watched = Settings(entries, sized, tuple(shared))
    return watched, watched.now()


def watch_now(modules: list[nn.Module]) -> tuple[Settings, tuple[Any, ...]] | None:
    """:func:`watch` for a program made without a recording (a copy's, :mod:`._twins`): the
    settings of ``modules`` as they are now (only modules that may have watched ones read:
    looked at by class first, each class once, a copy's torch layers none)."""
    if not any(own(k) or known_kind(k) is VARIES for k in set(map(type, modules))):
        return None
    mine = [m for m in modules if own(type(m)) or _watched(m)]
    return watch(mine, before(mine)) if mine else None


def _state(module: nn.Module, name: str) -> None:
    """Hold ``name``, which the forward of ``module`` changed, for it and, for a class of the
    user's (whose forward it is; not torch's, whose keys stay the same in every process), its class."""
    if own(type(module)):
        _held_by_class.setdefault(type(module), set()).add(name)
    with contextlib.suppress(TypeError):
        _held.setdefault(module, set()).add(name)


def hold(watched: Settings, values: tuple[Any, ...]) -> None:
    """Hold the watched settings whose values now differ from ``values`` (:mod:`._early`: the
    ones that took a third value since the first look, step numbers: state)."""
    for ref, name, value, now in zip(watched.refs, watched.labels, values, watched.now(), strict=False):
        module = ref()
        if module is not None and not _same(now, value):
            with contextlib.suppress(TypeError):
                _held.setdefault(module, set()).add(name)


def unheld(watched: Settings, values: tuple[Any, ...]) -> tuple[Settings, tuple[Any, ...]] | None:
    """``watched`` and ``values`` without the settings held since (None: none left)."""
    keep = []
    for ref, name in zip(watched.refs, watched.labels, strict=True):
        module = ref()
        try:
            keep.append(module is not None and name not in held_of(module))
        except TypeError:  # a module class that is not hashable
            keep.append(False)
    if not any(keep) and not watched.sized:
        return None
    found = watched.without(keep)
    kept = [v for v, k in zip(values, keep, strict=False) if k]
    return found, (*kept, *values[len(watched.refs) :])


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a is b or a == b)


def forget() -> None:
    """Forget held and seen settings (tests)."""
    _held.clear()
    _held_by_class.clear()
    _seen.clear()
