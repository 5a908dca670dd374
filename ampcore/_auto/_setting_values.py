"""What a setting's value is (:mod:`._settings`) and how a program's guard compares them.

A *setting* holds a value of a simple type (``bool``, ``int``, ``float``, ``str`` up to
:data:`_MAX_STR` characters, ``None``, an enum member, tuples of those up to
:data:`_MAX_ITEMS` items, and, for the user's classes, non-empty lists of them); a *config
object* (:func:`config`: a dataclass, a ``SimpleNamespace``, a ``transformers``
``PretrainedConfig``, a dict of options) holds settings as fields.  :class:`Settings` is the
watched part of a program's guard: per root call, one C ``map`` of an ``itemgetter`` per
dict read (the same object for the modules of one class) against the values as first read.
"""

from __future__ import annotations

import enum
import itertools
import operator
import weakref
from collections.abc import Callable
from operator import attrgetter, is_, itemgetter
from typing import Any, Final

import torch
from torch import nn

__all__ = ["Entry", "Settings", "config", "get", "getter", "items", "listed", "own", "simple"]

_SCALARS: Final = frozenset({bool, int, float, str, type(None)})
_MAX_STR: Final = 256
_MAX_ITEMS: Final = 16
#: ``f(x)`` in C (``operator.call``, Python 3.11)
_call: Final[Callable[..., Any]] = getattr(operator, "call", lambda f, *a: f(*a))
#: a watched setting (:class:`Settings`): its module, name, dict, key, whether a list, the
#: keys from the module's ``__dict__`` to the dict's config object (None: the module's own)
Entry = tuple[nn.Module, str, dict[Any, Any], Any, bool, "tuple[Any, ...] | None"]
#: a module's ``__dict__`` and the keys from it to a config object
Path = tuple[dict[str, Any], "tuple[Any, ...] | None"]


def _scalar(value: Any) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return kind is not str or len(value) <= _MAX_STR
    return isinstance(value, enum.Enum)


def simple(value: Any) -> bool:
    if _scalar(value):
        return True
    if type(value) is tuple:
        return len(value) <= _MAX_ITEMS and all(type(v) is not str and _scalar(v) for v in value)
    return False


def listed(value: Any) -> bool:
    """Whether ``value`` is a list a forward may pick its work from (``self.dilations``; not
    an empty one: a list the forward fills, of outputs or copies, is no setting)."""
    return (
        type(value) is list and 0 < len(value) <= _MAX_ITEMS and all(type(v) is not str and _scalar(v) for v in value)
    )


def config(value: Any) -> Any:
    """The container of ``value``'s fields where it is a config object (a dataclass, a
    ``SimpleNamespace``, a ``transformers`` ``PretrainedConfig``: an object of a class not
    torch's, not callable: its ``__dict__``; a class with ``__slots__`` or a ``NamedTuple``:
    the object itself, read by attribute) or a dict of options (itself); else None."""
    if type(value) is dict:
        return value
    if callable(value) or isinstance(value, (nn.Module, torch.Tensor, type)) or not own(type(value)):
        return None
    if _slots(type(value)):
        return value
    fields = getattr(value, "__dict__", None)
    return fields if type(fields) is dict else None


def items(container: Any) -> list[tuple[Any, Any]]:
    """The fields of a :func:`config` container: a dict's items; a slotted object's (or a
    ``NamedTuple``'s) set slots and fields, then its ``__dict__``'s items where it has one."""
    if type(container) is dict:
        return list(container.items())
    found = [(n, getattr(container, n)) for n in _slots(type(container)) if hasattr(container, n)]
    fields = getattr(container, "__dict__", None)
    return found + list(fields.items()) if type(fields) is dict else found


def get(container: Any, key: Any) -> Any:
    """The field ``key`` of a :func:`config` container (None: none)."""
    return container.get(key) if type(container) is dict else getattr(container, key, None)


def getter(container: Any, keys: tuple[Any, ...]) -> Any:
    """A C getter of ``keys`` in ``container``: an ``itemgetter`` of a dict, an
    ``attrgetter`` of a slotted object (one key: its value, several: a tuple)."""
    return itemgetter(*keys) if type(container) is dict else attrgetter(*keys)


def _slots(cls: type) -> tuple[str, ...]:
    """The field names of a class's instances held outside a ``__dict__``: its classes'
    ``__slots__`` (not ``__dict__``, ``__weakref__``), a ``NamedTuple``'s ``_fields``."""
    found = _SLOTS.get(cls)
    if found is None:
        names: list[str] = []
        if issubclass(cls, tuple):
            names += [n for n in getattr(cls, "_fields", ()) if type(n) is str]
        for klass in reversed(cls.__mro__):
            slots = klass.__dict__.get("__slots__", ())
            for name in (slots,) if type(slots) is str else slots:
                if type(name) is str and name not in ("__dict__", "__weakref__"):
                    # a private slot's attribute is name-mangled (``__x`` of ``C``: ``_C__x``)
                    mangled = f"_{klass.__name__.lstrip('_')}{name}" if name[:2] == "__" else name
                    names.append(mangled)
        found = _SLOTS[cls] = tuple(dict.fromkeys(names))
    return found


