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

A *uniform* program (every planned call one way) is exactly one fixed choice, yet its
figures are per class too: a wrong one (a burst of other work over one side's runs) or the
work between layers could make the other choice faster as a whole.  It is checked against
that other choice alone, its own side's figures being its own runs (ratio 1 round by
round): :func:`choose` then gives ``"fp32"`` only where float32 beats the O1 lists beyond
the noise, else ``"low"`` (a tie: torch.autocast's choice, also for an all-float32 program).

A check measured on a busy device (the adapter's ``ampcore_auto_load`` over
:data:`BUSY_LOAD`) or whose ratios spread over :data:`NOISY_SPREAD` is *provisional*
(:func:`provisional`): other work on the device can shift a whole check's ratios at once
(the rounds are paired, so a shift shows as a win, not as spread), so a later process checks
it again (:func:`recheck`), at most :data:`MAX_CHECKS` measurements in all, and keeps the
quieter one.  A check whose clock left other work's time out of every run (*shielded*:
the CPU adapter's one-thread CPU time, :func:`~._hostclock.exposure` unchanged over the
check) is busy only where a comparison that decided it lies within twice the spread
(:func:`close`), as a class's measurement (:func:`._heal.provisional`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Final, Literal

from ._costs import MARGIN, band, finite
from ._spikes import ambiguous, kept

__all__ = [
    "BUSY_LOAD",
    "MAX_CHECKS",
    "NOISY_SPREAD",
    "VERDICTS",
    "RootCheck",
    "Verdict",
    "check_from_mapping",
    "choose",
    "close",
    "provisional",
    "recheck",
    "renewed",
    "unsettled",
]

Verdict = Literal["plan", "low", "fp32"]
VERDICTS: Final = ("plan", "low", "fp32")
_MS: Final = ("plan_ms", "low_ms", "fp32_ms")
_RATIOS: Final = ("plan_over_low", "plan_over_fp32")
#: a check whose per-round ratios spread more than this is provisional (quiet CPUs: 0.07)
NOISY_SPREAD: Final = 0.10
#: a check measured while other work kept more than this share of the device busy (the
#: adapter's ``ampcore_auto_load``) is provisional
BUSY_LOAD: Final = 0.5
#: measurements of one whole call at most, across processes (the first and two re-checks)
MAX_CHECKS: Final = 3


def provisional(spread: float, load: float | None, checks: int, shielded: bool = False, near: bool = True) -> bool:
    """Whether a whole-call check is to be measured again in a later process: it was noisy
    (``spread`` over :data:`NOISY_SPREAD`) or measured on a busy device (``load`` over
    :data:`BUSY_LOAD`; None: the adapter does not say) while its clock could see other work
    (not ``shielded``) or, shielded, its figures are ``near`` (:func:`close`), and fewer
    than :data:`MAX_CHECKS` measurements were made.

    Example::

        >>> provisional(0.05, 0.1, 1), provisional(0.15, 0.1, 1), provisional(0.05, 2.0, 1)
        (False, True, True)
        >>> provisional(0.15, None, 3)   # three measurements: final
        False
        >>> provisional(0.05, 2.0, 1, shielded=True, near=False), provisional(0.05, 2.0, 1, shielded=True)
        (False, True)
    """
    busy = load is not None and load > BUSY_LOAD and (not shielded or near)
    return checks < MAX_CHECKS and (spread > NOISY_SPREAD or busy)


def close(plan_over_low: float, plan_over_fp32: float, spread: float) -> bool:
    """Whether a comparison the verdict rests on lies within twice ``spread`` of a tie: float32
    against the O1 lists (round by round, ``plan_over_fp32 / plan_over_low``), or the program
    against the better of them where the program is neither (a ratio of exactly 1: a uniform
    program's own side, :func:`._verify._uniform_times`).

    Example::

        >>> close(0.80, 0.40, 0.05), close(0.95, 0.47, 0.04), close(1.0, 0.97, 0.02)
        (False, True, True)
        >>> close(1.0, 0.5, 0.05)   # a uniform low program, float32 twice as slow
        False
    """
    near = abs(plan_over_fp32 / plan_over_low - 1.0) <= 2 * spread
    if 1.0 in (plan_over_low, plan_over_fp32):  # a uniform program: that comparison alone
        return near
    return near or abs(max(plan_over_low, plan_over_fp32) - 1.0) <= 2 * spread


