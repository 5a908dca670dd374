"""State dicts of :class:`ampcore.GradScaler`: building, validating, and torch's format.

An ampcore state dict is a superset of ``torch.amp.GradScaler``'s: the five keys torch
writes, with the same names and meanings, plus ampcore's own settings and counter.  So
``torch.amp.GradScaler.load_state_dict`` reads ours (it looks up its five keys and ignores
the rest) and ours reads torch's (keeping its own settings for the keys torch lacks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .._errors import AmpcoreError
from .options import ScalerOptions, check_int, check_scale

__all__ = ["AMPCORE_KEYS", "PADDLE_KEYS", "TORCH_KEYS", "ScalerState", "build_state_dict", "parse_state_dict"]

#: The keys of ``torch.amp.GradScaler.state_dict()`` (same names and meanings in ours).
TORCH_KEYS: Final = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
#: The keys only ampcore writes.
AMPCORE_KEYS: Final = (
    "hysteresis",
    "_overflow_tracker",
    "min_scale",
    "max_scale",
    "dynamic",
    "raise_at_min_scale",
)

#: The keys of ``paddle.amp.GradScaler.state_dict()`` and the ampcore keys they load into
#: (Paddle's ``scale`` is a one-element array; ``loss_scaling`` is accepted for it).
PADDLE_KEYS: Final = {
    "scale": "scale",
    "incr_ratio": "growth_factor",
    "decr_ratio": "backoff_factor",
    "incr_every_n_steps": "growth_interval",
    "decr_every_n_nan_or_inf": "hysteresis",
    "incr_count": "_growth_tracker",
    "decr_count": "_overflow_tracker",
    "use_dynamic_loss_scaling": "dynamic",
}
#: Keys only Paddle writes: a dict holding any of them is read as Paddle's.
_PADDLE_ONLY: Final = frozenset(PADDLE_KEYS) - {"scale"} | {"loss_scaling"}


@dataclass(frozen=True)
class ScalerState:
    """Everything a state dict restores: the settings, the scale and both counters."""

    options: ScalerOptions
    scale: float
    growth_tracker: int
    overflow_tracker: int


def build_state_dict(state: ScalerState) -> dict[str, Any]:
    """The state dict of ``state`` (plain Python values, ``torch.save``-able)."""
    options = state.options
    return {
        "scale": state.scale,
        "growth_factor": options.growth_factor,
        "backoff_factor": options.backoff_factor,
        "growth_interval": options.growth_interval,
        "_growth_tracker": state.growth_tracker,
        "hysteresis": options.hysteresis,
        "_overflow_tracker": state.overflow_tracker,
        "min_scale": options.min_scale,
        "max_scale": options.max_scale,
        "dynamic": options.dynamic,
        "raise_at_min_scale": options.raise_at_min_scale,
    }


def _key_error(call: str, keys: set[str]) -> AmpcoreError:
    ours = set(TORCH_KEYS) | set(AMPCORE_KEYS)
    closer = ours if len(keys & set(AMPCORE_KEYS)) else set(TORCH_KEYS)
    missing = sorted(closer - keys)
    extra = sorted(keys - ours)
    return AmpcoreError(
        f"{call}(): not a GradScaler state dict; "
        + (f"missing keys {missing}" if missing else "")
        + ("; " if missing and extra else "")
        + (f"unexpected keys {extra}" if extra else "")
        + f". Expected exactly torch.amp.GradScaler's keys {list(TORCH_KEYS)}, or those plus "
        f"ampcore's {list(AMPCORE_KEYS)}. The scaler was left unchanged."
    )


def parse_state_dict(call: str, state_dict: object, current: ScalerOptions) -> ScalerState:
    """Check ``state_dict`` completely and return what it restores; raise on any problem
    (an :class:`AmpcoreError` ending "The scaler was left unchanged.").

    A torch state dict (its five keys only) keeps ``current``'s hysteresis, bounds and
    flags and starts the overflow counter at 0.
    """
    try:
        return _parse(call, state_dict, current)
    except AmpcoreError as exc:
        if str(exc).endswith("left unchanged."):
            raise
        raise AmpcoreError(f"{exc}. The scaler was left unchanged.") from None


def _parse(call: str, state_dict: object, current: ScalerOptions) -> ScalerState:
    if not isinstance(state_dict, Mapping):
        raise AmpcoreError(f"{call}(): expected a dict from GradScaler.state_dict(), got {type(state_dict).__name__}")
    if _PADDLE_ONLY & set(state_dict):
        state_dict = _from_paddle(call, state_dict, current)
    keys = set(state_dict)
    if keys != set(TORCH_KEYS) and keys != set(TORCH_KEYS) | set(AMPCORE_KEYS):
        raise _key_error(call, {str(k) for k in keys})
    scale = check_scale(call, "scale", state_dict["scale"])
    if scale is None:  # check_scale allows None only when asked to
        raise AmpcoreError(f"{call}(): 'scale' is None; expected a positive number")
    settings: dict[str, Any] = {
        name: state_dict[name] for name in ("growth_factor", "backoff_factor", "growth_interval")
    }
    if keys == set(TORCH_KEYS):
        overflow: object = 0
    else:
        settings.update({name: state_dict[name] for name in AMPCORE_KEYS if not name.startswith("_")})
        overflow = state_dict["_overflow_tracker"]
    bounds = [
        check_scale(call, name, settings.get(name, getattr(current, name)), allow_none=True)
        for name in ("min_scale", "max_scale")
    ]
    if (bounds[0] is not None and scale < bounds[0]) or (bounds[1] is not None and scale > bounds[1]):
        raise AmpcoreError(
            f"{call}(): 'scale' {scale!r} lies outside the bounds [min_scale, max_scale] = "
            f"[{bounds[0]}, {bounds[1]}], within which it must lie; construct the GradScaler with bounds "
            "that include it (max_scale=None for no upper bound). The scaler was left unchanged."
        )
    options = current.with_values(call, init_scale=scale, **settings)
    growth = check_int(call, "_growth_tracker", state_dict["_growth_tracker"], 0)
    overflow_count = check_int(call, "_overflow_tracker", overflow, 0)
    for name, count, limit, setting in (
        ("_growth_tracker", growth, options.growth_interval, "growth_interval"),
        ("_overflow_tracker", overflow_count, options.hysteresis, "hysteresis"),
    ):
        if count >= limit:
            raise AmpcoreError(
                f"{call}(): {name!r} is {count} but must be below {setting} ({limit}); "
                "the state dict is inconsistent. The scaler was left unchanged."
            )
    return ScalerState(options, scale, growth, overflow_count)


def _one_number(value: object) -> object:
    """Paddle's ``scale``: a one-element array or tensor (``scale.numpy()``) as a Python number."""
    items = value.tolist() if hasattr(value, "tolist") and not isinstance(value, (int, float)) else value
    while isinstance(items, (list, tuple)) and len(items) == 1:
        items = items[0]
    return items


