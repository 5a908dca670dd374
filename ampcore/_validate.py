"""The validators of values that enter ampcore: booleans of its public calls, and numbers
from the environment (``AmpcoreError`` naming the call, or the variable and its value)."""

from __future__ import annotations

__all__ = ["check_bool", "check_flags", "env_number"]

import math
import os
from collections.abc import Mapping

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


def env_number(
    name: str,
    default: float,
    unit: str,
    minimum: float = 0.0,
    environ: Mapping[str, str] | None = None,
) -> float:
    """The number environment variable ``name`` holds (``default`` when unset or blank):
    the one validator of numeric ``AMPCORE_*`` variables, as ``AMPCORE_CPU_IPEX`` is
    validated: anything but a finite number >= ``minimum`` raises ``AmpcoreError`` naming
    the variable and its value.

    Example::

        >>> env_number("AMPCORE_AUTO_BUDGET", 10.0, "seconds", environ={"AMPCORE_AUTO_BUDGET": "2.5"})
        2.5
        >>> env_number("AMPCORE_AUTO_BUDGET", 10.0, "seconds", environ={"AMPCORE_AUTO_BUDGET": "30s"})
        Traceback (most recent call last):
        ...
        ampcore._errors.AmpcoreError: AMPCORE_AUTO_BUDGET='30s': expected seconds as a finite number >= 0 (unset: 10)
    """
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw.strip()) if raw.strip().isascii() else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        raise AmpcoreError(
            f"{name}={raw!r}: expected {unit} as a finite number >= {minimum:g} (unset: {default:g})"
        )
    return value
