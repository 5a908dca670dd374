"""This process's plans, and the disk cache that heals.

Plans of this process live in memory (:func:`current_plan`), one per fingerprint; measured
costs are also kept on disk, one file per fingerprint, in ``$AMPCORE_AUTO_CACHE`` (a
directory; ``off`` or ``0`` disables the disk cache), else ``$XDG_CACHE_HOME/ampcore`` or
``~/.cache/ampcore``.

A cache file is an optimisation, never an authority.  When read, a file of another format
or fingerprint (versions, device, host ISA flags, threads, kernel environment) is ignored,
and each entry is checked: a damaged one (wrong types, non-finite numbers) or an
implausible one (:func:`~._costs.implausible`: a ratio beyond what hardware does, a spread
too wide, a disagreement with the same module on inputs of another dtype) is dropped, with
one warning naming the file and the entries, and measured again; the file is rewritten
without them.  ``ampcore plan clear`` deletes the files.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from .._errors import AmpcoreWarning, warn_at

try:
    import fcntl
except ImportError:  # (Windows: writes are atomic, not merged under a lock)
    fcntl = None  # type: ignore[assignment]

from ._checks import check_from_mapping
from ._costs import MANY_CLASSES, by_module, decide, implausible, near_classes
from ._plan import FORMAT, AutoPlan, PlanEntry, _key, entry_from_mapping, seal

__all__ = [
    "CACHE_ENV",
    "MAX_CACHE_BYTES",
    "cache_dir",
    "cache_file",
    "cache_files",
    "current_plan",
    "forget_plans",
    "install_plan",
    "write_cache",
]

#: Environment variable: the directory of the disk cache, or ``off`` / ``0`` to disable it.
CACHE_ENV: Final = "AMPCORE_AUTO_CACHE"
#: A cache file larger than this is refused unread (an entry takes about 500 bytes).
MAX_CACHE_BYTES: Final = 64 << 20


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


def cache_files() -> list[Path]:
    """Every plan file in the disk cache directory (of any fingerprint)."""
    folder = cache_dir()
    return [] if folder is None or not folder.is_dir() else sorted(folder.glob("auto-*.json"))


class _Plans:
    """The plans of this process, one per fingerprint (a lock guards creation and loading)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.plans: dict[str, AutoPlan] = {}
        #: id(fingerprint dict) -> (that dict, its plan): the hooks ask with the same dict
        #: object every call; hashing its JSON each time would cost more than the call
        self.by_object: dict[int, tuple[dict[str, Any], AutoPlan]] = {}
        #: changes when a plan is put or the plans are cleared (caches of plans compare it)
        self.generation = 0

    def get(self, fp: dict[str, Any]) -> AutoPlan:
        found = self.by_object.get(id(fp))
        if found is not None and found[0] is fp:
            return found[1]
        key = _key(fp)
        with self.lock:
            plan = self.plans.get(key)
            if plan is None:
                plan = _from_cache(fp) or AutoPlan(fp)
                self.plans[key] = plan
            self.by_object[id(fp)] = (fp, plan)
            return plan

    def put(self, plan: AutoPlan) -> None:
        with self.lock:
            self.plans[_key(plan.fingerprint)] = plan
            self.by_object = {}
            self.generation += 1

    def clear(self) -> None:
        with self.lock:
            self.plans.clear()
            self.by_object = {}
            self.generation += 1


_plans = _Plans()
#: this process's plans (``plans.generation`` changes whenever a plan is put or dropped)
plans = _plans


def _from_cache(fp: dict[str, Any]) -> AutoPlan | None:
    path = cache_file(fp)
    if path is None or not path.is_file():
        return None
    plan, dropped = _read(fp, path)
    if dropped:
        _warn(path, dropped)
        if plan is not None:
            write_cache(plan)
    return plan