def _from_paddle(call: str, state_dict: Mapping[Any, Any], current: ScalerOptions) -> dict[str, Any]:
    """A ``paddle.amp.GradScaler`` state dict in ampcore's format (the bounds and
    ``raise_at_min_scale`` are this scaler's: Paddle has none)."""
    keys = {str(k) for k in state_dict}
    if "loss_scaling" in keys and "scale" not in keys:
        state_dict = {("scale" if k == "loss_scaling" else k): v for k, v in state_dict.items()}
        keys = {str(k) for k in state_dict}
    missing, extra = sorted(set(PADDLE_KEYS) - keys), sorted(keys - set(PADDLE_KEYS))
    if missing or extra:
        raise AmpcoreError(
            f"{call}(): a paddle.amp.GradScaler state dict (it has Paddle's keys) but "
            + "; ".join(p for p in (missing and f"missing keys {missing}", extra and f"unexpected keys {extra}") if p)
            + f". Expected exactly Paddle's keys {list(PADDLE_KEYS)} ('loss_scaling' may stand for 'scale'). "
            "The scaler was left unchanged."
        )
    converted = {PADDLE_KEYS[k]: v for k, v in state_dict.items()}
    converted["scale"] = _one_number(converted["scale"])
    converted.update(
        min_scale=current.min_scale, max_scale=current.max_scale, raise_at_min_scale=current.raise_at_min_scale
    )
    return converted
