"""Whole-call checks: a root's *mixed* program (some planned modules float32, some low
precision) against the two fixed choices, float32 and torch.autocast's.

Each planned module's decision wins locally, but the program as a whole may not: the
casts between a float32 module and its low-precision neighbours, or the allocator's and
the caches' work between them, are not in any module's figures.  So a mixed program is
timed once as a whole (:mod:`._verify`), interleaved with the root call under the O1
lists alone (``low``: what torch.autocast runs) and in float32 (``fp32``), and kept only
where it wins beyond the noise.  A :class:`RootCheck` is that measurement and its
verdict; :func:`choose` is the pure rule, applied again to figures read from a cache or a
plan file (a verdict that does not follow from its figures is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

from ._costs import MARGIN, finite

__all__ = ["VERDICTS", "RootCheck", "Verdict", "check_from_mapping", "choose"]

Verdict = Literal["plan", "low", "fp32"]
VERDICTS: Final = ("plan", "low", "fp32")
_MS: Final = ("plan_ms", "low_ms", "fp32_ms")
_RATIOS: Final = ("plan_over_low", "plan_over_fp32")


def choose(low_ms: float, fp32_ms: float, plan_over_low: float, plan_over_fp32: float, spread: float) -> Verdict:
    """The verdict of a whole-call check: the better fixed choice (``"fp32"`` only where it
    beats the O1 lists beyond the noise, else ``"low"``, torch.autocast's choice), and the
    program (``"plan"``) only where it beats that choice beyond the noise.  ``plan_over_*``
    are medians of per-round ratios (paired: drift hits both sides), ``spread`` the
    relative spread of those ratios; the noise band is the larger of it and 3%.

    Example::

        >>> choose(10.0, 20.0, 0.95, 0.47, 0.01)   # the program wins by 5%: kept
        'plan'
        >>> choose(10.0, 20.0, 0.99, 0.49, 0.01)   # within the noise: torch.autocast's choice
        'low'
        >>> choose(10.0, 9.0, 1.05, 1.17, 0.01)    # float32 beats both
        'fp32'
    """
    band = max(MARGIN, spread)
    fixed: Verdict = "fp32" if low_ms > fp32_ms * (1.0 + band) else "low"
    ratio = plan_over_fp32 if fixed == "fp32" else plan_over_low
    return "plan" if ratio < 1.0 - band else fixed


@dataclass(frozen=True)
class RootCheck:
    """A mixed program timed as a whole against the fixed choices (ms: medians of the timed
    runs of the root call, forward and backward) and the verdict :func:`choose` gives."""

    plan_ms: float
    low_ms: float
    fp32_ms: float
    plan_over_low: float
    plan_over_fp32: float
    spread: float
    runs: int
    verdict: Verdict
    source: str = "measured"

    @classmethod
    def of(cls, times: Mapping[str, list[float]], source: str = "measured") -> RootCheck:
        """The check of ``times`` (``"plan"``, ``"low"``, ``"fp32"``: one figure per round,
        in the same rounds).

        Example::

            >>> RootCheck.of({"plan": [9.0, 9.1, 9.0], "low": [10.0, 10.0, 10.1], "fp32": [20.0] * 3}).verdict
            'plan'
        """
        from ._measure import summary

        med = {name: summary(runs)[0] for name, runs in times.items()}
        over_low, low_spread = summary([p / q for p, q in zip(times["plan"], times["low"], strict=True)])
        over_fp32, fp32_spread = summary([p / q for p, q in zip(times["plan"], times["fp32"], strict=True)])
        spread = max(low_spread, fp32_spread)
        verdict = choose(med["low"], med["fp32"], over_low, over_fp32, spread)
        runs = len(times["plan"])
        return cls(med["plan"], med["low"], med["fp32"], over_low, over_fp32, spread, runs, verdict, source)

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        del found["source"]
        return found


def check_from_mapping(raw: object, source: str) -> RootCheck:
    """A checked :class:`RootCheck` read from a cache or a plan file.

    Raises:
        ValueError: naming the field and what is wrong (a type, a non-finite or negative
            number, an unknown verdict, a verdict that does not follow from the figures).

    Example::

        >>> good = {"plan_ms": 9.0, "low_ms": 10.0, "fp32_ms": 20.0, "plan_over_low": 0.9,
        ...         "plan_over_fp32": 0.45, "spread": 0.01, "runs": 5, "verdict": "plan"}
        >>> check_from_mapping(good, "cache").verdict
        'plan'
        >>> check_from_mapping({**good, "verdict": "fp32"}, "cache")
        Traceback (most recent call last):
        ...
        ValueError: verdict 'fp32' does not follow from the figures (they give 'plan')
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"{raw!r}: expected an object with {', '.join(_MS)}, the ratios, spread, runs and verdict")
    values: dict[str, Any] = {}
    for name in (*_MS, *_RATIOS, "spread"):
        value: Any = raw.get(name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
        if not ok or value < 0 or (name != "spread" and value == 0):
            raise ValueError(f"{name} = {value!r}: expected a finite number {'>= 0' if name == 'spread' else '> 0'}")
        values[name] = float(value)
    runs = raw.get("runs")
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ValueError(f"runs = {runs!r}: expected a whole number >= 1")
    verdict = raw.get("verdict")
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r}; valid: {', '.join(map(repr, VERDICTS))}")
    unknown = sorted(str(k) for k in raw if k not in (*values, "runs", "verdict"))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    given = choose(*(values[name] for name in ("low_ms", "fp32_ms", *_RATIOS, "spread")))
    if given != verdict:
        raise ValueError(f"verdict {verdict!r} does not follow from the figures (they give {given!r})")
    return RootCheck(**values, runs=runs, verdict=verdict, source=source)
