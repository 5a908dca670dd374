"""What a level built above the policy engine does when its regions are made, entered and
exited: level ``auto``'s module hooks (:mod:`ampcore._auto` registers them when it is
imported, which ``import ampcore`` does), so the policy engine never imports the layers
built on it.

Process-wide, like the module hooks they install: a level has one set of hooks.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["LevelHooks", "level_hooks", "register_level_hooks"]


class LevelHooks(Protocol):
    """The three calls :class:`ampcore.autocast` makes for a level that has hooks."""

    def check(self) -> None:
        """When a region is made, before anything changes: raise ``AmpcoreError`` for a
        setting the level cannot run with (``AMPCORE_AUTO_BUDGET=abc``)."""

    def region_entered(self) -> None:
        """An enabled region of the level was entered."""

    def region_exited(self) -> None:
        """An enabled region of the level exited."""


_hooks: dict[str, LevelHooks] = {}


def register_level_hooks(level: str, hooks: LevelHooks) -> None:
    """Make ``hooks`` the hooks of ``level`` (a canonical level name; replaces earlier ones).

    Example::

        >>> from ampcore._policy.level_hooks import level_hooks
        >>> level_hooks("auto") is not None, level_hooks("O1")
        (True, None)
    """
    _hooks[level] = hooks


def level_hooks(level: str) -> LevelHooks | None:
    """The hooks of ``level``, or None for a level the policy engine runs alone."""
    return _hooks.get(level)
