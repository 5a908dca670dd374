"""The cost model of ``level="auto"``: :class:`Costs` of one shape class, the decision, and
the plausibility checks a measurement must pass before it decides anything.

* :func:`decide` is a pure function of :class:`Costs`: low precision where it saves more
  than the noise of the measurement, float32 where it loses more than that, and a tie goes
  to the choice torch.autocast makes (low precision: every planned module kind is on
  autocast's lower-precision list); the noise of a median is :func:`band`;
* :func:`implausible` says why a figure should be measured again before it is trusted (a
  ratio beyond what the hardware can do, a spread too wide, a neighbour that disagrees);
* :func:`costs_from_mapping` checks costs that arrive from a file, a cache or an adapter.

How the costs are measured is in :mod:`._measure`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Final, Literal

from .._errors import shown

__all__ = [
    "MARGIN",
    "Costs",
    "band",
    "by_module",
    "Decision",
    "costs_from_mapping",
    "decide",
    "family",
    "finite",
    "implausible",
    "merge",
    "module_of",
    "near_classes",
    "shape_neighbours",
]

Decision = Literal["low", "fp32"]

#: Differences within this fraction of the float32 cost (or the uncertainty of the measured
#: medians, :func:`band`, if wider) are ties, and a tie goes to torch.autocast's choice.
MARGIN: Final = 0.03
#: A low/fp32 ratio beyond this (either way) is measured again before it is trusted: a
#: first call that paid one-time set-up looks like this, hardware rarely does.
RATIO_BOUND: Final = 4.0
#: Two classes of the same module and shapes that differ only in their inputs' dtype
#: disagree when their low/fp32 ratios differ by more than this factor.
NEIGHBOUR_BOUND: Final = 2.0
#: A relative spread (trimmed range over median) above this is too noisy to decide.
SPREAD_BOUND: Final = 0.5


@dataclass(frozen=True)
class Costs:
    """Milliseconds of one call of a shape class, forward and backward (medians of the
    timed runs), and how much to trust them.

    ``fp32_spread`` / ``low_spread``: the spread of the timed runs relative to their median
    (0: unknown or given); ``runs``: timed rounds the medians come from, those hit by a
    spike left out (:mod:`._spikes`; 0: not measured here);
    ``estimated``: fewer runs, stopped early because one side was clearly slower;
    ``checked``: measured again after a plausibility check flagged the first figures;
    ``spikes``: timed rounds left out as hit by other work; ``load``: the adapter's load of
    the device while measured (None: not reported); ``checks``: measurements of the class so
    far (across processes); ``provisional``: measured busy or noisy, to be measured again
    (:mod:`._heal`).  An entry written before these existed reads as one settled measurement.
    """

    fp32_ms: float
    low_ms: float  # including cast_ms
    cast_ms: float
    estimated: bool = False
    fp32_spread: float = 0.0
    low_spread: float = 0.0
    runs: int = 0
    checked: bool = False
    spikes: int = 0
    load: float | None = None
    checks: int = 1
    provisional: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The JSON form; the fields added later only where they differ from their default (an
        older entry and a settled one read and write as before)."""
        found = asdict(self)
        for name, default in _LATER.items():
            if found[name] == default:
                del found[name]
        return found

    @property
    def ratio(self) -> float:
        """low_ms / fp32_ms."""
        return self.low_ms / self.fp32_ms

    @property
    def noise(self) -> float:
        """The relative band within which the two sides are a tie (:func:`band`)."""
        return band(max(self.fp32_spread, self.low_spread), self.runs)


def band(spread: float, runs: int, margin: float = MARGIN) -> float:
    """The relative band within which two medians of ``runs`` timed runs each, whose runs
    spread by ``spread`` (trimmed range over median), are a tie: the larger of ``margin``
    and the uncertainty of such a median, ``spread / sqrt(runs)``.  Figures not timed here
    (``runs`` < 2: given, loaded) and spreads over :data:`SPREAD_BOUND` (too noisy to
    decide; often two clusters, a burst of other work over part of the runs, where the
    median lies between them) keep their spread as the band.

    The spread describes single runs; a median of 7 is about 2.6 times tighter.  Taking
    the spread itself as the band made every comparison on a busy machine (spreads of
    0.2-0.5) a tie, and a tie goes to torch.autocast, which on a model of small layers is
    1.6 times float32's step (issue 27, sixth stop).

    Example::

        >>> band(0.01, 7), round(band(0.46, 7), 3), band(0.2, 0), band(0.8, 14)
        (0.03, 0.174, 0.2, 0.8)
    """
    return max(margin, spread / math.sqrt(runs) if runs >= 2 and spread <= SPREAD_BOUND else spread)