def _read(fp: dict[str, Any], path: Path) -> tuple[AutoPlan | None, list[str]]:
    """The plan the file at ``path`` holds for ``fp``, its entries and whole-call checks
    checked (``None``: no usable file), and the reasons of what was dropped."""
    try:
        size = path.stat().st_size
        if size > MAX_CACHE_BYTES:  # not read into memory: no plan is that large
            return None, [f"the file is {size} bytes, more than any plan ({MAX_CACHE_BYTES})"]
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, []
    except (OSError, ValueError, RecursionError) as exc:  # (nested deeper than the reader's recursion)
        return None, [f"the file is not readable JSON ({type(exc).__name__})"]
    if not isinstance(data, Mapping):
        return None, [f"the file is not an ampcore plan cache (a JSON object expected, not {type(data).__name__})"]
    if data.get("format") != FORMAT or data.get("fingerprint") != fp:
        return None, []  # another format or setting: measured again, and rewritten
    plan = AutoPlan(fp)
    seals = data.get("seals")
    seals = seals if isinstance(seals, Mapping) else {}
    entries = data.get("entries")
    dropped = [] if isinstance(entries, Mapping) else ["'entries' is not an object"]
    dropped += [] if isinstance(data.get("seals"), (Mapping, type(None))) else ["'seals' is not an object"]
    for key, raw in entries.items() if isinstance(entries, Mapping) else ():
        try:
            entry = _entry(fp, key, raw, _section(seals, "entries").get(key), plan.margin)
        except ValueError as exc:
            dropped.append(f"{key!r}: {exc}")
            continue
        plan.entries[entry.shape_class] = entry
        if entry.costs is not None and entry.costs.provisional:  # measured busy or noisy: again here (._heal)
            plan.due.add(entry.shape_class)
    dropped += _disagreeing(plan) + _checks(plan, data.get("roots", {}), _section(seals, "roots"))
    return plan, dropped


