"""Issue 27, eleventh held-out sweep: the disk cache damaged in ways the fifth, ninth and
tenth sweeps (``test_auto_sweep5.py``, ``test_auto_sweep9_cache.py``,
``test_auto_sweep10_cache.py``) did not try: fields renamed (of an entry, of its figures, of
the file), an entry moved to another shape class's key, whole-call checks with negative,
NaN or infinite times or renamed fields, a file written by another ampcore version (under
this version's name, and beside it under its own), and the file replaced while a process
runs (by garbage, by nothing, by a directory, by another process's plan of other layers or
of the same ones).

Each damaged entry or file is refused (with a warning naming the file where ampcore wrote
something it cannot trust), measured again and rewritten; a later process reads the file
quietly and measures nothing.  A file replaced mid-run never raises into the user's step.
Timings are injected (``test_auto_sweep5.Clock``): no wall clock.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep5 import BF16, Clock, X, _key, _net, _path, _process, _quiet_process

import ampcore
from ampcore._auto import _roots, _store
from ampcore._auto._cache import cache_file, forget_plans
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _renamed(mapping: dict[str, Any], old: str, new: str) -> None:
    mapping[new] = mapping.pop(old)


#: an entry with a field renamed (as a hand edit, or a tool of its own, would)
RENAMES: dict[str, Callable[[dict[str, Any]], None]] = {
    "decision-to-choice": lambda e: _renamed(e, "decision", "choice"),
    "costs-to-cost": lambda e: _renamed(e, "costs", "cost"),
    "low-ms-to-bf16-ms": lambda e: _renamed(e["costs"], "low_ms", "bf16_ms"),
    "fp32-ms-to-float32-ms": lambda e: _renamed(e["costs"], "fp32_ms", "float32_ms"),
    "runs-to-repeats": lambda e: _renamed(e["costs"], "runs", "repeats"),
    "fields-upper-case": lambda e: e["costs"].update({k.upper(): e["costs"].pop(k) for k in list(e["costs"])}),
}


@pytest.mark.parametrize("rename", list(RENAMES))
def test_an_entry_with_a_field_renamed_is_measured_again(rename: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    data = json.loads(path.read_text())
    RENAMES[rename](data["entries"][key])
    path.write_text(json.dumps(data))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"{re.escape(path.name)}.*{re.escape(key[:20])}"):
        _process(monkeypatch, clock)
    entry = ampcore.auto_plan("cpu").entries[key]
    assert "low" in clock.labels and (entry.decision, entry.source) == ("low", "measured")
    _quiet_process(monkeypatch, "low")


@pytest.mark.parametrize(("old", "new"), [("entries", "plans"), ("seals", "seal")])
def test_a_file_with_a_top_level_field_renamed_is_measured_again(
    old: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _process(monkeypatch, Clock())
    path = _path()
    data = json.loads(path.read_text())
    _renamed(data, old, new)
    path.write_text(json.dumps(data))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=re.escape(path.name)):
        _process(monkeypatch, clock)
    assert "low" in clock.labels and ampcore.auto_plan("cpu").entries[_key()].source == "measured"
    _quiet_process(monkeypatch, "low")


def test_an_entry_moved_to_another_classes_key_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures of two classes swapped (each under the other's key): a seal names its
    key, so neither is trusted."""
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    data = json.loads(path.read_text())
    other = next(k for k in data["entries"] if k != key)
    data["entries"][other], data["entries"][key] = data["entries"][key], data["entries"][other]
    path.write_text(json.dumps(data))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match="seal does not match"):
        _process(monkeypatch, clock)
    assert clock.labels.count("low") >= 2  # both measured again
    _quiet_process(monkeypatch, "low")


# -- whole-call checks ----------------------------------------------------------------------


def _mixed(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """A process training a mixed program (the last layer float32, given): a whole-call check."""
    model = _net()
    with torch.enable_grad():
        last = tuple(str(shape_class(model[2], (torch.randn(8, 32, dtype=d),), "cpu")) for d in (BF16, torch.float32))
    _process(monkeypatch, clock, model, n=4, fp32=last)


#: a whole-call check's figures damaged
CHECK_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "plan-ms-negative": lambda c: c.update(plan_ms=-c["plan_ms"]),
    "low-ms-nan": lambda c: c.update(low_ms=math.nan),
    "fp32-ms-inf": lambda c: c.update(fp32_ms=math.inf),
    "ratio-negative": lambda c: c.update(plan_over_low=-1.0),
    "spread-inf": lambda c: c.update(spread=math.inf),
    "verdict-renamed": lambda c: _renamed(c, "verdict", "choice"),
    "plan-ms-renamed": lambda c: _renamed(c, "plan_ms", "program_ms"),
    "runs-zero": lambda c: c.update(runs=0),
}


@pytest.mark.parametrize("edit", list(CHECK_EDITS))
def test_a_whole_call_check_with_damaged_times_is_checked_again(edit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    _mixed(monkeypatch, clock)
    assert "root-plan" in clock.labels
    path = _path()
    data = json.loads(path.read_text())
    ((key, check),) = data["roots"].items()
    CHECK_EDITS[edit](check)
    path.write_text(json.dumps(data))  # (NaN and Infinity as Python's json writes them)
    again = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"whole-call check {re.escape(repr(key))}"):
        _mixed(monkeypatch, again)
    assert "root-plan" in again.labels and ampcore.auto_plan("cpu").roots[key].verdict == "low"
    forget_plans()
    healed = json.loads(path.read_text())["roots"][key]
    times = [healed[f] for f in ("plan_ms", "low_ms", "fp32_ms")]
    assert all(isinstance(t, float) and math.isfinite(t) and t > 0 for t in times), healed