def choose(
    low_ms: float, fp32_ms: float, plan_over_low: float, plan_over_fp32: float, spread: float, runs: int = 1
) -> Verdict:
    """The verdict of a whole-call check: the better fixed choice (``"fp32"`` only where it
    beats the O1 lists beyond the noise, else ``"low"``, torch.autocast's choice), and the
    program (``"plan"``) only where it beats that choice beyond the noise.  ``plan_over_*``
    are medians of per-round ratios (paired: drift hits both sides) of ``runs`` rounds,
    ``spread`` the relative spread of those ratios; the noise band is the uncertainty of
    such a median, the larger of ``spread / sqrt(runs)`` and 3% (:func:`~._costs.band`).
    The fixed choice compares the two sides through the program's paired ratios
    (``plan_over_fp32 / plan_over_low``: low / fp32 round by round), not the medians of
    their runs (``low_ms``, ``fp32_ms``: shown), which other work on a busy machine moves
    apart or together by its bursts.

    Example::

        >>> choose(10.0, 20.0, 0.95, 0.47, 0.01)   # the program wins by 5%: kept
        'plan'
        >>> choose(10.0, 20.0, 0.99, 0.49, 0.01)   # within the noise: torch.autocast's choice
        'low'
        >>> choose(10.0, 9.0, 1.05, 1.17, 0.01)    # float32 beats both
        'fp32'
        >>> choose(16.7, 13.4, 0.84, 1.19, 0.46, runs=7)   # busy, but float32 is 20% faster in 7
        'fp32'
        >>> choose(9.05, 8.53, 0.97, 1.445, 0.35, runs=14)  # the runs' medians close, the rounds' ratios not
        'fp32'
    """
    tie = band(spread, runs)
    fixed: Verdict = "fp32" if plan_over_fp32 > plan_over_low * (1.0 + tie) else "low"
    ratio = plan_over_fp32 if fixed == "fp32" else plan_over_low
    return "plan" if ratio < 1.0 - tie else fixed


def unsettled(check: RootCheck) -> bool:
    """Whether more rounds would decide ``check``: float32 looks faster than the O1 lists,
    or the program than the fixed choice, beyond the margin but within the noise
    (:func:`~._spikes.ambiguous`; a true tie stays a tie).

    Example::

        >>> busy = {"plan": [9.0, 10.2, 8.4], "low": [10.0, 10.0, 10.0], "fp32": [20.0, 20.0, 20.0]}
        >>> unsettled(RootCheck.of(busy)), unsettled(RootCheck.of({**busy, "plan": [10.0] * 3}))
        (True, False)
    """
    noise = band(check.spread, check.runs)
    fp32_gain = check.plan_over_fp32 / check.plan_over_low - 1.0
    fixed = check.plan_over_fp32 if check.verdict == "fp32" else check.plan_over_low
    return ambiguous(fp32_gain, noise, MARGIN) or (check.verdict != "plan" and ambiguous(1.0 - fixed, noise, MARGIN))


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
    #: the adapter's load of the device while it was measured (None: not reported)
    load: float | None = None
    #: measurements made of this whole call (across processes; see :func:`recheck`)
    checks: int = 1
    #: to be measured again by a later process (:func:`provisional`)
    provisional: bool = False
    source: str = "measured"
    #: its clock left other work's time out of every run (see :func:`provisional`)
    shielded: bool = False

    @classmethod
    def of(
        cls,
        times: Mapping[str, list[float]],
        load: float | None = None,
        source: str = "measured",
        shielded: bool = False,
    ) -> RootCheck:
        """The check of ``times`` (``"plan"``, ``"low"``, ``"fp32"``: one figure per round,
        in the same rounds), measured at ``load`` (``shielded``: by a clock that left other
        work's time out).

        Example::

            >>> RootCheck.of({"plan": [9.0, 9.1, 9.0], "low": [10.0, 10.0, 10.1], "fp32": [20.0] * 3}).verdict
            'plan'
            >>> RootCheck.of({"plan": [9.0] * 3, "low": [10.0] * 3, "fp32": [20.0] * 3}, load=1.5).provisional
            True
        """
        from ._measure import summary

        times = kept(times)  # the rounds no spike hit
        med = {name: summary(runs)[0] for name, runs in times.items()}
        over_low, low_spread = summary([p / q for p, q in zip(times["plan"], times["low"], strict=True)])
        over_fp32, fp32_spread = summary([p / q for p, q in zip(times["plan"], times["fp32"], strict=True)])
        spread = max(low_spread, fp32_spread)
        runs = len(times["plan"])
        verdict = choose(med["low"], med["fp32"], over_low, over_fp32, spread, runs)
        figures = (med["plan"], med["low"], med["fp32"], over_low, over_fp32, spread, runs, verdict)
        marked = provisional(spread, load, 1, shielded, close(over_low, over_fp32, spread))
        return cls(*figures, load, 1, marked, source, shielded)

    @property
    def near(self) -> bool:
        """:func:`close` of this check's figures."""
        return close(self.plan_over_low, self.plan_over_fp32, self.spread)

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        del found["source"]
        if not self.shielded:  # (written only where set: entries of earlier versions keep their seals)
            del found["shielded"]
        return found


