"""AMP levels: O0 (fp32), OD (white list only), O1 (torch.autocast), O2 (low-precision model),
auto (O1 lists; each planned module in low precision only where measured costs say it pays)."""

from __future__ import annotations

from typing import Final, Literal

from .._errors import AmpcoreError, shown

__all__ = ["LEVELS", "Level", "check_level"]

#: The name of an AMP level, as ``ampcore.autocast(level=...)`` and ``ampcore.decorate``
#: take it: ``"O0"`` float32, ``"OD"`` the white list only, ``"O1"`` torch.autocast's
#: lists, ``"O2"`` a low-precision model with float32 master weights, ``"auto"`` measured
#: per module (docs/levels.md).  Paddle's lower-case spellings are accepted and normalised
#: by :func:`check_level`, e.g. ``check_level("o2") == "O2"``.
Level = Literal["O0", "OD", "O1", "O2", "auto"]

#: Every level, from no mixed precision to the most aggressive.
LEVELS: Final[tuple[Level, ...]] = ("O0", "OD", "O1", "O2", "auto")

_CANONICAL: Final[dict[str, Level]] = {level.upper(): level for level in LEVELS}


def check_level(level: object, call: str = "ampcore.autocast") -> Level:
    """Validate a level name (case-insensitive, Paddle spelling) and return its canonical
    spelling.

    Example::

        >>> check_level("o1")
        'O1'
        >>> check_level("AUTO")
        'auto'
    """
    if isinstance(level, str) and level.upper() in _CANONICAL:
        return _CANONICAL[level.upper()]
    raise AmpcoreError(f"{call}(level={shown(level)}): invalid level; valid levels: {', '.join(LEVELS)}")
