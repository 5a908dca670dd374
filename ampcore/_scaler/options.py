"""The settings of :class:`ampcore.GradScaler`: validation and Paddle's parameter names."""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, Final, ParamSpec, TypeVar, cast

from .._errors import AmpcoreError, closest
from .._validate import FLOAT32_MAX, FLOAT32_TINY, INT32_MAX, check_bool, check_integer, check_real

__all__ = [
    "PADDLE_OPTION_NAMES",
    "ScalerOptions",
    "accepts_paddle_option_names",
    "check_bool",
    "check_int",
    "check_number",
    "check_scale",
]

#: Paddle's ``paddle.amp.GradScaler`` parameter names and the ampcore names they stand for.
PADDLE_OPTION_NAMES: Final[Mapping[str, str]] = {
    "init_loss_scaling": "init_scale",
    "incr_ratio": "growth_factor",
    "decr_ratio": "backoff_factor",
    "incr_every_n_steps": "growth_interval",
    "decr_every_n_nan_or_inf": "hysteresis",
    "use_dynamic_loss_scaling": "dynamic",
    "enable": "enabled",
}

P = ParamSpec("P")
S = TypeVar("S")


def accepts_paddle_option_names(init: Callable[Concatenate[S, P], None]) -> Callable[Concatenate[S, P], None]:
    """Let ``init`` (a constructor) also take Paddle's names for its keyword parameters.

    The wrapper sees exactly the keywords the caller wrote, so a parameter given under both
    names raises even when both values equal the default, and an unknown keyword gets a
    did-you-mean hint instead of a bare ``TypeError``.
    """
    known = set(inspect.signature(init).parameters) - {"self"}

    @functools.wraps(init)
    def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> None:
        call = f"ampcore.{type(self).__name__}"
        if args:
            args, kwargs = _paddle_positional(call, args, kwargs)  # type: ignore[assignment]
        translated: dict[str, Any] = {}
        for name, value in kwargs.items():
            canonical = PADDLE_OPTION_NAMES.get(name, name)
            if canonical not in known:
                hint = closest(name, [*known, *PADDLE_OPTION_NAMES], n=1, same_first_word=True)
                raise AmpcoreError(
                    f"{call}({name}=...): unknown parameter"
                    + (f" (did you mean {hint[0]!r}?)" if hint else "")
                    + f"; parameters: {', '.join(sorted(known))}; Paddle aliases: "
                    + ", ".join(f"{alias} -> {target}" for alias, target in PADDLE_OPTION_NAMES.items())
                )
            if canonical in translated:
                raise AmpcoreError(
                    f"{call}(): {canonical!r} was given twice, once under its Paddle name "
                    f"{[a for a, c in PADDLE_OPTION_NAMES.items() if c == canonical][0]!r}; pass only one of them"
                )
            translated[canonical] = value
        try:
            init(self, *args, **translated)
        except AmpcoreError as exc:
            aliases = [(name, PADDLE_OPTION_NAMES[name]) for name in kwargs if name in PADDLE_OPTION_NAMES]
            named = [(alias, target) for alias, target in aliases if f"{target}=" in str(exc)]
            if type(exc) is not AmpcoreError or not named:
                raise
            note = "; ".join(f"{alias} is Paddle's name for {target}" for alias, target in named)
            raise AmpcoreError(f"{exc} ({note})") from None

    return cast("Callable[Concatenate[S, P], None]", wrapper)  # functools.wraps types it as _Wrapped


#: ``paddle.amp.GradScaler``'s positional order (after ``self``).
PADDLE_POSITIONAL: Final = (
    "enable",
    "init_loss_scaling",
    "incr_ratio",
    "decr_ratio",
    "incr_every_n_steps",
    "decr_every_n_nan_or_inf",
    "use_dynamic_loss_scaling",
)