_NUMBERS: Final = {"fp32_ms": True, "low_ms": True, "cast_ms": False, "fp32_spread": False, "low_spread": False}
_FLAGS: Final = ("estimated", "checked", "provisional")
#: fields added after the first cached costs, and their values where absent
_LATER: Final[dict[str, Any]] = {"spikes": 0, "load": None, "checks": 1, "provisional": False}


def finite(value: float) -> bool:
    """``math.isfinite``, also for an int too large for a float (a JSON ``1`` followed by
    400 zeros), which is not finite as a cost."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def costs_from_mapping(raw: object) -> Costs:
    """:class:`Costs` from a mapping read from a file, a cache or an adapter.

    Raises:
        ValueError: naming the field and what is wrong (a type, a non-finite or negative
            number, an unknown field).

    Example::

        >>> costs_from_mapping({"fp32_ms": 2, "low_ms": 1.0, "cast_ms": 0.1}).ratio
        0.5
        >>> costs_from_mapping({"fp32_ms": "a", "low_ms": 1.0, "cast_ms": 0})
        Traceback (most recent call last):
        ...
        ValueError: costs['fp32_ms'] = 'a': expected a finite number of milliseconds > 0
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"costs = {raw!r}: expected a mapping with 'fp32_ms', 'low_ms' and 'cast_ms'")
    known = {f.name for f in fields(Costs)}
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise ValueError(f"costs: unknown field(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for name, positive in _NUMBERS.items():
        if name not in raw:
            if name in ("fp32_ms", "low_ms"):
                raise ValueError(f"costs: {name!r} is missing")
            continue
        value = raw[name]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
        if not ok or value < 0 or (positive and value == 0):
            what = "milliseconds" if name.endswith("_ms") else "a spread"
            bound = "> 0" if positive else ">= 0"
            raise ValueError(f"costs[{name!r}] = {shown(value)}: expected a finite number of {what} {bound}")
        values[name] = float(value)
    values.setdefault("cast_ms", 0.0)
    for name in _FLAGS:
        if not isinstance(raw.get(name, False), bool):
            raise ValueError(f"costs[{name!r}] = {raw[name]!r}: expected true or false")
        values[name] = raw.get(name, False)
    counts = {name: raw.get(name, 1 if name == "checks" else 0) for name in ("runs", "spikes", "checks")}
    for name, count in counts.items():
        least = 1 if name == "checks" else 0
        if not isinstance(count, int) or isinstance(count, bool) or count < least:
            raise ValueError(f"costs[{name!r}] = {count!r}: expected a whole number >= {least}")
    load = raw.get("load")
    if load is not None and (
        not isinstance(load, (int, float)) or isinstance(load, bool) or not finite(load) or load < 0
    ):
        raise ValueError(f"costs['load'] = {shown(load)}: expected null or a finite number >= 0")
    return Costs(**values, **counts, load=None if load is None else float(load))


def decide(costs: Costs, margin: float = MARGIN) -> Decision:
    """``"low"`` unless float32 is faster by more than the noise of the measurement
    (``margin``, or the measured spread where wider): a tie goes to torch.autocast's
    choice, low precision.

    Example::

        >>> decide(Costs(fp32_ms=10.0, low_ms=6.0, cast_ms=1.0))
        'low'
        >>> decide(Costs(fp32_ms=10.0, low_ms=10.2, cast_ms=2.0))  # a tie: as torch.autocast
        'low'
        >>> decide(Costs(fp32_ms=10.0, low_ms=12.0, cast_ms=2.0))
        'fp32'
        >>> decide(Costs(fp32_ms=10.0, low_ms=12.0, cast_ms=2.0, fp32_spread=0.3))  # within noise
        'low'
        >>> decide(Costs(fp32_ms=10.0, low_ms=12.0, cast_ms=2.0, fp32_spread=0.3, runs=7))  # a median of 7
        'fp32'
    """
    tie = band(max(costs.fp32_spread, costs.low_spread), costs.runs, margin)
    return "fp32" if costs.low_ms > costs.fp32_ms * (1.0 + tie) else "low"


def module_of(shape_class: str) -> tuple[str, str]:
    """A shape class without the inputs' dtypes: ``(module and shapes, grad)``, what
    classes of the same module called on the same shapes in another dtype share.

    Example::

        >>> module_of("Linear(in_features=8) in=[4x8:bfloat16] grad")
        ('Linear(in_features=8) in=[4x8]', 'grad')
    """
    head, _, grad = shape_class.rpartition(" ")
    for dtype in ("bfloat16", "float16", "float64"):
        head = head.replace(f":{dtype}", "")
    return head, grad


def family(shape_class: str) -> tuple[Any, ...]:
    """A shape class without its shapes: the module kind and hyper-parameters, the inputs'
    dtypes and grad mode (classes of one layer on other shapes share it).

    Example::

        >>> family("Linear(in_features=2, out_features=2, bias=True) in=[4x2, 8:bfloat16] no-grad")
        ('Linear(in_features=2, out_features=2, bias=True)', ('', 'bfloat16'), 'no-grad')
    """
    described, _, rest = shape_class.partition(" in=[")
    shapes, _, grad = rest.rpartition("] ")
    return described, tuple(part.partition(":")[2] for part in shapes.split(", ")), grad


def _parts(shape_class: str) -> tuple[str, list[list[str]], str] | None:
    """``(module, [[dims..., dtype?] per input], grad)`` of a shape class, None if unreadable."""
    head, _, grad = shape_class.rpartition(" ")
    module, found, inputs = head.rpartition(" in=[")
    if not found or not inputs.endswith("]"):
        return None
    shapes = []
    for text in inputs[:-1].split(", "):
        dims, _, dtype = text.partition(":")
        shapes.append([*dims.split("x"), ":" + dtype])
    return module, shapes, grad


def shape_neighbours(a: str, b: str) -> bool:
    """Whether two shape classes are the same module, grad mode and input dtypes with one
    dimension of one input in the next power-of-two bucket (costs should change smoothly
    between them).

    Example::

        >>> shape_neighbours("Linear(a) in=[8x64] grad", "Linear(a) in=[16x64] grad")
        True
        >>> shape_neighbours("Linear(a) in=[8x64] grad", "Linear(a) in=[32x64] grad")
        False
    """
    pa, pb = _parts(a), _parts(b)
    if pa is None or pb is None or pa[0] != pb[0] or pa[2] != pb[2] or len(pa[1]) != len(pb[1]):
        return False
    steps = 0
    for x, y in zip(pa[1], pb[1], strict=True):
        if len(x) != len(y) or x[-1] != y[-1]:
            return False
        for dx, dy in zip(x[:-1], y[:-1], strict=True):
            if dx != dy:
                if not (dx.isdigit() and dy.isdigit()) or max(int(dx), int(dy)) != 2 * min(int(dx), int(dy)):
                    return False
                steps += 1
    return steps == 1


def by_module(keys: Iterable[str]) -> dict[str, list[str]]:
    """Shape classes grouped by their module (kind and hyper-parameters): neighbours
    (:meth:`~._plan.AutoPlan.neighbours`) are always in one group, so checking every entry of a plan
    compares within groups, not every pair (a cache of thousands of classes reads in
    linear time, not quadratic).

    Example::

        >>> by_module(["Linear(a) in=[8x4] grad", "Conv2d(b) in=[1x3] grad", "Linear(a) in=[16x4] grad"])
        {'Linear(a)': ['Linear(a) in=[8x4] grad', 'Linear(a) in=[16x4] grad'], 'Conv2d(b)': ['Conv2d(b) in=[1x3] grad']}
    """
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(key.rpartition(" in=[")[0], []).append(key)
    return groups


#: a module with more shape classes than this is checked through :func:`near_classes`'s
#: index (power-of-two buckets give a layer a few dozen; thousands are a forged or damaged file)
MANY_CLASSES: Final = 64


def near_classes(keys: list[str]) -> Callable[[str], list[str]]:
    """For the classes ``keys`` of one module: a function giving, for one of them, the
    others that may be its neighbours (the same shapes in another dtype, or one dimension
    doubled or halved), found by lookup: checking a module of ``n`` classes costs ``O(n)``
    comparisons, not ``O(n**2)``.

    Example::

        >>> near = near_classes(["L in=[8x4] grad", "L in=[16x4] grad", "L in=[8x4:bfloat16] grad", "L in=[64x4] grad"])
        >>> near("L in=[8x4] grad")
        ['L in=[8x4] grad', 'L in=[8x4:bfloat16] grad', 'L in=[16x4] grad']
    """
    same: dict[tuple[str, str], list[str]] = {}
    shaped: dict[tuple[Any, ...], list[str]] = {}
    for key in keys:
        same.setdefault(module_of(key), []).append(key)
        parts = _parts(key)
        if parts is not None:
            shaped.setdefault((parts[0], tuple(map(tuple, parts[1])), parts[2]), []).append(key)

    def near(key: str) -> list[str]:
        found = list(same.get(module_of(key), ()))
        parts = _parts(key)
        for i, shape in enumerate(parts[1] if parts is not None else ()):
            for j, dim in enumerate(shape[:-1]):
                if not dim.isdigit():
                    continue
                for other in {int(dim) * 2, int(dim) // 2 if int(dim) % 2 == 0 else 0} - {0}:
                    moved = [tuple(s) for s in parts[1]]  # type: ignore[index]
                    moved[i] = (*shape[:j], str(other), *shape[j + 1 :])
                    found += shaped.get((parts[0], tuple(moved), parts[2]), [])  # type: ignore[index]
        return found

    return near


def implausible(costs: Costs, neighbours: Iterable[Costs] = ()) -> str | None:
    """Why ``costs`` should be measured again before deciding (``None``: plausible).

    ``neighbours``: the costs of the same module on the same shapes with inputs of another
    dtype (:func:`module_of`) or on the next shape bucket (:func:`shape_neighbours`); their
    low/fp32 ratios should agree within :data:`NEIGHBOUR_BOUND`.  Figures already measured
    again (``checked``) are trusted.

    Example::

        >>> implausible(Costs(26.9, 231.7, 1.0))  # the first call paid kernel creation
        'low/fp32 8.61 is beyond 4'
        >>> implausible(Costs(26.9, 30.0, 1.0), [Costs(27.0, 11.4, 1.0)])
        'low/fp32 1.12 disagrees with 0.42 of a neighbouring class'
    """
    if costs.checked:
        return None
    ratio = costs.ratio
    if ratio > RATIO_BOUND or ratio < 1 / RATIO_BOUND:
        return f"low/fp32 {ratio:.2f} is beyond {RATIO_BOUND:g}"
    if max(costs.fp32_spread, costs.low_spread) > SPREAD_BOUND:
        return f"spread {max(costs.fp32_spread, costs.low_spread):.2f} is beyond {SPREAD_BOUND:g}"
    for other in neighbours:
        if max(ratio, other.ratio) > NEIGHBOUR_BOUND * min(ratio, other.ratio):
            return f"low/fp32 {ratio:.2f} disagrees with {other.ratio:.2f} of a neighbouring class"
    return None


def merge(first: Costs, again: Costs) -> Costs:
    """Two measurements of one class as one, marked ``checked``: per side, the lower median
    (interference and one-time set-up only ever add time) with its spread.

    Example::

        >>> merge(Costs(26.9, 231.7, 1.0, runs=3), Costs(27.5, 11.4, 1.1, runs=3)).low_ms
        11.4
    """
    fp32, fp32_spread = min((first.fp32_ms, first.fp32_spread), (again.fp32_ms, again.fp32_spread))
    low, low_spread = min((first.low_ms, first.low_spread), (again.low_ms, again.low_spread))
    return replace(
        again,
        fp32_ms=fp32,
        low_ms=low,
        cast_ms=min(first.cast_ms, again.cast_ms),
        fp32_spread=fp32_spread,
        low_spread=low_spread,
        runs=first.runs + again.runs,
        spikes=first.spikes + again.spikes,
        estimated=first.estimated and again.estimated,
        checked=True,
    )
