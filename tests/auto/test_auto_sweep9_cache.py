"""Issue 27, ninth held-out sweep: the disk cache damaged in ways the fifth sweep
(``test_auto_sweep5.py``) and the trust tests did not try: entries of the wrong JSON type,
figures a float cannot hold or of the wrong kind, fields of the file of the wrong type,
nesting deeper than the JSON reader's recursion, bytes that are not UTF-8, a byte order
mark, entries of layers the model does not have (valid and damaged), a fingerprint missing,
of the wrong type or of another format, and a file ampcore cannot read.

Each damaged entry or file is refused with a warning naming the file (and the entry),
measured again and rewritten; a later process reads the file quietly and measures nothing.
Where only entries of other layers are damaged, the model's own entries are used as they
are (not measured again).  Timings are injected (``test_auto_sweep5.Clock``): no wall clock.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep5 import Clock, _key, _path, _process, _quiet_process

import ampcore

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _costs(e: dict[str, Any], **fields: Any) -> None:
    e["costs"].update(fields)


#: edits of the first layer's entry (measured low 1 ms against float32 4 ms: decision low)
ENTRY_EDITS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "entry-a-list": lambda d, k: d.update({k: [1, 2]}),
    "entry-null": lambda d, k: d.update({k: None}),
    "entry-a-number": lambda d, k: d.update({k: 4.0}),
    "entry-a-string": lambda d, k: d.update({k: "low"}),
    "costs-a-list": lambda d, k: d[k].update(costs=[4.0, 1.0, 0.1], decision="fp32"),
    "costs-a-string": lambda d, k: d[k].update(costs="4.0/1.0"),
    "decision-an-int": lambda d, k: d[k].update(decision=1),
    "decision-a-list": lambda d, k: d[k].update(decision=["low"]),
    "figure-a-bool": lambda d, k: _costs(d[k], low_ms=True),
    "figure-too-big-for-a-float": lambda d, k: _costs(d[k], low_ms=10**400),
    "figure-a-dict": lambda d, k: _costs(d[k], fp32_ms={"ms": 4.0}),
    "spread-nan": lambda d, k: _costs(d[k], fp32_spread=math.nan),
    "spread-negative": lambda d, k: _costs(d[k], low_spread=-0.5),
    "runs-negative": lambda d, k: _costs(d[k], runs=-3),
    "runs-fractional": lambda d, k: _costs(d[k], runs=5.5),
    "checked-a-string": lambda d, k: _costs(d[k], checked="yes"),
    "load-negative": lambda d, k: _costs(d[k], load=-1.0),
    "checks-zero": lambda d, k: _costs(d[k], checks=0),
    "entry-nested-near-the-limit": lambda d, k: d.update({k: json.loads("[" * 900 + "]" * 900)}),
    "costs-nested-near-the-limit": lambda d, k: d[k].update(costs=json.loads("[" * 900 + "]" * 900)),
}


@pytest.mark.parametrize("edit", list(ENTRY_EDITS))
def test_an_entry_of_the_wrong_type_is_measured_again_and_replaced(edit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    data = json.loads(path.read_text())
    ENTRY_EDITS[edit](data["entries"], key)
    path.write_text(json.dumps(data))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"{re.escape(path.name)}.*{re.escape(key[:20])}"):
        _process(monkeypatch, clock)
    entry = ampcore.auto_plan("cpu").entries[key]
    assert "low" in clock.labels and (entry.decision, entry.source) == ("low", "measured")
    assert json.loads(path.read_text())["entries"][key]["decision"] == "low"  # rewritten
    _quiet_process(monkeypatch, "low")


_DEEP = "[" * 50_000 + "]" * 50_000

#: damage of the whole file (text in, text or bytes out)
FILE_EDITS: dict[str, Callable[[str], str | bytes]] = {
    "nested-deeper-than-the-reader": lambda text: "[" * 100_000 + "]" * 100_000,
    "a-field-nested-deep": lambda text: json.dumps(json.loads(text))[:-1] + ', "x": ' + _DEEP + "}",
    "not-utf8": lambda text: b"\x80\xff" + text.encode(),
    "byte-order-mark": lambda text: "\ufeff" + text,
    "trailing-garbage": lambda text: text + "}{",
    "two-objects": lambda text: text + text,
    "a-json-string": lambda text: json.dumps(text),
    "null": lambda text: "null",
}


@pytest.mark.parametrize("edit", list(FILE_EDITS))
def test_a_damaged_file_is_refused_with_a_warning_and_rewritten(edit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _process(monkeypatch, Clock())
    path = _path()
    damaged = FILE_EDITS[edit](path.read_text())
    if isinstance(damaged, bytes):
        path.write_bytes(damaged)
    else:
        path.write_text(damaged)
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"cache {re.escape(str(path))}"):
        model = _process(monkeypatch, clock)
    assert "low" in clock.labels and all(p.grad is not None for p in model.parameters())
    _quiet_process(monkeypatch, "low")


#: the fingerprint or format of the file changed: another setting, measured again quietly
FINGERPRINT_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "fingerprint-missing": lambda d: d.pop("fingerprint"),
    "fingerprint-null": lambda d: d.update(fingerprint=None),
    "fingerprint-a-list": lambda d: d.update(fingerprint=list(d["fingerprint"].items())),
    "threads-a-string": lambda d: d["fingerprint"].update(threads=str(d["fingerprint"]["threads"])),
    "fingerprint-extra-field": lambda d: d["fingerprint"].update(gpu="H200"),
    "format-missing": lambda d: d.pop("format"),
    "format-99": lambda d: d.update(format=99),
}


@pytest.mark.parametrize("edit", list(FINGERPRINT_EDITS))
def test_a_file_of_another_setting_or_format_is_measured_again_and_rewritten(
    edit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _process(monkeypatch, Clock(fp32_best=True))
    path = _path()
    data = json.loads(path.read_text())
    FINGERPRINT_EDITS[edit](data)
    path.write_text(json.dumps(data))
    clock = Clock()
    _process(monkeypatch, clock)
    assert "low" in clock.labels and ampcore.auto_plan("cpu").entries[_key()].decision == "low"
    written = json.loads(path.read_text())
    assert written["fingerprint"] == ampcore.auto_plan("cpu").fingerprint and "format" in written
    _quiet_process(monkeypatch, "low")


def test_entries_of_layers_the_model_does_not_have_leave_its_own_entries_trusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Valid entries of another model (written by ampcore) are kept and not warned about;
    damaged ones of absent layers are refused by name; the model's own entry is used as it
    is (not measured again)."""
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    data = json.loads(path.read_text())
    other = key.replace("in_features=32", "in_features=999").replace("x32]", "x999]")
    assert other != key
    data["entries"][other] = data["entries"][key]  # (its seal names the key: refused)
    data["entries"]["Frobnicator() in=[8x32] grad"] = {"decision": "low", "costs": {"fp32_ms": 4.0}}
    data["entries"][""] = data["entries"][key]
    path.write_text(json.dumps(data))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=r"3 damaged or implausible entries") as caught:
        _process(monkeypatch, clock)
    (message,) = [str(w.message) for w in caught if "cache" in str(w.message)]
    assert "Frobnicator" in message and "in_features=999" in message
    entry = ampcore.auto_plan("cpu").entries[key]
    assert "low" not in clock.labels and (entry.decision, entry.source) == ("low", "cache")
    kept = json.loads(path.read_text())["entries"]
    assert key in kept and other not in kept and "" not in kept
    _quiet_process(monkeypatch, "low")


