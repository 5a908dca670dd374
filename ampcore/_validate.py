"""The validators of every value that enters ampcore: arguments, and values read from files,
plugins, environment variables and the command line (``AmpcoreError`` naming the source).

A value is named ``call(name=value)`` when it is an argument, and ``source: name = value``
(``entry=True``) when it was read from somewhere else (``manifest m.toml [tolerances]:
op_eps = nan``); the message then says what was expected, the whole valid range included.
Numeric ``AMPCORE_*`` environment variables go through :func:`env_number`.
"""

from __future__ import annotations

__all__ = [
    "FLOAT32_MAX",
    "FLOAT32_TINY",
    "INT32_MAX",
    "check_bool",
    "check_flags",
    "check_integer",
    "check_real",
    "env_number",
    "subject",
]

import math
import numbers
import os
from collections.abc import Mapping
from typing import Final

from ._errors import AmpcoreError, shown

#: The largest finite float32 (loss scales live in float32 tensors).
FLOAT32_MAX: Final = 3.4028234663852886e38
#: The smallest normal float32: a scale below it loses precision, and under 2**-149 is 0.
FLOAT32_TINY: Final = 1.1754943508222875e-38
#: The largest int32 (the scaler's step counters are int32 tensors).
INT32_MAX: Final = 2**31 - 1


def subject(call: str, name: str, value: object, entry: bool = False) -> str:
    """How a message names a value: ``call(name=value)``, or ``call: name = value`` for an
    ``entry`` read from a file, a variable or an option.

    Example::

        >>> subject("ampcore.GradScaler", "hysteresis", 0), subject("m.toml [tolerances]", "op_eps", 0, entry=True)
        ('ampcore.GradScaler(hysteresis=0)', 'm.toml [tolerances]: op_eps = 0')
    """
    text = shown(value, limit=60)
    return f"{call}: {name} = {text}" if entry else f"{call}({name}={text})"


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
        raise AmpcoreError(f"{name}={raw!r}: expected {unit} as a finite number >= {minimum:g} (unset: {default:g})")
    return value


class _TooLarge:
    def __repr__(self) -> str:
        return "<a number too large for a float>"


_TOO_LARGE: Final = _TooLarge()


def _range(low: float | None, high: float | None, low_open: bool) -> str:
    if low is None and high is None:
        return ""
    left = "-inf" if low is None else f"{low:g}"
    right = "inf)" if high is None else f"{high:g}]"
    return f" in {'(' if low is None or low_open else '['}{left}, {right}"


def check_real(
    call: str,
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    allow_none: bool = False,
    entry: bool = False,
) -> float | None:
    """``value`` as a finite float within ``[low, high]`` (``(low, high]`` when ``low_open``);
    ``None`` passes when allowed.  Bools, strings, non-finite numbers and numbers too large
    for a float (``10**400``) raise :class:`AmpcoreError` naming the value and the range.

    Example::

        >>> check_real("ampcore.GradScaler", "init_scale", 10**400, low=0, low_open=True)
        Traceback (most recent call last):
        ...
        ampcore._errors.AmpcoreError: ampcore.GradScaler(init_scale=<a number too large for a float>): expected a positive finite number
    """  # noqa: E501 - a doctest shows the whole one-line message
    if value is None and allow_none:
        return None
    if low == 0 and low_open:
        expected = "a positive finite number" + ("" if high is None else f" up to {high:g}")
    else:
        expected = "a finite number" + _range(low, high, low_open)
    expected += " or None" if allow_none else ""
    number = None
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            number = float(value)
        except (OverflowError, ValueError, TypeError):  # 10**400: too large for math.isfinite too
            raise AmpcoreError(f"{subject(call, name, _TOO_LARGE, entry)}: expected {expected}") from None
    if (
        number is None
        or not math.isfinite(number)
        or (low is not None and (number < low or (low_open and number == low)))
        or (high is not None and number > high)
    ):
        raise AmpcoreError(f"{subject(call, name, value, entry)}: expected {expected}")
    return number


def check_integer(
    call: str, name: str, value: object, minimum: int, maximum: int | None = None, entry: bool = False
) -> int:
    """``value`` as an int in ``[minimum, maximum]``; bools, floats and strings raise
    :class:`AmpcoreError` naming the value and the range.

    Example::

        >>> check_integer("ampcore.GradScaler", "growth_interval", 10**20, 1, INT32_MAX)
        Traceback (most recent call last):
        ...
        ampcore._errors.AmpcoreError: ampcore.GradScaler(growth_interval=100000000000000000000): expected an int in [1, 2147483647]
    """  # noqa: E501 - a doctest shows the whole one-line message
    number = None if isinstance(value, bool) or not isinstance(value, numbers.Integral) else int(value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        expected = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
        raise AmpcoreError(f"{subject(call, name, value, entry)}: expected {expected}")
    return number