def _paddle_positional(
    call: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional arguments in Paddle's order (a bool first: ``GradScaler(True, 1024)``) as
    Paddle's keywords; ampcore's order (the device first) unchanged; a number first raises."""
    first = args[0]
    if isinstance(first, bool):
        if len(args) > len(PADDLE_POSITIONAL):
            raise AmpcoreError(
                f"{call}() takes at most {len(PADDLE_POSITIONAL)} positional arguments in Paddle's order "
                f"({', '.join(PADDLE_POSITIONAL)}); got {len(args)}"
            )
        named = dict(zip(PADDLE_POSITIONAL, args, strict=False))
        twice = sorted(set(named) & set(kwargs))
        if twice:
            raise AmpcoreError(f"{call}(): {twice[0]!r} was given twice, by position and by keyword; give it once")
        return (), {**named, **kwargs}
    if isinstance(first, numbers.Number):
        raise AmpcoreError(
            f"{call}({first!r}, ...): the first positional argument is the device (ampcore's order) or, in "
            "Paddle's order, enable (True/False): GradScaler(True, 1024); or pass init_loss_scaling=... "
            "(init_scale=...) by keyword"
        )
    return args, kwargs


def check_number(call: str, name: str, value: object, *, allow_none: bool = False) -> float | None:
    """``value`` as a finite float (``None`` passes when allowed); raise for anything else,
    numbers too large for a float (``10**400``) included."""
    return check_real(call, name, value, allow_none=allow_none)


def check_scale(call: str, name: str, value: object, *, allow_none: bool = False) -> float | None:
    """``value`` as a loss scale: a positive number a float32 holds (the scale lives in a
    float32 tensor: a larger one would be inf, a tiny one 0), or ``None`` when allowed."""
    scale = check_real(call, name, value, low=0.0, high=FLOAT32_MAX, low_open=True, allow_none=allow_none)
    if scale is not None and scale < FLOAT32_TINY:
        raise AmpcoreError(
            f"{call}({name}={value!r}): expected a positive finite number from {FLOAT32_TINY:g} up to "
            f"{FLOAT32_MAX:g} (the scale is kept in float32)"
        )
    return scale


def check_int(call: str, name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; raise for anything else (bools included)."""
    return check_integer(call, name, value, minimum, maximum)


@dataclass(frozen=True)
class ScalerOptions:
    """The validated settings of one scaler (see :class:`ampcore.GradScaler` for meanings)."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    hysteresis: int
    min_scale: float | None
    max_scale: float | None
    dynamic: bool
    raise_at_min_scale: bool

    @classmethod
    def create(cls, call: str, **values: Any) -> ScalerOptions:
        """Check every value and the relations between them; raise :class:`AmpcoreError`."""
        growth = check_number(call, "growth_factor", values["growth_factor"])
        backoff = check_number(call, "backoff_factor", values["backoff_factor"])
        init = check_scale(call, "init_scale", values["init_scale"])
        min_scale = check_scale(call, "min_scale", values["min_scale"], allow_none=True)
        max_scale = check_scale(call, "max_scale", values["max_scale"], allow_none=True)
        if growth is None or growth <= 1.0:
            raise AmpcoreError(f"{call}(growth_factor={growth!r}): the growth factor must be > 1.0")
        if backoff is None or not 0.0 < backoff < 1.0:
            raise AmpcoreError(f"{call}(backoff_factor={backoff!r}): the backoff factor must be in (0, 1)")
        if min_scale is not None and max_scale is not None and min_scale > max_scale:
            raise AmpcoreError(
                f"{call}(min_scale={min_scale!r}, max_scale={max_scale!r}): min_scale must not exceed max_scale"
            )
        if init is None:  # check_scale allows None only when asked to
            raise AmpcoreError(f"{call}(init_scale=None): expected a positive number")
        if (min_scale is not None and init < min_scale) or (max_scale is not None and init > max_scale):
            raise AmpcoreError(
                f"{call}(init_scale={init!r}): outside [min_scale, max_scale] = [{min_scale}, {max_scale}]; "
                "pass an init_scale within the bounds"
            )
        raise_at_min = check_bool(call, "raise_at_min_scale", values["raise_at_min_scale"])
        if raise_at_min and min_scale is None:
            raise AmpcoreError(
                f"{call}(raise_at_min_scale=True, min_scale=None): raising at the minimum scale needs a "
                "minimum; pass min_scale (e.g. min_scale=1.0)"
            )
        return cls(
            init_scale=init,
            growth_factor=growth,
            backoff_factor=backoff,
            # the step counters are int32 tensors: a larger limit could never be reached
            growth_interval=check_int(call, "growth_interval", values["growth_interval"], 1, INT32_MAX),
            hysteresis=check_int(call, "hysteresis", values["hysteresis"], 1, INT32_MAX),
            min_scale=min_scale,
            max_scale=max_scale,
            dynamic=check_bool(call, "dynamic", values["dynamic"]),
            raise_at_min_scale=raise_at_min,
        )

    def with_values(self, call: str, **changes: Any) -> ScalerOptions:
        """A copy with ``changes`` applied and checked again (``self`` is never changed)."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        return ScalerOptions.create(call, **values)

    def in_bounds(self, scale: float) -> bool:
        """Whether ``scale`` lies in ``[min_scale, max_scale]``."""
        return (self.min_scale is None or scale >= self.min_scale) and (
            self.max_scale is None or scale <= self.max_scale
        )