def _section(seals: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    found = seals.get(name)
    return found if isinstance(found, Mapping) else {}


def _entry(fp: dict[str, Any], key: str, raw: object, sealed: object, margin: float) -> PlanEntry:
    """A cache entry, checked: its types, measured figures (a cache holds no decision without
    them), a decision that follows from them, its seal (ampcore wrote it as it is) and the
    figures' plausibility alone (neighbours: :func:`_disagreeing`).  ValueError: why not."""
    entry = entry_from_mapping(key, raw, "cache")
    if entry.costs is None:
        raise ValueError(
            "no costs: the cache keeps measured decisions only (a decision written by hand applies in "
            "the process that loads it with ampcore.load_plan, and is not written to the cache)"
        )
    given = decide(entry.costs, margin)
    if given != entry.decision:
        raise ValueError(f"decision {entry.decision!r} does not follow from its figures (they give {given!r})")
    _check_seal(fp, key, raw, sealed)
    reason = implausible(entry.costs)
    if reason is not None:
        raise ValueError(reason)
    return entry


def _check_seal(fp: dict[str, Any], key: str, raw: object, sealed: object) -> None:
    """ValueError unless ``sealed`` is the :func:`~._plan.seal` of ``raw``: an entry written
    by hand, by an older ampcore, or changed after ampcore wrote it is measured again."""
    if sealed is None:
        raise ValueError("no seal (written by hand or by an older ampcore): its figures are not trusted")
    if sealed != seal(fp, key, raw):
        raise ValueError("changed after ampcore wrote it (its seal does not match its figures)")


def _disagreeing(plan: AutoPlan) -> list[str]:
    """Drop the entries that disagree with a neighbour (both sides: either may be the
    outlier, and measuring again settles it); their reasons."""
    found = []
    for group in by_module(plan.entries).values():
        near = near_classes(group) if len(group) > MANY_CLASSES else None  # (a forged file: by lookup)
        for key in group:
            costs = plan.entries[key].costs
            reason = None if costs is None else plan.suspect(key, costs, group if near is None else near(key))
            if reason is not None:
                found.append((key, reason))
    for key, _ in found:
        plan.drop(key)  # (and not merged back from the file by a later write: see _merged)
    return [f"{key!r}: {reason}" for key, reason in found]


def _checks(plan: AutoPlan, raw: object, seals: Mapping[str, Any]) -> list[str]:
    """Read the whole-call checks into ``plan``; the reasons of those dropped (damaged, a
    verdict that does not follow from its figures, or edited after ampcore wrote it: checked
    again at the root's next call)."""
    if not isinstance(raw, Mapping):
        return ["'roots' is not an object"]
    dropped = []
    for key, value in raw.items():
        try:
            check = check_from_mapping(value, "cache")
            _check_seal(plan.fingerprint, str(key), value, seals.get(key))
            plan.roots[str(key)] = check
        except ValueError as exc:
            dropped.append(f"whole-call check {key!r}: {exc}")
    return dropped


def _warn(path: Path, reasons: list[str]) -> None:
    """One warning, pointing at the cache file itself."""
    warn_at(
        f"ampcore level='auto' cache {path}: {len(reasons)} damaged or implausible entr"
        f"{'y is' if len(reasons) == 1 else 'ies are'} measured again: {'; '.join(reasons)}",
        AmpcoreWarning,
        str(path),
    )


def write_cache(plan: AutoPlan) -> Path | None:
    """Store ``plan`` in the disk cache, with the entries and whole-call checks another
    process wrote there meanwhile (:func:`_merged`; errors are ignored: the cache is an
    optimisation)."""
    path = cache_file(plan.fingerprint)
    if path is None or plan.frozen:
        return None
    try:
        with _locked(path):
            merged = _merged(plan, path)
            written = merged.save(path, measured=True)  # a decision written by hand applies here only
            _seen[path] = (_stamp(path), merged)
            return written
    except OSError as exc:
        if path not in _unwritable:  # once per file: every later write fails the same way
            _unwritable.add(path)
            warn_at(
                f"ampcore level='auto' cannot write its plan cache {path} ({type(exc).__name__}: "
                f"{exc.strerror or exc}); this process keeps its measurements in memory, later ones "
                f"measure again (set {CACHE_ENV} to a writable directory, or to 'off')",
                AmpcoreWarning,
                str(path),
            )
        return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s directory (where the OS has ``fcntl``; no file
    of its own is left there): a process's read of the file and its write of the merged
    plan are not interleaved with another's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some NFS): merged, not locked
            pass
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _merged(plan: AutoPlan, path: Path) -> AutoPlan:
    """``plan`` with what the file at ``path`` holds beside it: another process sharing the
    cache directory that measured other models (other shape classes, other roots) since
    this one read the file.  ``plan``'s own entries and checks win; an entry ``plan``
    dropped (measured again: :meth:`~._plan.AutoPlan.drop`), a damaged or edited one
    (:func:`_read`'s checks) and one that disagrees with a neighbour of ``plan`` are not
    taken.  ``plan`` itself is left as it is (its programs stay valid)."""
    seen = _seen.get(path)
    if seen is not None and seen[0] == _stamp(path):  # the file as this process last wrote it
        found: AutoPlan | None = seen[1]  # (with what it took from other processes then)
    else:
        found, _ = _read(plan.fingerprint, path)
    if found is None:
        return plan
    extra = {k: e for k, e in found.entries.items() if k not in plan.entries and k not in plan.dropped}
    roots = {k: c for k, c in found.roots.items() if k not in plan.roots}
    if not extra and not roots:
        return plan
    merged = AutoPlan(plan.fingerprint, dict(plan.entries), plan.margin, roots={**roots, **plan.roots})
    groups = by_module([*plan.entries, *extra])
    for key, entry in extra.items():
        mine = [k for k in groups[key.rpartition(" in=[")[0]] if k in plan.entries]
        if entry.costs is not None and plan.suspect(key, entry.costs, mine) is None:
            merged.entries[key] = entry
    return merged


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells one version of the file at ``path`` from another (``None``: no file)."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


#: cache file -> its :func:`_stamp` after this process's last write, and the plan written
#: (this process's entries and those it took from the file): read instead of the file while
#: no other process replaced it
_seen: dict[Path, tuple[tuple[int, int, int] | None, AutoPlan]] = {}
#: cache files a write failed for (warned once)
_unwritable: set[Path] = set()


def current_plan(fp: dict[str, Any]) -> AutoPlan:
    """This process's plan for fingerprint ``fp`` (from the disk cache when there is one)."""
    return _plans.get(fp)


def install_plan(plan: AutoPlan) -> None:
    """Make ``plan`` this process's plan for its fingerprint."""
    _plans.put(plan)


def forget_plans() -> None:
    """Drop this process's in-memory plans (the disk cache stays)."""
    _plans.clear()
