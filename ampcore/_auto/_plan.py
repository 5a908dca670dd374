"""Plans: the decisions of ``level="auto"`` per shape class, with the costs behind them.

An :class:`AutoPlan` belongs to one *fingerprint*: backend, device name, low-precision
dtype, torch and ampcore versions, thread count and the environment variables that change
the CPU kernels (``ONEDNN_*``, ``DNNL_*``, ``MKL_*``, ``OMP_*``).  A plan is exported and
loaded as JSON (:meth:`AutoPlan.save`, :func:`load_plan`, ``ampcore plan``), so every rank
of a job and every resumed run uses the same decisions.

Plans of this process live in memory (:func:`current_plan`); measured costs are also kept
on disk, one file per fingerprint, in ``$AMPCORE_AUTO_CACHE`` (a directory; ``off`` or
``0`` disables the disk cache), else ``$XDG_CACHE_HOME/ampcore`` or ``~/.cache/ampcore``.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from .._backends.backend import dtype_name
from .._errors import AmpcoreError
from .._table import format_table
from .._version import __version__
from ._costs import MARGIN, Costs, Decision, decide

__all__ = [
    "CACHE_ENV",
    "AutoPlan",
    "PlanEntry",
    "cache_dir",
    "current_plan",
    "fingerprint",
    "load_plan",
]

#: Environment variable: the directory of the disk cache, or ``off`` / ``0`` to disable it.
CACHE_ENV: Final = "AMPCORE_AUTO_CACHE"
_FORMAT: Final = 1
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
        "threads": torch.get_num_threads(),
        "env": env,
    }


def _key(fp: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


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

    def decision(self, shape_class: str) -> Decision | None:
        """The decision for ``shape_class`` (``None``: not in the plan)."""
        entry = self.entries.get(shape_class)
        return None if entry is None else entry.decision

    def set(self, shape_class: str, costs: Costs, source: str = "measured") -> Decision:
        """Record ``costs`` for ``shape_class`` and return the decision they give."""
        decision = decide(costs, self.margin)
        self.entries[shape_class] = PlanEntry(shape_class, decision, costs, source)
        return decision

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what :meth:`save` writes; broadcast it to DDP ranks as an object)."""
        return {
            "format": _FORMAT,
            "fingerprint": self.fingerprint,
            "margin": self.margin,
            "entries": {key: entry.as_dict() for key, entry in sorted(self.entries.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "loaded", where: str = "plan") -> AutoPlan:
        """A plan from :meth:`to_dict`'s form; AmpcoreError naming what is malformed."""
        try:
            if data.get("format") != _FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {_FORMAT}")
            plan = cls(dict(data["fingerprint"]), margin=float(data.get("margin", MARGIN)))
            for key, raw in data["entries"].items():
                if raw["decision"] not in ("low", "fp32"):
                    raise ValueError(f"decision {raw['decision']!r} of {key!r}; valid: 'low', 'fp32'")
                costs = None if raw.get("costs") is None else Costs(**raw["costs"])
                plan.entries[key] = PlanEntry(key, raw["decision"], costs, source)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise AmpcoreError(
                f"ampcore.load_plan: {where} is not an ampcore auto plan: {type(exc).__name__}: {exc}"
            ) from None
        return plan

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the plan as JSON to ``path`` (atomically) and return the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")
        os.replace(tmp, target)
        return target

    def table(self) -> str:
        """The decisions as a text table: shape class, fp32 / low-precision / cast ms, decision."""
        rows = [("shape class", "fp32 ms", "low ms", "cast ms", "low/fp32", "decision", "source")]
        for key, e in sorted(self.entries.items()):
            c = e.costs
            if c is None:
                rows.append((key, "-", "-", "-", "-", e.decision, e.source))
                continue
            low = f"{c.low_ms:.3f}" + ("~" if c.estimated else "")
            ratio = f"{c.low_ms / c.fp32_ms:.2f}" if c.fp32_ms > 0 else "-"
            rows.append((key, f"{c.fp32_ms:.3f}", low, f"{c.cast_ms:.3f}", ratio, e.decision, e.source))
        lines = format_table(rows, "l" + "r" * (len(rows[0]) - 1), rule=None)
        fp = self.fingerprint
        head = (
            f"ampcore auto plan: {fp.get('backend')} ({fp.get('device')}), {fp.get('dtype')}, "
            f"torch {fp.get('torch')}, ampcore {fp.get('ampcore')}"
        )
        foot = "low ms includes the casts (cast ms); ~: estimated from a probe on part of the batch"
        return "\n".join([head, *lines, foot])


def cache_dir() -> Path | None:
    """The disk cache directory (``None``: disabled with ``AMPCORE_AUTO_CACHE=off``)."""
    value = os.environ.get(CACHE_ENV)
    if value is not None and value.strip().lower() in ("off", "0", "false", "no", ""):
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ampcore"


def cache_file(fp: Mapping[str, Any]) -> Path | None:
    """The disk cache file of fingerprint ``fp`` (``None``: disk cache disabled)."""
    folder = cache_dir()
    return None if folder is None else folder / f"auto-{fp.get('backend')}-{fp.get('dtype')}-{_key(fp)}.json"


class _Plans:
    """The plans of this process, one per fingerprint (a lock guards creation and loading)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.plans: dict[str, AutoPlan] = {}

    def get(self, fp: dict[str, Any]) -> AutoPlan:
        key = _key(fp)
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        with self.lock:
            plan = self.plans.get(key)
            if plan is None:
                plan = _from_cache(fp) or AutoPlan(fp)
                self.plans[key] = plan
            return plan

    def put(self, plan: AutoPlan) -> None:
        with self.lock:
            self.plans[_key(plan.fingerprint)] = plan

    def clear(self) -> None:
        with self.lock:
            self.plans.clear()


_plans = _Plans()


def _from_cache(fp: dict[str, Any]) -> AutoPlan | None:
    path = cache_file(fp)
    if path is None or not path.is_file():
        return None
    try:
        plan = AutoPlan.from_dict(json.loads(path.read_text()), source="cache", where=str(path))
    except (OSError, ValueError, AmpcoreError):
        return None  # a stale or damaged cache file is measured again (and rewritten)
    return plan if plan.fingerprint == fp else None


def write_cache(plan: AutoPlan) -> Path | None:
    """Store ``plan`` in the disk cache (errors are ignored: the cache is an optimisation)."""
    path = cache_file(plan.fingerprint)
    if path is None or plan.frozen:
        return None
    try:
        return plan.save(path)
    except OSError:
        return None


def current_plan(fp: dict[str, Any]) -> AutoPlan:
    """This process's plan for fingerprint ``fp`` (from the disk cache when there is one)."""
    return _plans.get(fp)


def install_plan(plan: AutoPlan) -> None:
    """Make ``plan`` this process's plan for its fingerprint."""
    _plans.put(plan)


def forget_plans() -> None:
    """Drop this process's in-memory plans (the disk cache stays)."""
    _plans.clear()


def read_plan(source: str | os.PathLike[str] | Mapping[str, Any]) -> AutoPlan:
    """A plan from a JSON file or from :meth:`AutoPlan.to_dict`'s form."""
    if isinstance(source, Mapping):
        return AutoPlan.from_dict(source)
    path = Path(source)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise AmpcoreError(f"ampcore.load_plan({str(path)!r}): cannot read the file: {exc.strerror}") from None
    except ValueError as exc:
        raise AmpcoreError(f"ampcore.load_plan({str(path)!r}): not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise AmpcoreError(f"ampcore.load_plan({str(path)!r}): not an ampcore auto plan (a JSON object expected)")
    return AutoPlan.from_dict(data, where=str(path))


def load_plan(
    source: str | os.PathLike[str] | Mapping[str, Any] | AutoPlan, freeze: bool = True, check: bool = True
) -> AutoPlan:
    """Load a plan (a file :meth:`AutoPlan.save` or ``ampcore plan export`` wrote, its dict
    form, or an :class:`AutoPlan`) as this process's plan for its fingerprint.

    Args:
        source: the plan.
        freeze: measure nothing more: shape classes the plan lacks run with the O1 lists,
            so every rank and resumed run decides the same.
        check: raise when the plan's fingerprint (device, dtype, torch and ampcore
            versions, threads, kernel environment) is not this process's; ``False`` uses
            its decisions anyway (e.g. rank 0's plan on identical machines that differ in
            thread count).

    Example::

        >>> import ampcore, torch
        >>> fp = ampcore.auto_plan("cpu").fingerprint
        >>> plan = ampcore.load_plan({"format": 1, "fingerprint": fp, "entries": {}})
        >>> plan.frozen
        True
    """
    given = source if isinstance(source, AutoPlan) else read_plan(source)
    here = _this_process(given.fingerprint)
    if check and here != given.fingerprint:
        diff = sorted(k for k in {*here, *given.fingerprint} if here.get(k) != given.fingerprint.get(k))
        raise AmpcoreError(
            f"ampcore.load_plan: the plan was made for another setting ({', '.join(diff)} differ: "
            f"plan {[given.fingerprint.get(k) for k in diff]}, this process {[here.get(k) for k in diff]}); "
            "pass check=False to use its decisions anyway"
        )
    entries = {key: PlanEntry(key, e.decision, e.costs, "loaded") for key, e in given.entries.items()}
    plan = AutoPlan(here, entries, given.margin, freeze)
    install_plan(plan)
    return plan


def _this_process(fp: Mapping[str, Any]) -> dict[str, Any]:
    from .._backends.registry import resolve_device
    from .._dtypes import parse_dtype

    try:
        resolved = resolve_device(fp.get("backend"))
    except AmpcoreError as exc:
        raise AmpcoreError(
            f"ampcore.load_plan: the plan's backend {fp.get('backend')!r} is not usable here: {exc}"
        ) from None
    dtype = parse_dtype(fp.get("dtype"), "ampcore.load_plan")
    return fingerprint(resolved.backend.name, resolved.backend.device_name(resolved.index or 0), dtype)
