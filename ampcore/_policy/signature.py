"""The arguments of ``ampcore.autocast`` as three projects write them.

ampcore's keyword names are the reference; positional calls come in three orders, told
apart by the type of the first and third arguments (never by guessing from values):

* ampcore: ``autocast(device, dtype, level, enabled, cache_enabled, custom_white_list,
  custom_black_list)`` (first a device, third a level name);
* torch: ``torch.autocast(device_type, dtype, enabled, cache_enabled)`` (first a device,
  third a bool);
* Paddle: ``paddle.amp.auto_cast(enable, custom_white_list, custom_black_list, level,
  dtype, use_promote)`` (first a bool).

Keyword aliases: torch's ``device_type``, Paddle's ``enable`` and ``use_promote``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Final

import torch

from .._errors import AmpcoreError, AmpcoreWarning, closest, shown
from .._op_names import canonical_ops
from .lists import check_custom

__all__ = [
    "AMPCORE_ORDER", "DEFAULTS", "MADE", "PADDLE_ORDER", "TORCH_ORDER", "bind_arguments", "check_switches",
    "check_use_promote", "construction_key", "custom_lists", "remember",
]  # fmt: skip

_CALL: Final = "ampcore.autocast"
#: The keyword parameters of ``autocast.__init__`` and their defaults (:func:`bind_arguments` binds calls).
DEFAULTS: Final = {
    "device": None,
    "dtype": None,
    "level": "O1",
    "enabled": True,
    "cache_enabled": None,
    "custom_white_list": None,
    "custom_black_list": None,
}
_EMPTY: Final[frozenset[str]] = frozenset()
AMPCORE_ORDER: Final = (
    "device",
    "dtype",
    "level",
    "enabled",
    "cache_enabled",
    "custom_white_list",
    "custom_black_list",
)
TORCH_ORDER: Final = ("device", "dtype", "enabled", "cache_enabled")
PADDLE_ORDER: Final = ("enabled", "custom_white_list", "custom_black_list", "level", "dtype", "use_promote")
#: Other projects' keyword names -> ampcore's.
_ALIASES: Final = {"device_type": "device", "enable": "enabled"}
_ORDERS_HELP: Final = (
    "positional arguments are read in one of three orders: ampcore's (device, dtype, level, enabled, "
    "cache_enabled, custom_white_list, custom_black_list), torch.autocast's (device_type, dtype, enabled, "
    "cache_enabled: a bool third) or paddle.amp.auto_cast's (enable, custom_white_list, custom_black_list, "
    "level, dtype, use_promote: a bool first); pass the arguments by keyword to avoid any doubt"
)


def _order(args: tuple[Any, ...]) -> tuple[str, tuple[str, ...]]:
    """The name and parameter order of a positional call, from the types of its arguments."""
    first = args[0]
    if isinstance(first, bool):
        return "paddle.amp.auto_cast", PADDLE_ORDER
    if not (first is None or isinstance(first, (str, torch.device))):
        raise AmpcoreError(
            f"{_CALL}({shown(first)}, ...): the first positional argument must be a device (a name such as "
            f"'cuda', a torch.device or None) or Paddle's enable (True/False), got {type(first).__name__}; "
            + _ORDERS_HELP
        )
    if len(args) > 2 and isinstance(args[2], bool):
        return "torch.autocast", TORCH_ORDER
    if len(args) > 2 and not isinstance(args[2], str):
        raise AmpcoreError(
            f"{_CALL}(device, dtype, {shown(args[2])}, ...): the third positional argument is ampcore's level "
            f"(a name such as 'O1') or torch's enabled (True/False), got {type(args[2]).__name__}; " + _ORDERS_HELP
        )
    return "ampcore.autocast", AMPCORE_ORDER


def _bind_positional(args: tuple[Any, ...]) -> dict[str, Any]:
    """Name the positional arguments ``args`` by the order their types say."""
    where, order = _order(args)
    if len(args) > len(order):
        raise AmpcoreError(
            f"{_CALL}() takes at most {len(order)} positional arguments in {where}'s order "
            f"({', '.join(order)}); got {len(args)}: pass the rest by keyword"
        )
    return dict(zip(order, args, strict=False))


def bind_arguments(args: tuple[Any, ...], keywords: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter of ``autocast`` (``defaults``' names plus ``use_promote``) from a call's
    positional ``args`` and its ``keywords`` (aliases included); AmpcoreError naming what is wrong.

    ``keywords`` hold the keyword parameters' values as bound (defaults where not given):
    a parameter given positionally and by keyword (with a value other than the default) raises.
    """
    values = dict(keywords)
    extra = {name: values.pop(name) for name in list(values) if name not in defaults}
    values["use_promote"] = None
    for name, value in _bind_positional(args).items() if args else ():
        if name in defaults and values[name] is not defaults[name] and values[name] != defaults[name]:
            raise AmpcoreError(f"{_CALL}(): {name!r} was given twice, by position and by keyword; give it once")
        values[name] = value
    for name, value in extra.items():
        canonical = _ALIASES.get(name, name if name == "use_promote" else None)
        if canonical is None:
            valid = [*defaults, "use_promote"]
            hints = closest(name, [*valid, *_ALIASES])
            raise AmpcoreError(
                f"{_CALL}({name}=...): unknown keyword argument"
                + (f"; did you mean {', '.join(repr(h) for h in hints)}?" if hints else "")
                + f" Valid: {', '.join(valid)} (and the aliases {', '.join(_ALIASES)})"
            )
        if canonical != "use_promote" and values[canonical] != defaults[canonical]:
            raise AmpcoreError(f"{_CALL}({canonical}=..., {name}=...): give {canonical} once")
        if canonical == "use_promote" and values["use_promote"] is not None:
            raise AmpcoreError(f"{_CALL}(): 'use_promote' was given twice, by position and by keyword; give it once")
        values[canonical] = value
    return values