# -- another ampcore version ----------------------------------------------------------------


def test_a_file_of_another_ampcore_version_under_this_name_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file copied from another installation (its fingerprint names another ampcore
    version) is not used, and is rewritten for this one."""
    _process(monkeypatch, Clock(fp32_best=True))
    path = _path()
    data = json.loads(path.read_text())
    data["fingerprint"]["ampcore"] = "0.0.1"
    path.write_text(json.dumps(data))
    clock = Clock()
    _process(monkeypatch, clock)
    assert "low" in clock.labels and ampcore.auto_plan("cpu").entries[_key()].decision == "low"
    assert json.loads(path.read_text())["fingerprint"] == ampcore.auto_plan("cpu").fingerprint
    _quiet_process(monkeypatch, "low")


def test_a_version_edited_to_this_one_keeps_no_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another version's file with its fingerprint edited to this version's: its seals were
    made for the other fingerprint, so every entry is measured again."""
    _process(monkeypatch, Clock(fp32_best=True))
    path = _path()
    data = json.loads(path.read_text())
    fp = dict(data["fingerprint"])
    data["fingerprint"]["ampcore"] = "0.0.1"
    other = cache_file(data["fingerprint"])
    assert other is not None and other != path
    # what that version would have written: the same figures sealed for its own fingerprint
    from ampcore._auto._plan import seal

    data["seals"]["entries"] = {k: seal(data["fingerprint"], k, e) for k, e in data["entries"].items()}
    data["fingerprint"] = fp
    path.write_text(json.dumps(data))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match="seal does not match"):
        _process(monkeypatch, clock)
    assert "low" in clock.labels and ampcore.auto_plan("cpu").entries[_key()].decision == "low"
    _quiet_process(monkeypatch, "low")


def test_a_file_of_another_version_beside_this_one_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    _process(monkeypatch, Clock(fp32_best=True))
    path = _path()
    data = json.loads(path.read_text())
    data["fingerprint"]["ampcore"] = "0.0.1"
    other = cache_file(data["fingerprint"])
    assert other is not None
    other.write_text(json.dumps(data))
    path.unlink()
    before = other.read_bytes()
    clock = Clock()
    _process(monkeypatch, clock)
    assert "low" in clock.labels and other.read_bytes() == before and path.is_file()
    _quiet_process(monkeypatch, "low")


# -- the file replaced while a process runs ---------------------------------------------------


def _other_layers_file(monkeypatch: pytest.MonkeyPatch) -> str:
    """The text of a cache file written by a process that trained other layers only."""
    path = _path()
    saved = path.read_bytes()
    path.unlink()
    forget_plans()
    _store.forget()
    _roots.forget()
    monkeypatch.setattr("test_auto_sweep5.X", torch.randn(8, 24))
    wide = torch.nn.Sequential(torch.nn.Linear(24, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8))
    _process(monkeypatch, Clock(), wide)
    text = path.read_text()
    monkeypatch.setattr("test_auto_sweep5.X", X)
    path.write_bytes(saved)
    return text


REPLACEMENTS: dict[str, Callable[[Any, str], None]] = {
    "garbage": lambda path, other: path.write_text("\x00 not json"),
    "deleted": lambda path, other: path.unlink(),
    "empty": lambda path, other: path.write_text(""),
    "other-layers": lambda path, other: path.write_text(other),
    "same-layers-fp32": lambda path, other: path.write_text(_flipped(path.read_text())),
}


def _flipped(text: str) -> str:
    """The file as another process that measured float32 faster for the same layers wrote
    it (sealed: the figures are ampcore's)."""
    from ampcore._auto._plan import seal

    data = json.loads(text)
    for key, entry in data["entries"].items():
        entry["costs"].update(fp32_ms=entry["costs"]["low_ms"] / 2)
        entry["decision"] = "fp32"
        data["seals"]["entries"][key] = seal(data["fingerprint"], key, entry)
    return json.dumps(data)


@pytest.mark.parametrize("how", list(REPLACEMENTS))
def test_the_file_replaced_mid_run_never_raises_and_ends_valid(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two steps of one process, the cache file is replaced; the process then
    measures a new class (another batch size) and writes: no exception, the file is a
    valid plan again holding this process's entries (and, where the replacement held valid
    entries of other layers, those too), and a later process reads it quietly."""
    model = _process(monkeypatch, Clock())
    path = _path()
    other = _other_layers_file(monkeypatch) if how == "other-layers" else ""
    REPLACEMENTS[how](path, other)
    for batch in (X[:3], X[:3], X):
        with ampcore.autocast("cpu", level="auto"):
            out = model(batch)
        out.float().sum().backward()
    data = json.loads(path.read_text())
    with torch.enable_grad():
        three = shape_class(model[0], (X[:3],), "cpu")
    assert three in data["entries"] and data["entries"][three]["decision"] == "low"
    if how == "other-layers":
        assert set(json.loads(other)["entries"]) <= set(data["entries"])
    forget_plans()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)
        plan = ampcore.auto_plan("cpu")
    assert _key() in plan.entries and three in plan.entries


def test_a_directory_in_the_files_place_mid_run_warns_once_and_training_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _process(monkeypatch, Clock())
    path = _path()
    path.unlink()
    path.mkdir()
    with pytest.warns(ampcore.AmpcoreWarning, match="cannot write its plan cache"):
        for batch in (X[:3], X[:5], X):
            with ampcore.autocast("cpu", level="auto"):
                out = model(batch)
            out.float().sum().backward()
    assert path.is_dir()
