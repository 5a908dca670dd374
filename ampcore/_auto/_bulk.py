"""Hook-dict work on many modules at once, in C steps (issue 27, eleventh stop).

A settled region marks every root its place in the code knows (:func:`._root_hooks.mark`:
an ensemble's 20 models at each of its 20 regions a step), and a mixed program hooks each
switched and guarded module at every root call (:class:`._program.Running`).  Done in a
Python loop, each module took 25-35 bytecodes to hook and as many to unhook; here the loop
runs inside ``map`` and ``deque.extend`` (torch's hook dicts are ``OrderedDict`` objects:
``operator.setitem`` and ``methodcaller("pop", ...)`` go through their own methods).

Example::

    >>> import torch
    >>> layers = [torch.nn.Linear(2, 2), torch.nn.ReLU()]
    >>> key = object()
    >>> put(layers, WITH_KWARGS, key, True)
    >>> [key in m._forward_pre_hooks_with_kwargs for m in layers]
    [True, True]
    >>> drop(layers, WITH_KWARGS, key)
    >>> [len(m._forward_pre_hooks_with_kwargs) for m in layers]
    [0, 0]
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from itertools import repeat
from operator import attrgetter, is_not, methodcaller, setitem
from typing import Any, Final

__all__ = ["ALWAYS", "BULK", "FORWARD", "OWN_PRE", "WITH_KWARGS", "drop", "live", "put"]

#: modules from which the C steps cost less than a Python loop (two or three calls and their
#: set-up against about 25 bytecodes a module); a site of fewer roots, a program of fewer
#: hooked modules, keep the loop (no call: a settled region of one root adds none)
BULK: Final = 4

#: a module's hook dicts, read fresh each time (a module's dict may be replaced)
OWN_PRE: Final = attrgetter("_forward_pre_hooks")
WITH_KWARGS: Final = attrgetter("_forward_pre_hooks_with_kwargs")
FORWARD: Final = attrgetter("_forward_hooks")
ALWAYS: Final = attrgetter("_forward_hooks_always_called")

_DEREF: Final = weakref.ref.__call__
_LIVE: Final = partial(is_not, None)
_consume: Final[Callable[[Iterable[Any]], None]] = deque(maxlen=0).extend


def live(refs: Iterable[weakref.ref[Any]]) -> list[Any]:
    """The objects of ``refs`` still alive (a module whose ``__len__`` is 0 included)."""
    return [*filter(_LIVE, map(_DEREF, refs))]


def put(modules: list[Any], which: Callable[[Any], Any], key: Any, value: Any) -> None:
    """``which(m)[key] = value`` for each of ``modules`` (AttributeError: a module without the
    dict; TypeError: a dict that refuses the key; the modules before it are then set)."""
    _consume(map(setitem, map(which, modules), repeat(key), repeat(value)))


def drop(modules: list[Any], which: Callable[[Any], Any], key: Any) -> None:
    """``which(m).pop(key, None)`` for each of ``modules``."""
    _consume(map(methodcaller("pop", key, None), map(which, modules)))