def recheck(old: RootCheck, new: RootCheck) -> RootCheck:
    """What a later process keeps after measuring a provisional check ``old`` again as
    ``new``: ``new`` when it is not noisy or busy itself or spreads no more than ``old``,
    else ``old``; either way one more measurement counted (provisional until
    :data:`MAX_CHECKS`).

    Example::

        >>> busy = RootCheck.of({"plan": [8.0] * 3, "low": [10.0] * 3, "fp32": [20.0] * 3}, load=2.0)
        >>> quiet = RootCheck.of({"plan": [10.0] * 3, "low": [10.0] * 3, "fp32": [20.0] * 3}, load=0.1)
        >>> kept = recheck(busy, quiet)
        >>> kept.verdict, kept.checks, kept.provisional
        ('low', 2, False)
        >>> kept = recheck(recheck(busy, busy), busy)
        >>> kept.verdict, kept.checks, kept.provisional   # three busy measurements: final
        ('plan', 3, False)
    """
    best = new if not new.provisional or new.spread <= old.spread else old
    return renewed(best, old.checks + 1, new.source)


def renewed(check: RootCheck, checks: int, source: str | None = None) -> RootCheck:
    """``check`` counted as ``checks`` measurements, its provisional mark recomputed."""
    mark = provisional(check.spread, check.load, checks, check.shielded, check.near)
    return replace(check, checks=checks, provisional=mark, source=check.source if source is None else source)


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
    unknown = sorted(str(k) for k in raw if k not in (*values, "runs", "verdict", *_LATER))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    low, fp32, over_low, over_fp32 = (values[name] for name in ("low_ms", "fp32_ms", *_RATIOS))
    given = choose(low, fp32, over_low, over_fp32, values["spread"], runs)
    if given != verdict:
        raise ValueError(f"verdict {verdict!r} does not follow from the figures (they give {given!r})")
    load, checks, marked, shielded = _state(raw, values)
    found = RootCheck(**values, runs=runs, verdict=verdict, load=load, checks=checks, provisional=marked, source=source)
    return replace(found, shielded=shielded)


#: fields added after the first whole-call checks were cached (absent: load unknown, one
#: measurement, provisional as its spread says, a clock that could see other work)
_LATER: Final = ("load", "checks", "provisional", "shielded")


def _state(raw: Mapping[str, Any], values: Mapping[str, float]) -> tuple[float | None, int, bool, bool]:
    """The checked ``load``, ``checks``, ``provisional`` and ``shielded`` of a stored check (a
    mark that does not follow from the spread, load, count and clock is refused: a
    hand-edited "final")."""
    spread = values["spread"]
    load: Any = raw.get("load")
    number = isinstance(load, (int, float)) and not isinstance(load, bool)
    if load is not None and (not number or not finite(load) or load < 0):
        raise ValueError(f"load = {load!r}: expected None or a finite number >= 0")
    checks = raw.get("checks", 1)
    if not isinstance(checks, int) or isinstance(checks, bool) or not 1 <= checks <= MAX_CHECKS:
        raise ValueError(f"checks = {checks!r}: expected a whole number from 1 to {MAX_CHECKS}")
    shielded = raw.get("shielded", False)
    if not isinstance(shielded, bool):
        raise ValueError(f"shielded = {shielded!r}: expected true or false")
    near = close(values["plan_over_low"], values["plan_over_fp32"], spread)
    expected = provisional(spread, load, checks, shielded, near)
    marked = raw.get("provisional", expected)
    if marked is not expected:
        raise ValueError(f"provisional = {marked!r} does not follow from spread, load and checks ({expected})")
    return None if load is None else float(load), checks, expected, shielded