def check_use_promote(use_promote: object, level: str) -> None:
    """Paddle's ``use_promote``: accepted (a bool); at O2, ``True`` warns that ampcore's O2
    does not promote (every op off the black list runs in the low-precision dtype)."""
    if use_promote is None:
        return
    if not isinstance(use_promote, bool):
        raise AmpcoreError(f"{_CALL}(use_promote={shown(use_promote)}): expected True or False (Paddle's option)")
    if use_promote and level == "O2":
        warnings.warn(
            f"{_CALL}(level='O2', use_promote=True): ampcore's O2 does not promote ops with float32 inputs "
            "to float32 (Paddle's use_promote): every op off the black list runs in the low-precision dtype, "
            "as Paddle's use_promote=False. Keep ops float32 with custom_black_list (docs/levels.md).",
            AmpcoreWarning,
            stacklevel=4,
        )


def check_switches(enabled: object, cache_enabled: object) -> None:
    """``enabled`` must be a bool, ``cache_enabled`` a bool or None (never a truthy value)."""
    if not isinstance(enabled, bool):
        raise AmpcoreError(f"{_CALL}(enabled={shown(enabled)}): expected True or False")
    if cache_enabled is not None and not isinstance(cache_enabled, bool):
        raise AmpcoreError(f"{_CALL}(cache_enabled={shown(cache_enabled)}): expected True, False or None")


def custom_lists(
    white_list: Iterable[str] | None, black_list: Iterable[str] | None
) -> tuple[frozenset[str], frozenset[str]]:
    """The custom white and black lists as canonical op names; no op in both."""
    if white_list is None and black_list is None:
        return _EMPTY, _EMPTY
    white = canonical_ops(white_list, _CALL, "custom_white_list")
    black = canonical_ops(black_list, _CALL, "custom_black_list")
    check_custom(white, black, _CALL)
    return white, black


#: Constructions validated in this process (:func:`construction_key` -> the attributes they
#: set): a region built again with the same arguments skips the checks and the policy lookup.
MADE: dict[tuple[Any, ...], dict[str, Any]] = {}
_MAX_MADE: Final = 256

#: Argument types a region's construction may be remembered by (hashable, read in full;
#: exact types, so that ``1`` is never taken for ``True``).
_KEY_TYPES: Final = frozenset({str, torch.device, torch.dtype, type(None)})
_FLAG_TYPES: Final = frozenset({bool, type(None)})
_LIST_TYPES: Final = frozenset({set, frozenset, list, tuple})
_NAME_TYPES: Final = frozenset({str})


def construction_key(
    device: Any,
    dtype: Any,
    level: Any,
    enabled: Any,
    cache_enabled: Any,
    white: Any,
    black: Any,
    generation: int,
    args: tuple[Any, ...] = (),
    aliases: dict[str, Any] | None = None,
) -> tuple[Any, ...] | None:
    """A key that identifies a construction of ``ampcore.autocast`` (its arguments, the
    plugin manager's ``generation``, and for a call that also gave ``args`` positionally or
    ``aliases`` (``device_type=``, ``enable=``...) the call's form, which decides how the
    arguments bind), or None where an argument cannot be keyed (an iterator would be
    consumed, an unhashable or unusual value is validated the long way, the call warns:
    ``use_promote``).  Called on every construction: type checks only, no Python calls.

    Example::

        >>> key = construction_key(None, None, "O1", True, None, None, None, 0, ("cpu",))
        >>> key == construction_key(None, None, "O1", True, None, None, None, 0, ("cpu",))
        True
        >>> construction_key(None, None, "O1", True, None, None, None, 0, (["add"],)) is None
        True
    """
    if (
        type(device) not in _KEY_TYPES
        or type(dtype) not in _KEY_TYPES
        or type(level) is not str
        or type(enabled) is not bool
        or type(cache_enabled) not in _FLAG_TYPES
    ):
        return None
    if white is None and black is None:
        key: tuple[Any, ...] = (device, dtype, level, enabled, cache_enabled, generation)
    else:
        if white is not None:
            if type(white) not in _LIST_TYPES or not _NAME_TYPES.issuperset(map(type, white)):
                return None
            white = frozenset(white)
        if black is not None:
            if type(black) not in _LIST_TYPES or not _NAME_TYPES.issuperset(map(type, black)):
                return None
            black = frozenset(black)
        key = (device, dtype, level, enabled, cache_enabled, generation, white, black)
    if not args and not aliases:
        return key
    if len(args) > 5 or not _CALLED_TYPES.issuperset(map(type, args)):  # Paddle's sixth: use_promote
        return None
    if aliases and ("use_promote" in aliases or not _CALLED_TYPES.issuperset(map(type, aliases.values()))):
        return None
    return (key, args, tuple(aliases.items()) if aliases else ())


#: values a positional argument or an alias may have in a key (the device, the dtype, the
#: flags, the level): anything else (a list, an unusual object) is validated the long way
_CALLED_TYPES: Final = frozenset({str, torch.device, torch.dtype, type(None), bool})


def remember(key: tuple[Any, ...], attributes: dict[str, Any]) -> None:
    """Remember the attributes a validated construction set (at most :data:`_MAX_MADE`)."""
    if len(MADE) >= _MAX_MADE:
        MADE.clear()
    MADE[key] = dict(attributes)
