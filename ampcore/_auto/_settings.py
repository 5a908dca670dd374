"""Settings: the plain attributes a forward may pick its work from.

A forward can choose what it runs from an attribute the call's signature does not show
(``for _ in range(self.depth)``, ``if self.use_gate:``, a scale ``self.alpha`` that skips a
branch at 0, an inner block's ``self.repeat``).  Its *settings* are a module's public
attributes of simple types (``bool``, ``int``, ``float``, ``str`` up to :data:`_MAX_STR`
characters, ``None``, tuples of those up to :data:`_MAX_ITEMS` items; not ``training``,
which the signature holds as ``"eval"``), at most :data:`_MAX_NAMES` a module:

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
whose forward it is: copies made from a source never called), it changed before the program
recorded for its value was first looked up (:func:`hold`: a step number the loop or a
pre-hook sets every call), or it took :data:`HELD_AFTER` values.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Final

from torch import nn

from ._shapes import VARIES, flags, known_kind, planned_ops

__all__ = ["HELD_AFTER", "Settings", "any_held", "before", "held_of", "hold", "text", "unheld", "watch"]

_SCALARS: Final = frozenset({bool, int, float, str, type(None)})
_MAX_STR: Final = 256
_MAX_ITEMS: Final = 16
_MAX_NAMES: Final = 64
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


def _simple(value: Any) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return kind is not str or len(value) <= _MAX_STR
    if kind is tuple:
        return len(value) <= _MAX_ITEMS and all(type(v) in _SCALARS and type(v) is not str for v in value)
    return False


def settings(module: nn.Module) -> list[tuple[str, Any]]:
    """``module``'s settings now (see the module), held ones left out.

    Example::

        >>> import torch
        >>> net = torch.nn.Dropout(0.25)
        >>> net.depth, net.name, net._private = 3, "x", 1
        >>> settings(net)
        [('p', 0.25), ('inplace', False), ('depth', 3), ('name', 'x')]
    """
    try:
        held: Any = _held.get(module, ())
    except TypeError:  # a module class that is not hashable
        held = ()
    by_class = _held_by_class.get(type(module))
    if by_class:
        held = by_class.union(held)
    found = []
    for name, value in module.__dict__.items():
        if name[0] != "_" and name != "training" and name not in held and _simple(value):
            found.append((name, value))
            if len(found) >= _MAX_NAMES:
                break
    return found


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
    found = settings(module)
    return "" if not found else "{" + ",".join(f"{k}={v!r}" for k, v in found) + "}"


def _watched(module: nn.Module) -> bool:
    """Whether ``module`` is a planned layer of a class judged per flags (:data:`VARIES`)."""
    return known_kind(type(module)) is VARIES and planned_ops(module) is not None


def _own(cls: type) -> bool:
    """Whether ``cls`` is a class of the user's (not one of ``torch``'s: their settings are
    hyper-parameters ``extra_repr`` shows, and a change of them rebuilds nothing a forward
    picks its work from)."""
    found = _OWN.get(cls)
    if found is None:
        found = _OWN[cls] = not (cls.__module__ == "torch" or cls.__module__.startswith("torch."))
    return found


#: class -> whether it is the user's (:func:`_own`)
_OWN: dict[type, bool] = {}


def before(modules: list[nn.Module]) -> dict[tuple[int, str], Any]:
    """The settings of ``modules`` at the start of a recorded call (what the forward changes
    is state, not a setting: :func:`watch` holds it)."""
    return {(id(m), k): v for m in modules for k, v in settings(m)}


class Settings:
    """The watched settings of a program's modules: their ``__dict__``s, names and (weakly)
    the modules (the guard compares the values, :meth:`same`)."""

    __slots__ = ("dicts", "names", "refs", "sized", "sizes")

    def __init__(self, modules: list[nn.Module], names: list[str], sized: tuple[dict[str, Any], ...] = ()) -> None:
        self.dicts = tuple(m.__dict__ for m in modules)
        self.names = tuple(names)
        self.refs = tuple(weakref.ref(m) for m in modules)
        #: the ``__dict__``s of planned layers judged per flags, and their sizes: a flag
        #: added since (``layer.extra = True``) records the root again
        self.sized, self.sizes = sized, tuple(map(len, sized))

    def same(self, values: tuple[Any, ...]) -> bool:
        """Whether every watched attribute still holds its recorded value (one C map)."""
        if self.sized and tuple(map(len, self.sized)) != self.sizes:
            return False
        return tuple(map(dict.get, self.dicts, self.names)) == values

    def now(self) -> tuple[Any, ...]:
        """The watched attributes' values now."""
        return tuple(map(dict.get, self.dicts, self.names))


