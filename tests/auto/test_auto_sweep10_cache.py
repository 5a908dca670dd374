"""Issue 27, tenth held-out sweep: the disk cache damaged in ways the fifth and ninth sweeps
(``test_auto_sweep5.py``, ``test_auto_sweep9_cache.py``) did not try: a file cut inside an
entry at many places, a key given twice (the damaged copy first or last), figures at the
edges of a float (a subnormal, 1e300, a ratio that overflows), a huge key and a huge
unknown field, a key that is not valid Unicode text (a lone surrogate), one module with
thousands of classes, the cache file a symbolic link (to itself, to a directory, dangling),
and the files of another thread count beside this one.

Each damaged entry or file is refused with a warning naming the file, measured again and
rewritten; a later process reads the file quietly and measures nothing; ``ampcore plan
show`` / ``clear`` work on what is left.  Timings are injected: no wall clock.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep5 import Clock, _key, _path, _process, _quiet_process

import ampcore
from ampcore._auto import Costs, _plan
from ampcore._auto._cache import forget_plans
from ampcore._auto._costs import near_classes
from ampcore._cli.main import main

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


@pytest.mark.parametrize("cut", [0.05, 0.3, 0.5, 0.7, 0.9, 0.99])
def test_a_file_cut_inside_an_entry_is_refused_and_rewritten(cut: float, monkeypatch: pytest.MonkeyPatch) -> None:
    _process(monkeypatch, Clock())
    path = _path()
    text = path.read_text()
    path.write_text(text[: int(len(text) * cut)])
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"cache {re.escape(str(path))}.*not readable JSON"):
        _process(monkeypatch, clock)
    assert "low" in clock.labels and json.loads(path.read_text())["entries"][_key()]["decision"] == "low"
    _quiet_process(monkeypatch, "low")


def _duplicated(text: str, key: str, damaged_first: bool) -> str:
    """The file with ``key``'s entry written twice in its ``entries`` object (JSON allows
    it; the reader keeps the last), one copy with its figures edited."""
    data = json.loads(text)
    good = json.dumps(data["entries"][key])
    bad = json.dumps({**data["entries"][key], "decision": "fp32"})
    first, second = (bad, good) if damaged_first else (good, bad)
    data["entries"][key] = "@@"
    return json.dumps(data).replace('"@@"', f"{first}, {json.dumps(key)}: {second}")


@pytest.mark.parametrize("damaged_first", [True, False], ids=["damaged-first", "damaged-last"])
def test_a_key_given_twice_uses_the_copy_the_reader_keeps_only_if_it_is_sound(
    damaged_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    path.write_text(_duplicated(path.read_text(), key, damaged_first))
    assert json.loads(path.read_text())["entries"][key]["decision"] == ("low" if damaged_first else "fp32")
    clock = Clock()
    if damaged_first:  # the copy kept is the sound one, sealed: used as it is
        _process(monkeypatch, clock)
        assert "low" not in clock.labels
    else:
        with pytest.warns(ampcore.AmpcoreWarning, match=re.escape(key[:20])):
            _process(monkeypatch, clock)
        assert "low" in clock.labels
    assert ampcore.auto_plan("cpu").entries[key].decision == "low"
    _quiet_process(monkeypatch, "low")


def _costs(e: dict[str, Any], **fields: Any) -> None:
    e["costs"].update(fields)


#: figures at the edges of a float, and sizes no entry has
EDGE_EDITS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "low-subnormal": lambda d, k: _costs(d[k], low_ms=5e-324),
    "fp32-subnormal": lambda d, k: _costs(d[k], fp32_ms=5e-324, decision="low"),
    "both-1e300": lambda d, k: _costs(d[k], fp32_ms=4e300, low_ms=1e300),
    "ratio-overflows": lambda d, k: _costs(d[k], fp32_ms=1e308, low_ms=1e-308),
    "cast-1e300": lambda d, k: _costs(d[k], cast_ms=1e300),
    "spread-1e300": lambda d, k: _costs(d[k], fp32_spread=1e300),
    "checks-huge": lambda d, k: _costs(d[k], checks=10**18),
    "load-huge": lambda d, k: _costs(d[k], load=1e300),
    "unknown-field-10mb": lambda d, k: _costs(d[k], note="x" * 10_000_000),
    "decision-10mb": lambda d, k: d[k].update(decision="low" * 3_000_000),
}


@pytest.mark.parametrize("edit", list(EDGE_EDITS))
def test_an_entry_with_figures_at_the_edges_of_a_float_is_measured_again(
    edit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    data = json.loads(path.read_text())
    EDGE_EDITS[edit](data["entries"], key)
    path.write_text(json.dumps(data))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"{re.escape(path.name)}.*{re.escape(key[:20])}"):
        _process(monkeypatch, clock)
    entry = ampcore.auto_plan("cpu").entries[key]
    assert "low" in clock.labels and (entry.decision, entry.source) == ("low", "measured")
    assert path.stat().st_size < 1_000_000  # the huge field is not written back
    _quiet_process(monkeypatch, "low")


@pytest.mark.parametrize("kind", ["huge-key", "lone-surrogate-key", "control-characters-key"])
def test_an_entry_of_a_strange_key_is_refused_and_plan_show_and_clear_work(
    kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    data = json.loads(path.read_text())
    strange = {
        "huge-key": key + "x" * 1_000_000,
        "lone-surrogate-key": key + "\ud800",
        "control-characters-key": "\x00\x1b[2J" + key,
    }
    data["entries"][strange[kind]] = data["entries"][key]
    path.write_text(json.dumps(data))  # (ensure_ascii: the surrogate as an escape, valid JSON)
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=re.escape(path.name)):
        _process(monkeypatch, clock)
    assert "low" not in clock.labels  # the model's own entry is sound: used as it is
    forget_plans()
    capsys.readouterr()
    assert main(["plan", "show", "--device", "cpu"]) == 0
    shown = capsys.readouterr().out
    assert key[:30] in shown and "\ud800" not in shown and "\x1b" not in shown
    assert main(["plan", "clear", "--device", "cpu"]) == 0 and not path.exists()


def test_a_cache_of_thousands_of_classes_of_one_module_is_read_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """5,000 classes of one Linear (a forged file, or a model fed every sequence length):
    each class is compared with its neighbours, not with every class of the module."""
    plan = ampcore.auto_plan("cpu")
    for n in range(1, 5001):
        plan.set(f"Linear(in_features=32, out_features=8, bias=True) in=[{n}x32] grad", Costs(2.0, 1.0, 0.1))
    plan.save(_path())
    calls = [0]
    real = _plan.shape_neighbours

    def counted(a: str, b: str) -> bool:
        calls[0] += 1
        return real(a, b)

    monkeypatch.setattr(_plan, "shape_neighbours", counted)
    forget_plans()
    started = time.process_time()
    assert len(ampcore.auto_plan("cpu").entries) > 0
    assert calls[0] <= 5000 * 50, calls[0]  # not 25 million pairs
    assert time.process_time() - started < 60  # (a bound far above any machine: a hang, not a speed)


@pytest.mark.parametrize("link", ["to-itself", "to-a-directory", "dangling"])
def test_a_cache_file_that_is_a_symbolic_link_is_replaced_by_a_file(
    link: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    target = {"to-itself": path, "to-a-directory": tmp_path, "dangling": tmp_path / "gone.json"}[link]
    path.symlink_to(target)
    clock = Clock()
    model = _process(monkeypatch, clock)
    assert "low" in clock.labels and all(p.grad is not None for p in model.parameters())
    assert path.is_file() and not path.is_symlink()
    _quiet_process(monkeypatch, "low")


def test_files_of_another_thread_count_are_kept_and_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache written by a process with 2 threads, read by one with 1: two files, each
    process reads its own (the other's costs are of another machine's setting)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _process(monkeypatch, Clock(fp32_best=True))
        two = _path()
        torch.set_num_threads(1)
        clock = Clock()
        _process(monkeypatch, clock)
        one = _path()
        assert one != two and one.is_file() and two.is_file()
        assert "low" in clock.labels and ampcore.auto_plan("cpu").entries[_key()].decision == "low"
        torch.set_num_threads(2)
        _quiet_process(monkeypatch, "fp32")
        torch.set_num_threads(1)
        _quiet_process(monkeypatch, "low")
    finally:
        torch.set_num_threads(threads)


def test_neighbours_found_by_lookup_are_those_a_scan_finds() -> None:
    """``near_classes`` (used above ``MANY_CLASSES`` classes of one module) finds the same
    neighbours as comparing with every class: buckets of two inputs, dtypes, grad modes."""
    plan = ampcore.auto_plan("cpu")
    module = "Linear(in_features=32, out_features=8, bias=True)"
    for b in (1, 2, 4, 8, 16, 32, 64, 3, 6, 12):
        for t in (16, 32, 64):
            for dtype in ("", ":bfloat16"):
                for grad in ("grad", "no-grad"):
                    plan.set(f"{module} in=[{b}x{t}x32{dtype}, {t}x{b}] {grad}", Costs(2.0, 1.0, 0.1))
    keys = list(plan.entries)
    near = near_classes(keys)
    for key in keys:
        assert dict(plan.neighbours(key, keys)) == dict(plan.neighbours(key, near(key))), key