#: class -> its slotted field names (:func:`_slots`)
_SLOTS: dict[type, tuple[str, ...]] = {}


def own(cls: type) -> bool:
    """Whether ``cls`` is a class of the user's (not one of ``torch``'s: their settings are
    hyper-parameters ``extra_repr`` shows, and a change of them rebuilds nothing a forward
    picks its work from)."""
    found = _OWN.get(cls)
    if found is None:
        found = _OWN[cls] = not (cls.__module__ == "torch" or cls.__module__.startswith("torch."))
    return found


#: class -> whether it is the user's (:func:`own`)
_OWN: dict[type, bool] = {}


class Settings:
    """The watched settings of a program's modules: each one's module (weakly), name, the
    dict it is read from (a ``__dict__``, a config object's, a dict of options) and its key
    there; the lists among them.  The guard compares their values (:meth:`same`: one C
    ``itemgetter`` per group of dicts with the same keys, a block class's); a config object
    replaced (``self.cfg = Cfg(depth=6)``) is followed: its fields are read from then on."""

    __slots__ = (
        "dicts",
        "getters",
        "held",
        "labels",
        "links",
        "lists",
        "more",
        "names",
        "objs",
        "paths",
        "plain",
        "recorded",
        "refs",
        "shared",
        "sized",
        "sizes",
    )

    def __init__(
        self, entries: list[Entry], sized: tuple[dict[str, Any], ...] = (), shared: tuple[Path, ...] = ()
    ) -> None:
        entries = [e for e in entries if not e[4]] + [e for e in entries if e[4]]  # plain ones first
        self.refs = tuple(weakref.ref(e[0]) for e in entries)
        self.labels = tuple(e[1] for e in entries)
        #: (the module's ``__dict__``, the keys to the dict read: None for itself)
        self.paths: tuple[Path, ...] = tuple((e[0].__dict__, e[5]) for e in entries)
        #: the paths of the other modules holding a config object watched through one:
        #: their links (:func:`_links`) compared by identity, one changed records again
        self.shared = (shared, _links(shared))
        count = sum(not e[4] for e in entries)
        self.names = tuple(e[3] for e in entries[:count])
        self.lists = tuple((e[2], e[3]) for e in entries[count:])
        #: the ``__dict__``s of planned layers judged per flags, and their sizes: a flag
        #: added since (``layer.extra = True``) records the root again
        self.sized, self.sizes = sized, tuple(map(len, sized))
        self._bind([e[2] for e in entries])

    def _bind(self, containers: list[dict[Any, Any]]) -> None:
        count = len(self.names)
        self.dicts = tuple(containers[:count])
        self.lists = tuple((d, k) for d, (_, k) in zip(containers[count:], self.lists, strict=True))
        #: (the dicts holding config objects, their keys there, the objects: compared by identity)
        self.objs = _links(self.paths)
        holders = self.objs[0]
        #: those and the shared ones (:attr:`shared`), compared in one C ``map`` a call
        self.links = _join(self.objs, self.shared[1])
        keys: dict[int, tuple[dict[Any, Any], list[Any]]] = {}
        for d, name in zip(self.dicts, self.names, strict=True):
            keys.setdefault(id(d), (d, []))[1].append(name)
        getters: dict[tuple[Any, ...], Any] = {}  # (one a block class's keys)
        #: an ``itemgetter`` of its keys for each dict read (an ``attrgetter`` for each
        #: slotted config object), the dicts (:meth:`same`)
        self.getters = tuple(getters.setdefault((type(d) is dict, *k), getter(d, tuple(k))) for d, k in keys.values())
        self.held = tuple(d for d, _ in keys.values())
        #: whether every container read is a dict (else :meth:`now` reads by attribute too)
        self.plain = all(type(d) is dict for d in self.dicts)
        #: whether :meth:`same` has more than the dicts to compare (sizes, lists, config objects)
        self.more = bool(self.sized or self.lists or holders or self.shared[0])
        #: the values :meth:`same` last found unchanged, and them as its getters read them
        self.recorded: tuple[Any, Any] = (None, None)

    def _follow(self) -> None:
        """Read the fields of the config objects in place now, where one was replaced."""
        objs = self.objs
        if all(
            map(
                is_,
                map(_call, objs[3], objs[0], objs[1], _NONE) if objs[3] else map(dict.get, objs[0], objs[1]),
                objs[2],
            )
        ):
            return
        self._bind([d if via is None else _resolve(d, via) for d, via in self.paths])

    def same(self, values: tuple[Any, ...]) -> bool:
        """Whether every watched setting still holds its value in ``values`` (per call: one
        C ``map`` of the getters over their dicts, against their values as first read)."""
        recorded = self.recorded
        if recorded[0] is not values or self.more:
            return self._same_first(values)
        try:
            return bool(tuple(map(_call, self.getters, self.held)) == recorded[1])
        except (KeyError, AttributeError):  # an attribute deleted (a slot: unset)
            return False

    def _same_first(self, values: tuple[Any, ...]) -> bool:
        """:meth:`same` where there is more to compare, or for values not compared before."""
        if self.more and not self._same_more(values):
            return False
        recorded = self.recorded
        if recorded[0] is not values:
            if self.now() != values:
                return False
            self.recorded = (values, tuple(map(_call, self.getters, self.held)))
            return True
        try:
            return bool(tuple(map(_call, self.getters, self.held)) == recorded[1])
        except (KeyError, AttributeError):  # an attribute deleted (a slot: unset)
            return False

    def _same_more(self, values: tuple[Any, ...]) -> bool:
        if self.sized and tuple(map(len, self.sized)) != self.sizes:
            return False
        links = self.links
        # (a link held by a slotted config object: read by ``getattr``, ``links[3]``)
        if links[0] and not all(
            map(
                is_,
                map(_call, links[3], links[0], links[1], _NONE) if links[3] else map(dict.get, links[0], links[1]),
                links[2],
            )
        ):
            shared = self.shared[1]
            if shared[0] and not all(
                map(
                    is_,
                    map(_call, shared[3], shared[0], shared[1], _NONE)
                    if shared[3]
                    else map(dict.get, shared[0], shared[1]),
                    shared[2],
                )
            ):
                return False  # a module holding a shared config object given another one
            self._follow()
        return not self.lists or self._listed() == values[len(self.dicts) :]

    def _listed(self) -> tuple[Any, ...]:
        return tuple(_snapshot(get(d, k)) for d, k in self.lists)

    def now(self) -> tuple[Any, ...]:
        """The watched settings' values now (a list's as a tuple)."""
        if self.objs[0]:
            self._follow()
        plain = tuple(map(dict.get if self.plain else get, self.dicts, self.names))
        return plain + self._listed() if self.lists else plain

    def without(self, keep: list[bool]) -> Settings:
        """These settings less those not in ``keep`` (one a module and name)."""
        containers = self.dicts + tuple(d for d, _ in self.lists)
        keys = self.names + tuple(k for _, k in self.lists)
        entries = []
        for i, ref in enumerate(self.refs):
            module = ref()
            if keep[i] and module is not None:
                entries.append((module, self.labels[i], containers[i], keys[i], i >= len(self.dicts), self.paths[i][1]))
        found = Settings(entries, self.sized, self.shared[0])
        found.sizes, found.shared = self.sizes, self.shared  # as recorded
        found.links = _join(found.objs, found.shared[1])
        return found


