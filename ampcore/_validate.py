"""The one bool validator of ampcore's public calls (``AmpcoreError`` naming the call)."""

from __future__ import annotations

__all__ = ["check_bool", "check_flags"]

from ._errors import AmpcoreError, shown


def check_bool(call: str, name: str, value: object, expected: str = "True or False") -> bool:
    """``value`` if it is a bool; else raise ``AmpcoreError`` "``call(name=value): expected ...``".

    Example::

        >>> check_bool("ampcore.decorate", "master_grad", 1)
        Traceback (most recent call last):
        ...
        ampcore._errors.AmpcoreError: ampcore.decorate(master_grad=1): expected True or False
    """
    if not isinstance(value, bool):
        raise AmpcoreError(f"{call}({name}={shown(value)}): expected {expected}")
    return value


def check_flags(call: str, **flags: object) -> None:
    """:func:`check_bool` for each keyword, in order."""
    for name, value in flags.items():
        check_bool(call, name, value)