def _keep(module: nn.Module, name: str, value: Any) -> bool:
    """Whether ``name`` of ``module`` stays watched at ``value``: else (its
    :data:`HELD_AFTER`-th value) it is held from now on."""
    try:
        seen = _seen.setdefault(module, {}).setdefault(name, set())
    except TypeError:  # a module class that is not hashable: not watched
        return False
    seen.add((type(value), value))
    if len(seen) < HELD_AFTER:
        return True
    _held.setdefault(module, set()).add(name)
    return False


def watch(modules: list[nn.Module], was: dict[tuple[int, str], Any] | None) -> tuple[Settings, tuple[Any, ...]] | None:
    """The settings of ``modules`` a program's guard watches (those of the user's own module
    classes, and the flags of planned layers of classes judged per flags), with their values
    now (None: none); ``was``: :func:`before` at the recorded call's start (None: not taken,
    nothing watched).  A setting the call changed (or made) is state: held."""
    if was is None:
        return None
    found: list[nn.Module] = []
    names: list[str] = []
    values: list[Any] = []
    sized = tuple(m.__dict__ for m in modules if _watched(m))
    for module in modules:
        own = _own(type(module))
        for name, value in settings(module):
            start = was.get((id(module), name), _MISSING)
            if start is _MISSING or not _same(start, value):  # state the forward changed (a counter)
                _state(module, name)
            elif own and _keep(module, name, value):
                found.append(module)
                names.append(name)
                values.append(value)
        if own or not _watched(module):
            continue
        for name, value in flags(module):
            start = was.get((id(module), name), _MISSING)
            if start is _MISSING or not _same(start, value):  # state the forward changes
                _state(module, name)
            elif _keep(module, name, value):
                found.append(module)
                names.append(name)
                values.append(value)
    return None if not names and not sized else (Settings(found, names, sized), tuple(values))


def _state(module: nn.Module, name: str) -> None:
    """Hold ``name``, which the forward of ``module`` changed, for it and, for a class of the
    user's (whose forward it is; not torch's, whose keys stay the same in every process), its class."""
    if _own(type(module)):
        _held_by_class.setdefault(type(module), set()).add(name)
    with contextlib.suppress(TypeError):
        _held.setdefault(module, set()).add(name)


def hold(watched: Settings, values: tuple[Any, ...]) -> None:
    """Hold the watched settings whose values now differ from ``values`` (those of a program
    not yet looked up since its recording: a setting that changes every call is state)."""
    for ref, name, value in zip(watched.refs, watched.names, values, strict=True):
        module = ref()
        if module is not None and not _same(module.__dict__.get(name, _MISSING), value):
            with contextlib.suppress(TypeError):
                _held.setdefault(module, set()).add(name)


def unheld(watched: Settings, values: tuple[Any, ...]) -> tuple[Settings, tuple[Any, ...]] | None:
    """``watched`` and ``values`` without the settings held since (None: none left)."""
    modules: list[nn.Module] = []
    names: list[str] = []
    kept: list[Any] = []
    for ref, name, value in zip(watched.refs, watched.names, values, strict=True):
        module = ref()
        try:
            if module is None or name in _held.get(module, ()) or name in _held_by_class.get(type(module), ()):
                continue
        except TypeError:  # a module class that is not hashable
            continue
        modules.append(module)
        names.append(name)
        kept.append(value)
    if not names and not watched.sized:
        return None
    found = Settings(modules, names, watched.sized)
    found.sizes = watched.sizes  # as recorded
    return found, tuple(kept)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a is b or a == b)


def forget() -> None:
    """Forget held and seen settings (tests)."""
    _held.clear()
    _held_by_class.clear()
    _seen.clear()
