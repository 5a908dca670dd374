"""Reading plan files and loading a plan as this process's (``ampcore.load_plan``).

A plan file is JSON written by :meth:`~._plan.AutoPlan.save` or ``ampcore plan export``.
Everything read is checked (:meth:`~._plan.AutoPlan.from_dict`) and an error names the
file; a plan made for another setting (its fingerprint) is refused unless ``check=False``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._errors import AmpcoreError
from .._validate import check_bool
from ._plan import AutoPlan, PlanEntry, fingerprint

__all__ = ["load_plan", "read_plan"]


def read_plan(source: object, call: str = "ampcore.load_plan") -> AutoPlan:
    """A plan from a JSON file or from :meth:`AutoPlan.to_dict`'s form (AmpcoreError naming
    the argument when ``source`` is neither)."""
    if isinstance(source, Mapping):
        return AutoPlan.from_dict(source)
    if not isinstance(source, (str, os.PathLike)) or isinstance(source, bytes):
        raise AmpcoreError(
            f"{call}(source={source!r}): expected the path of a plan file (str or os.PathLike), a plan "
            "dict (AutoPlan.to_dict()) or an AutoPlan"
        )
    path = Path(source)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise AmpcoreError(f"ampcore.load_plan({str(path)!r}): cannot read the file: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:  # (RecursionError: nested deeper than the reader goes)
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
        >>> plan = ampcore.load_plan({"format": 2, "fingerprint": fp, "entries": {}})
        >>> plan.frozen
        True
    """
    check_bool("ampcore.load_plan", "freeze", freeze)
    check_bool("ampcore.load_plan", "check", check)
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
    plan.roots = {key: replace(check, source="loaded") for key, check in given.roots.items()}
    from ._cache import install_plan

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
