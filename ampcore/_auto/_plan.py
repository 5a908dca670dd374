"""Plans: the decisions of ``level="auto"`` per shape class, with the costs behind them.

An :class:`AutoPlan` belongs to one *fingerprint*: backend, device name, low-precision
dtype, torch and ampcore versions, the host's ISA flags, thread count and the environment
variables that change the CPU kernels (``ONEDNN_*``, ``DNNL_*``, ``MKL_*``, ``OMP_*``).  A plan is exported and
loaded as JSON (:meth:`AutoPlan.save`, :func:`._load.load_plan`, ``ampcore plan``), so every rank
of a job and every resumed run uses the same decisions.

Everything read from a file is checked (types, finiteness, the decisions' names) and an
error names the file and the entry.  Plans of this process and the disk cache are in
:mod:`._cache`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from .._backends.backend import dtype_name
from .._errors import AmpcoreError
from .._table import format_table
from .._version import __version__
from ._checks import RootCheck, check_from_mapping
from ._costs import MARGIN, Costs, Decision, costs_from_mapping, decide, implausible, module_of, shape_neighbours
from ._costs import family as family_of

__all__ = ["FORMAT", "AutoPlan", "PlanEntry", "entry_from_mapping", "fingerprint", "seal"]

#: The format plans are written in (2: costs with spread, runs and checks); plan files of
#: format 1 load too.
FORMAT: Final = 2
_FORMATS: Final = (1, 2)
_ENV_PREFIXES: Final = ("ONEDNN_", "DNNL_", "MKL_", "OMP_")


@dataclass(frozen=True)
class PlanEntry:
    """The decision for one shape class: ``"low"`` or ``"fp32"``, the costs it rests on
    (``None`` for a decision given without costs) and where it came from (``measured`` in
    this process, given by the backend's ``adapter`` hook, read from the disk ``cache``,
    ``loaded`` from a plan file, or ``given``)."""

    shape_class: str
    decision: Decision
    costs: Costs | None = None
    source: str = "measured"

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "costs": None if self.costs is None else self.costs.as_dict(),
            "source": self.source,
        }


def fingerprint(backend_name: str, device_name: str, dtype: torch.dtype) -> dict[str, Any]:
    """What the costs of a plan depend on (plans and cache files are keyed by it).

    Example::

        >>> import torch
        >>> fp = fingerprint("cpu", "x86_64", torch.bfloat16)
        >>> fp["dtype"], fp["backend"]
        ('bfloat16', 'cpu')
    """
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)}
    return {
        "backend": backend_name,
        "device": device_name,
        "dtype": dtype_name(dtype),
        "torch": torch.__version__,
        "ampcore": __version__,
        "host": _host_isa(),
        "threads": torch.get_num_threads(),
        "env": env,
    }


_HOST: list[str] = []


def _host_isa() -> str:
    """The host's instruction sets (torch's ATen capability and the CPU flags it reports):
    the host prepares every device's work, and runs it on a CPU backend."""
    if not _HOST:
        flags: list[str] = []
        getter = getattr(torch.cpu, "get_capabilities", None)
        try:
            found = dict(getter()) if getter is not None else {}
        except Exception:  # an unusual build: the capability alone
            found = {}
        flags = sorted(k for k, v in found.items() if v is True)
        _HOST.append(" ".join([torch.backends.cpu.get_cpu_capability(), *flags]))
    return _HOST[0]


def _key(fp: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def seal(fp: Mapping[str, Any], key: str, value: object) -> str:
    """The seal of an entry or whole-call check ``value`` (its JSON form, without the source)
    of shape class or root ``key`` in a plan of fingerprint ``fp``: the disk cache refuses an
    entry whose figures no longer give its seal (edited or damaged after ampcore wrote it).

    Example::

        >>> entry = {"decision": "low", "costs": {"fp32_ms": 4.0, "low_ms": 1.0}}
        >>> seal({}, "k", entry) == seal({}, "k", {**entry, "source": "cache"})
        True
        >>> seal({}, "k", entry) == seal({}, "k", {**entry, "decision": "fp32"})
        False
    """
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k != "source"}
    text = json.dumps([_key(fp), key, value], sort_keys=True, default=repr)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class Stale(list[bool]):
    """A program's ``stale`` cell (``[True]``: record again), held weakly by :meth:`AutoPlan.wait`."""

    __slots__ = ("__weakref__",)