def test_a_file_ampcore_cannot_read_is_refused_with_a_warning_and_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _process(monkeypatch, Clock())
    path = _path()
    path.chmod(0)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # (root reads it anyway: refused as the OS would)
        real = Path.read_text

        def refused(self: Path, *args: Any, **kwargs: Any) -> str:
            if self == path and not self.stat().st_mode & 0o444:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", refused)
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"cache {re.escape(str(path))}.*not readable"):
        _process(monkeypatch, clock)
    assert "low" in clock.labels
    assert path.stat().st_mode & 0o444  # replaced by a file ampcore wrote
    _quiet_process(monkeypatch, "low")


def test_a_plan_of_another_dtype_copied_over_the_file_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float16 plan's file copied to the bfloat16 one's name (by hand, a sync tool)."""
    import torch

    _process(monkeypatch, Clock(fp32_best=True))
    bf16 = _path()
    fp16 = ampcore.auto_plan("cpu", torch.float16)
    fp16.entries.update(ampcore.auto_plan("cpu").entries)
    text = json.dumps({**json.loads(bf16.read_text()), "fingerprint": fp16.fingerprint})
    bf16.write_text(text)
    clock = Clock()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _process(monkeypatch, clock)
    assert not [w for w in caught if "damaged" in str(w.message)], [str(w.message) for w in caught]
    assert "low" in clock.labels and ampcore.auto_plan("cpu").entries[_key()].decision == "low"
    _quiet_process(monkeypatch, "low")


def test_load_plan_of_a_file_nested_deeper_than_the_reader_names_the_file(tmp_path: Path) -> None:
    """A plan file of arrays nested 100,000 deep: before, the reader's RecursionError came
    out of ``ampcore.load_plan`` (and out of the user's step for the cache)."""
    bad = tmp_path / "deep.json"
    bad.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ampcore.AmpcoreError, match=rf"load_plan\({re.escape(repr(str(bad)))}\): not JSON"):
        ampcore.load_plan(bad)
