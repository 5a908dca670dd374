"""Which attributes of a module may keep layers outside its registered children: the
non-empty lists, tuples and dicts of its ``__dict__`` (:func:`candidates`), which the guard
of a program looks into (:func:`._guard.snapshot`: layers kept in a plain list are guarded
too).

This runs for every module of a root whenever a program is made for it: at a recording, and
for each copy of a root that takes the program kept for its source (``copy.deepcopy`` of an
EMA or a teacher each step, a replica as ``nn.DataParallel`` makes one: :mod:`._twins`).  A
module's ``__dict__`` is mostly torch's own: about fifteen dicts of hooks (empty in nearly
every module), beside a few attributes of its class.  So per *layout* (the module's class and
the names in its ``__dict__``, kept) the attributes are split once into torch's dicts
(:data:`QUIET`: looked at with one C call, all at once, and one by one only where one is not
empty) and the others (each looked at); the answer is the one a look at every attribute
gives (issue 27, fifteenth stop: about a third of the guard's cost on a copy of a 2-layer
encoder).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Final

from torch import nn

__all__ = ["CONTAINERS", "QUIET", "REGISTERED", "candidates"]

CONTAINERS: Final = (list, tuple, dict)
#: what a module registers (children, parameters, buffers): the module tree itself, not a container
REGISTERED: Final = frozenset({"_modules", "_parameters", "_buffers"})
#: the dicts ``nn.Module.__init__`` makes besides those (hooks, state-dict hooks)
QUIET: Final = frozenset(k for k, v in vars(nn.Module()).items() if isinstance(v, dict)) - REGISTERED

#: layout (class, names in its ``__dict__``) -> (a getter of its :data:`QUIET` values, or
#: None; the places and names of its other attributes; of every attribute but
#: :data:`REGISTERED`)
_layouts: dict[tuple[type, tuple[str, ...]], tuple[Any, tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]] = {}
#: layouts kept (all dropped beyond: a stream of new classes)
_MAX_LAYOUTS: Final = 1024


def candidates(module: nn.Module) -> list[tuple[str, Any]]:
    """The attributes of ``module`` (name, value) that are non-empty lists, tuples or dicts,
    but its registered children, parameters and buffers: those that may keep layers.

    Example::

        >>> m = nn.Linear(2, 2)
        >>> m.blocks = [nn.ReLU()]
        >>> [name for name, _ in candidates(m)]
        ['blocks']
        >>> _ = m.register_forward_hook(lambda *a: None)
        >>> sorted(name for name, _ in candidates(m))
        ['_forward_hooks', 'blocks']
    """
    state = module.__dict__
    names = tuple(state)
    key = (type(module), names)
    layout = _layouts.get(key)
    if layout is None:
        if len(_layouts) >= _MAX_LAYOUTS:
            _layouts.clear()
        layout = _layouts[key] = _layout(names)
    quiet, rest, every = layout
    values = tuple(state.values())
    if quiet is not None and any(quiet(values)):  # a hook of some kind registered: every attribute
        rest = every
    return [(name, value) for i, name in rest if isinstance(value := values[i], CONTAINERS) and value]


def _layout(names: tuple[str, ...]) -> tuple[Any, tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]:
    every = tuple((i, name) for i, name in enumerate(names) if name not in REGISTERED)
    quiet = [i for i, name in every if name in QUIET]
    rest = tuple((i, name) for i, name in every if name not in QUIET)
    # (a tuple also for one place: it twice)
    return (itemgetter(*quiet, quiet[0]) if quiet else None), rest, every