@dataclass
class AutoPlan:
    """The decisions of ``level="auto"`` for one fingerprint (see :func:`fingerprint`).

    ``frozen`` plans (loaded with ``freeze=True``) measure nothing: a shape class they lack
    runs with the O1 lists, so every process that loads the plan decides the same.

    Example::

        >>> plan = AutoPlan({"dtype": "bfloat16"})
        >>> plan.set("Linear(in_features=64, out_features=64, bias=True) in=[16x64] grad",
        ...          Costs(fp32_ms=0.1, low_ms=0.4, cast_ms=0.05))
        'fp32'
        >>> AutoPlan.from_dict(plan.to_dict()).decision(next(iter(plan.entries)))
        'fp32'
    """

    fingerprint: dict[str, Any]
    entries: dict[str, PlanEntry] = field(default_factory=dict)
    margin: float = MARGIN
    frozen: bool = False
    #: entries set again or dropped, and new ones that make their family's decisions differ:
    #: the programs of :mod:`._program` are valid while it stays the same (see :meth:`set`)
    changes: int = field(default=0, compare=False)
    #: entries added otherwise; the ``stale`` cells of programs that ran a call undecided
    added: int = field(default=0, compare=False)
    waiting: weakref.WeakValueDictionary[int, Stale] = field(
        default_factory=weakref.WeakValueDictionary, compare=False, repr=False
    )
    #: whole-call checks of mixed programs (:mod:`._checks`), by :func:`root_key`; setting
    #: one does not count as a change (the programs it chose between stay valid)
    roots: dict[str, RootCheck] = field(default_factory=dict)
    #: classes this process dropped (measured again): a write does not take them back from the file
    dropped: set[str] = field(default_factory=set, compare=False, repr=False)
    #: whole-call checks (by key) this process measured again in the process (:mod:`._again`)
    again: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    #: classes whose measurement raised in this process (:func:`._deciding.decide`): the O1 lists
    unmeasurable: set[str] = field(default_factory=set, compare=False, repr=False)
    #: provisional classes to measure again at their next call (read from the cache, or due in
    #: this process), how often each was measured again here, those waiting (:mod:`._heal`)
    due: set[str] = field(default_factory=set, compare=False, repr=False)
    healed: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    waits: Any = field(default=None, compare=False, repr=False)

    def decision(self, shape_class: str) -> Decision | None:
        """The decision for ``shape_class`` (``None``: not in the plan)."""
        entry = self.entries.get(shape_class)
        return None if entry is None else entry.decision

    def set(self, shape_class: str, costs: Costs, source: str = "measured") -> Decision:
        """Record ``costs`` for ``shape_class`` and return the decision they give.  A new class
        changes no program where its family's classes (:func:`~._costs.family`: the layer on
        other shapes) decide as it does: only programs that ran it undecided record again."""
        decision = decide(costs, self.margin)
        mine = family_of(shape_class)  # a family that now decides two ways: programs guard its calls
        # (a copy first: another thread's measurement may set an entry while this looks)
        theirs = {e.decision for key, e in list(self.entries.items()) if family_of(key) == mine}
        if shape_class in self.entries or (len(theirs) == 1 and decision not in theirs):
            self.changes += 1  # every program records again
        else:
            self.added += 1
            waiting, self.waiting = self.waiting, weakref.WeakValueDictionary()
            for cell in list(waiting.values()):
                cell[0] = True
        self.entries[shape_class] = PlanEntry(shape_class, decision, costs, source)
        self.dropped.discard(shape_class)
        return decision

    def renew(self, shape_class: str, costs: Costs) -> Decision:
        """Record ``costs`` of a class measured again (:mod:`._heal`): programs record again only
        where its decision changed."""
        entry = self.entries.get(shape_class)
        if entry is None or decide(costs, self.margin) != entry.decision:
            return self.set(shape_class, costs)
        self.entries[shape_class] = PlanEntry(shape_class, entry.decision, costs, "measured")
        return entry.decision

    def wait(self, stale: Stale, added: int) -> None:
        """Set ``stale``, a program's that ran a call undecided, when a class is added (``added``: when recorded)."""
        if added != self.added:
            stale[0] = True
        else:
            self.waiting[id(stale)] = stale

    def set_root(self, key: str, check: RootCheck) -> None:
        """Record the whole-call check of a root's mixed program (:func:`root_key`)."""
        self.roots[key] = check

    def drop(self, shape_class: str) -> None:
        """Forget the entry of ``shape_class`` (measured again at its next call)."""
        self.dropped.add(shape_class)
        self.due.discard(shape_class)
        if self.waits:
            self.waits.pop(shape_class, None)
        if self.entries.pop(shape_class, None) is not None:
            self.changes += 1

    def neighbours(self, shape_class: str, among: Iterable[str] | None = None) -> Iterator[tuple[str, Costs]]:
        """The measured classes whose costs should agree with this one's: the same module on
        the same shapes with inputs of another dtype (:func:`~._costs.module_of`), or on
        the next shape bucket of one dimension (:func:`~._costs.shape_neighbours`).
        ``among``: the keys to look at (default: every entry; :func:`~._costs.by_module` groups them)."""
        mine = module_of(shape_class)
        for key in list(self.entries if among is None else among):
            entry = self.entries.get(key)
            if key == shape_class or entry is None or entry.costs is None:
                continue
            if module_of(key) == mine or shape_neighbours(key, shape_class):
                yield key, entry.costs

    def suspect(self, shape_class: str, costs: Costs, among: Iterable[str] | None = None) -> str | None:
        """Why ``costs`` for ``shape_class`` should be measured again (``None``: plausible)."""
        return implausible(costs, [c for _, c in self.neighbours(shape_class, among)])

    def to_dict(self, measured: bool = False) -> dict[str, Any]:
        """The JSON form (what :meth:`save` writes; broadcast it to DDP ranks as an object),
        with the :func:`seal` of each entry and whole-call check; ``measured``: only the
        entries with figures (the disk cache's: a decision written by hand is not one)."""
        kept = sorted(self.entries.items())
        entries = {key: entry.as_dict() for key, entry in kept if not measured or entry.costs is not None}
        roots = {key: check.as_dict() for key, check in sorted(self.roots.items())}
        fp = self.fingerprint
        return {
            "format": FORMAT,
            "fingerprint": fp,
            "margin": self.margin,
            "entries": entries,
            "roots": roots,
            "seals": {
                "entries": {key: seal(fp, key, value) for key, value in entries.items()},
                "roots": {key: seal(fp, key, value) for key, value in roots.items()},
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "loaded", where: str = "plan") -> AutoPlan:
        """A plan from :meth:`to_dict`'s form; AmpcoreError naming ``where`` and what (which
        entry) is malformed."""
        if not isinstance(data, Mapping):
            raise AmpcoreError(f"ampcore.load_plan: {where} is not an ampcore auto plan (a JSON object expected)")
        plan = cls(_checked_fingerprint(data, where), margin=_checked_margin(data, where))
        entries = data.get("entries")
        if not isinstance(entries, Mapping):
            raise AmpcoreError(f"ampcore.load_plan: {where}: 'entries' = {entries!r}: expected an object")
        for key, raw in entries.items():
            try:
                plan.entries[key] = entry_from_mapping(key, raw, source)
            except ValueError as exc:
                raise AmpcoreError(f"ampcore.load_plan: {where}: entry {key!r}: {exc}") from None
        roots = data.get("roots", {})
        if not isinstance(roots, Mapping):
            raise AmpcoreError(f"ampcore.load_plan: {where}: 'roots' = {roots!r}: expected an object")
        for key, raw in roots.items():
            try:
                plan.roots[str(key)] = check_from_mapping(raw, source)
            except ValueError as exc:
                raise AmpcoreError(f"ampcore.load_plan: {where}: whole-call check {key!r}: {exc}") from None
        return plan

    def save(self, path: str | os.PathLike[str], measured: bool = False) -> Path:
        """Write the plan as JSON to ``path`` (atomically) and return the path (``measured``:
        see :meth:`to_dict`)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        # one temporary file per process and thread: writers never share one; none is left
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(self.to_dict(measured), indent=1, sort_keys=True) + "\n")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target

    def table(self) -> str:
        """The decisions as a text table: shape class, fp32 / low-precision / cast ms, the
        ratio, the spread of the timed runs, their number, decision and source."""
        rows: list[tuple[str, ...]] = [("shape class", "fp32 ms", "low ms", "cast ms", "low/fp32", "spread", "runs")]
        rows[0] += ("load", "checks")
        rows[0] += ("decision", "source")
        for key, e in sorted(self.entries.items()):
            c = e.costs
            if c is None:
                rows.append((key, "-", "-", "-", "-", "-", "-", "-", "-", e.decision, e.source))
                continue
            low = f"{c.low_ms:.3f}" + ("~" if c.estimated else "")
            spread = f"{c.fp32_spread:.2f}/{c.low_spread:.2f}" if c.runs else "-"
            runs = f"{c.runs}" + ("+" if c.checked else "") if c.runs else "-"
            ms = (f"{c.fp32_ms:.3f}", low, f"{c.cast_ms:.3f}", f"{c.ratio:.2f}")
            load = "-" if c.load is None else f"{c.load:.2f}"
            checks = f"{c.checks}" + ("?" if c.provisional else "")
            rows.append((key, *ms, spread, runs, load, checks, e.decision, e.source))
        lines = format_table(rows, "l" + "r" * (len(rows[0]) - 1), rule=None)
        fp = self.fingerprint
        head = (
            f"ampcore auto plan: {fp.get('backend')} ({fp.get('device')}), {fp.get('dtype')}, "
            f"torch {fp.get('torch')}, ampcore {fp.get('ampcore')}, {fp.get('threads')} threads"
        )
        foot = (
            "low ms includes the casts (cast ms); ms are medians of the timed runs; spread: fp32/low "
            "range of the runs over the median; runs: timed rounds, those hit by a spike left out "
            "(+: measured again after a plausibility check); ~: stopped early, one side clearly slower; "
            "load: other work on the device meanwhile (the adapter's; -: not reported); checks: measurements "
            "so far (?: provisional, measured busy or noisy: measured again later in this process and by a "
            "later one); "
            f"a difference within spread / sqrt(runs) (at least {self.margin:.0%}) is a tie and goes to low, "
            "as torch.autocast"
        )
        return "\n".join([head, *lines, foot, *self._roots_table()])

    def _roots_table(self) -> list[str]:
        if not self.roots:
            return []
        rows: list[tuple[str, ...]] = [("whole call (mixed program)", "plan ms", "low ms", "fp32 ms", "plan/low")]
        rows[0] += ("plan/fp32", "spread", "runs", "load", "checks", "runs as", "source")
        for key, c in sorted(self.roots.items()):
            ms = (f"{c.plan_ms:.3f}", f"{c.low_ms:.3f}", f"{c.fp32_ms:.3f}")
            ratios = (f"{c.plan_over_low:.3f}", f"{c.plan_over_fp32:.3f}", f"{c.spread:.3f}")
            load = "-" if c.load is None else f"{c.load:.2f}"
            checks = f"{c.checks} provisional" if c.provisional else str(c.checks)
            rows.append((key, *ms, *ratios, str(c.runs), load, checks, c.verdict, c.source))
        foot = (
            "a mixed program is timed as a whole against the O1 lists alone (low) and float32, "
            "interleaved (a uniform one, every planned call one way, against the other choice alone: "
            "its own side is its own runs, ratio 1.000); plan/low, plan/fp32: medians of per-round "
            "ratios; it runs as planned only "
            "where it wins beyond spread / sqrt(runs) (at least 3%), else as the better fixed choice "
            "(float32 where plan/fp32 over plan/low, low/fp32 round by round, is above 1 beyond that band); load: "
            "other work on the device meanwhile (the adapter's; -: not reported); provisional: "
            "measured busy or noisy, a later process measures it again"
        )
        return ["", *format_table(rows, "l" + "r" * (len(rows[0]) - 1), rule=None), foot]


def entry_from_mapping(key: object, raw: object, source: str) -> PlanEntry:
    """A checked :class:`PlanEntry` (ValueError saying what is wrong)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"shape class {key!r}: expected a non-empty string")
    if not isinstance(raw, Mapping):
        raise ValueError(f"{raw!r}: expected an object with 'decision' and 'costs'")
    decision = raw.get("decision")
    if decision not in ("low", "fp32"):
        raise ValueError(f"decision {decision!r} of {key!r}; valid: 'low', 'fp32'")
    costs = None if raw.get("costs") is None else costs_from_mapping(raw["costs"])
    return PlanEntry(key, decision, costs, source)


def _checked_fingerprint(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    if data.get("format") not in _FORMATS:
        raise AmpcoreError(
            f"ampcore.load_plan: {where} is not an ampcore auto plan: format {data.get('format')!r}, "
            f"expected one of {', '.join(map(str, _FORMATS))}"
        )
    fp = data.get("fingerprint")
    if not isinstance(fp, Mapping) or not all(isinstance(k, str) for k in fp):
        raise AmpcoreError(f"ampcore.load_plan: {where}: 'fingerprint' = {fp!r}: expected an object")
    return dict(fp)


def _checked_margin(data: Mapping[str, Any], where: str) -> float:
    margin = data.get("margin", MARGIN)
    number = isinstance(margin, (int, float)) and not isinstance(margin, bool)
    if not number or not math.isfinite(margin) or not 0 <= margin < 1:
        raise AmpcoreError(f"ampcore.load_plan: {where}: 'margin' = {margin!r}: expected a number in [0, 1)")
    return float(margin)
