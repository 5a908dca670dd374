"""Thread-local autocast state: the stack of active ``ampcore.autocast`` regions.

This is ampcore's only mutable global state.  torch keeps its own autocast flags
thread-local too, so a region entered in one thread changes nothing in another.

Besides the stack, each thread holds the op *policy* in force per device type (``None``
or absent: the native ``torch.autocast`` lists, so ampcore's dispatcher kernels behave
exactly like torch's) and the weight-cast cache of its ampcore regions.  The policy
kernels of :mod:`ampcore._dispatch` read both on every call.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from ._backend import Backend
    from ._levels import Level

__all__ = ["AutocastFrame", "ThreadState", "current_frame", "pop_frame", "push_frame", "thread_state"]


class AutocastFrame(NamedTuple):
    """One active ``ampcore.autocast`` region of the current thread (immutable; a named
    tuple because regions are entered on the hot path).

    ``custom_white`` / ``custom_black`` are the region's custom lists merged with those of
    the enclosing region; ``policy`` is the policy its ops follow (``None``: torch's own).
    """

    backend: Backend
    dtype: torch.dtype
    level: Level
    enabled: bool
    custom_white: frozenset[str] = frozenset()
    custom_black: frozenset[str] = frozenset()
    policy: Any = None


class ThreadState(threading.local):
    """Per-thread state: region stack, active policy per device type, weight-cast cache."""

    def __init__(self) -> None:
        self.stack: list[AutocastFrame] = []
        self.policies: dict[str, Any] = {}
        self.cast_cache: dict[tuple[int, torch.dtype], tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}


_state = ThreadState()


def thread_state() -> ThreadState:
    """The calling thread's state (the object itself is shared; its attributes are per thread)."""
    return _state


def push_frame(frame: AutocastFrame) -> None:
    _state.stack.append(frame)


def pop_frame() -> None:
    stack = _state.stack
    stack.pop()
    if not stack and _state.cast_cache:
        _state.cast_cache.clear()


def current_frame(device_type: str | None = None) -> AutocastFrame | None:
    """The innermost active region of this thread (of ``device_type`` if given), or None."""
    stack = _state.stack
    for frame in reversed(stack):
        if device_type is None or frame.backend.device_type == device_type:
            return frame
    return None
