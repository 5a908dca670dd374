"""Copies of auto's keys in a module's hook dicts: what a module copied while hooked holds.

``copy.deepcopy`` and pickling copy a module's hook dicts with their keys and values.  Every
key of ours (a thread's root keys, its deferral key, a running program's
:class:`~._program.Running`) copies as a :class:`Stale`: the copy's entries under it are
strays, dropped by :func:`drop_strays` at the copy's next call (the stray hook itself, the
sentinel, or as it becomes a root).  A ``Running`` copied as its key would have copied the
program, its plan and the region with it (``deepcopy`` raised on the region's backend
module; pickling on the plan's weak references).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["Stale", "drop_strays"]

_HOOK_DICTS: Final = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


class Stale:
    """A copy of a key of ours.  A copied run's hooks are its methods in a pickled copy (the
    bound methods pickle as the key's attribute): each drops the strays; a deep copy binds
    ``Running``'s own to it, which do the same for a key that is not a run (``pushed``:
    none of its modules switched)."""

    __slots__ = ()
    pushed: Final = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Stale, ())

    def _pre(self, module: Any, args: Any) -> None:
        drop_strays(module)

    _guard = _pre

    def _post(self, module: Any, args: Any, output: Any = None) -> None:
        drop_strays(module)


def drop_strays(module: Any) -> None:
    """Drop the entries of ``module``'s hook dicts under :class:`Stale` keys, and those
    whose hook is bound to one (a run's hooks registered through torch's public API, under
    handle ids), with the same keys' entries in its other hook dicts."""
    dicts = [hooks for name in _HOOK_DICTS if (hooks := getattr(module, name, None))]
    stray = {k for hooks in dicts for k, v in hooks.items() if type(k) is Stale or type(_bound(v)) is Stale}
    for hooks in dicts:
        for key in stray & hooks.keys():
            del hooks[key]


def _bound(hook: Any) -> Any:
    return getattr(hook, "__self__", None)
