"""Thread-local autocast state: the stack of active ``ampcore.autocast`` regions.

This is ampcore's only mutable global state.  torch keeps its own autocast flags
thread-local too, so a region entered in one thread changes nothing in another.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._backend import Backend
    from ._levels import Level

__all__ = ["AutocastFrame", "current_frame", "pop_frame", "push_frame"]


@dataclass(frozen=True)
class AutocastFrame:
    """One active ``ampcore.autocast`` region of the current thread."""

    backend: Backend
    dtype: torch.dtype
    level: Level
    enabled: bool


class _Frames(threading.local):
    def __init__(self) -> None:
        self.stack: list[AutocastFrame] = []


_frames = _Frames()


def push_frame(frame: AutocastFrame) -> None:
    _frames.stack.append(frame)


def pop_frame() -> None:
    _frames.stack.pop()


def current_frame(device_type: str | None = None) -> AutocastFrame | None:
    """The innermost active region of this thread (of ``device_type`` if given), or None."""
    stack = _frames.stack
    for frame in reversed(stack):
        if device_type is None or frame.backend.device_type == device_type:
            return frame
    return None
