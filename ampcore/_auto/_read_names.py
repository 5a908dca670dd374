"""The names a forward's code can read: which fields of a wide config are settings.

A config object or dict of options may hold far more fields than a forward picks its work
from (a ``transformers`` config: about a hundred, private ones included; a dict of a
hundred options).  :mod:`._settings` watches the first :data:`._settings._MAX_NAMES` of a
container and, past them, the fields whose names the code of the model can read
(:func:`read_names`): the attribute names and string constants of every function of the
user's classes of the root's modules and of the config's class (methods, properties,
nested functions and comprehensions), and of the user's module-level functions they name
(``transformers``' ``eager_attention_forward``), followed to :data:`_MAX_CODES` code
objects.  A settled root call compares those fields only (one C ``itemgetter`` a
container, as for the others): its cost grows with the fields the code names, not with the
container's size.  Not seen: a field read by a name computed at run time
(``getattr(cfg, f"layer_{i}")``) past the first fields.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any, Final

from ._setting_values import own

__all__ = ["read_names"]

#: the code objects followed from one class (a bound on the walk through a large package)
_MAX_CODES: Final = 4000
#: class -> the names its code can read (:func:`_class_names`)
_BY_CLASS: dict[type, frozenset[str]] = {}
#: a set of classes -> the names their code can read (:func:`read_names`), the latest few
_BY_SET: dict[frozenset[type], frozenset[str]] = {}
_MAX_SETS: Final = 64


def read_names(classes: Iterable[type]) -> frozenset[str]:
    """The names (attributes read, string constants) the code of ``classes`` can read (see
    the module); torch's classes and ``object`` hold none."""
    key = frozenset(classes)
    known = _BY_SET.get(key)
    if known is None:
        found: set[str] = set()
        for klass in {k for cls in key for k in cls.__mro__}:
            if klass is not object and own(klass):
                found |= _class_names(klass)
        if len(_BY_SET) >= _MAX_SETS:
            del _BY_SET[next(iter(_BY_SET))]
        known = _BY_SET[key] = frozenset(found)
    return known


def _class_names(cls: type) -> frozenset[str]:
    known = _BY_CLASS.get(cls)
    if known is None:
        funcs = [f for value in list(vars(cls).values()) for f in _functions(value)]
        known = _BY_CLASS[cls] = frozenset(_names(funcs))
    return known


def _functions(value: Any) -> list[types.FunctionType]:
    """The functions of a class attribute: a method, a property's accessors, a static or
    class method's function."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    found = [value.fget, value.fset] if isinstance(value, property) else [value]
    return [f for f in found if isinstance(f, types.FunctionType)]


def _names(start: list[types.FunctionType]) -> set[str]:
    """The names and string constants of the functions ``start``, of their nested code and
    of the user's functions they name in their module (see the module)."""
    found: set[str] = set()
    seen: set[int] = set()
    todo = [(f.__code__, f.__globals__) for f in start]
    while todo and len(seen) < _MAX_CODES:
        code, scope = todo.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        found.update(code.co_names)
        for const in code.co_consts:
            if type(const) is str:
                found.add(const)
            elif isinstance(const, types.CodeType):
                todo.append((const, scope))
        for name in code.co_names:
            func = scope.get(name)
            if isinstance(func, types.FunctionType) and _users(func):
                todo.append((func.__code__, func.__globals__))
    return found


def _users(func: types.FunctionType) -> bool:
    """Whether ``func`` is the user's (not torch's: its code reads no config of the user's)."""
    module = getattr(func, "__module__", None) or ""
    return not (module == "torch" or module.startswith("torch."))