def _resolve(state: dict[str, Any], keys: tuple[Any, ...]) -> Any:
    """The container of the config object ``keys`` lead to from a module's ``state`` ({}:
    none; :func:`config`)."""
    found: Any = state
    for key in keys:
        inner = config(get(found, key))
        found = {} if inner is None else inner
    return found


#: the links of config objects (:func:`_links`): the containers holding one, its key there,
#: the object, and None where every container is a dict (read by ``dict.get``), else each
#: one's reader (``dict.get`` or ``getattr``, given a default None)
Links = tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], "tuple[Any, ...] | None"]
_NONE: Final = itertools.repeat(None)


def _links(paths: tuple[Path, ...]) -> Links:
    """The links of ``paths`` to their config objects (:data:`Links`), each once: a
    replaced object at any level changes one."""
    links: dict[tuple[int, Any], tuple[Any, Any, Any]] = {}
    for state, keys in paths:
        holder: Any = state
        for key in keys or ():
            value = get(holder, key)
            links.setdefault((id(holder), key), (holder, key, value))
            inner = config(value)
            holder = {} if inner is None else inner
    found = tuple(links.values())
    readers = tuple(dict.get if type(x[0]) is dict else getattr for x in found)
    plain = all(r is dict.get for r in readers)
    return (
        tuple(x[0] for x in found),
        tuple(x[1] for x in found),
        tuple(x[2] for x in found),
        None if plain else readers,
    )


def _join(*links: Links) -> Links:
    """``links`` (:func:`_links`) as one."""
    joined = tuple(sum(parts, ()) for parts in zip(*(link[:3] for link in links), strict=True))
    if all(link[3] is None for link in links):
        return joined[0], joined[1], joined[2], None
    readers = sum((link[3] or (dict.get,) * len(link[0]) for link in links), ())
    return joined[0], joined[1], joined[2], readers


def _snapshot(value: Any) -> Any:
    return tuple(value) if type(value) is list else value
