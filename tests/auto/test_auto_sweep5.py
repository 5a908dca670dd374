"""Issue 27, fifth held-out sweep of ``level="auto"``: the disk cache damaged, edited or
unwritable in every way the earlier tests (``test_auto_trust.py``, ``test_auto_root_check.py``,
``test_auto_provisional.py``) did not cover, a 0-size batch, and held-out models of other
shapes measured in their first steps.

Each corrupted cache must heal (the entry refused with a warning naming the file and the
entry, measured again and the file rewritten) or be refused with a clear warning; a later
process reads the healed file quietly and measures nothing; the decision is the one the
measurement gives, never the bad entry's.  Timings are injected (a fake clock): the tests
count measurements and check decisions, never the wall clock.  Cold and warm processes with
and without bf16 hardware, and two processes writing one cache at once, are in
``test_auto_sweep5_procs.py``.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, _train, run
from test_auto_sweep3_models import _Clock
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

import ampcore
from ampcore._auto import Costs, _hooks, _plan, _roots, _store
from ampcore._auto._cache import MAX_CACHE_BYTES, cache_file, forget_plans
from ampcore._auto._shapes import shape_class
from ampcore._cli.main import main

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

X = torch.randn(8, 32)


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))


class Clock:
    """Low precision wins 4 to 1 for every class (or loses 1 to 2 with ``fp32_best``); counts runs."""

    def __init__(self, fp32_best: bool = False) -> None:
        self.ms = {"fp32": 1.0, "low": 2.0} if fp32_best else {"fp32": 4.0, "low": 1.0}
        self.labels: list[str] = []

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(label)
        return self.ms.get(label, 0.01) * (1.0 + 0.01 * (len(self.labels) % 3))


def _process(
    monkeypatch: pytest.MonkeyPatch,
    clock: Clock,
    model: nn.Module | None = None,
    n: int = 3,
    fp32: tuple[str, ...] = (),
) -> nn.Module:
    """A new process (plans, programs and roots forgotten, nothing spent) that trains ``n``
    steps; ``fp32``: shape classes given float32 costs where the cache does not hold them."""
    forget_plans()
    _store.forget()
    _roots.forget()
    plan = ampcore.auto_plan("cpu")
    for key in fp32:
        if key not in plan.entries:
            plan.set(key, Costs(1.0, 4.0, 0.1, runs=5))
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "60")
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    for name, value in (("spent_s", 0.0), ("warned", False), ("clocks", {})):
        monkeypatch.setattr(_hooks._process, name, value)
    model = model or _net()
    for _ in range(n):
        with ampcore.autocast("cpu", level="auto"):
            out = model(X)
        out.float().sum().backward()
    return model


def _key() -> str:
    with torch.enable_grad():
        key = shape_class(_net()[0], (X,), "cpu")
    assert key is not None
    return key


def _path() -> Path:
    path = cache_file(ampcore.auto_plan("cpu").fingerprint)
    assert path is not None
    return path


def _quiet_process(monkeypatch: pytest.MonkeyPatch, decision: str) -> None:
    """A later process: reads the healed file without a warning, measures nothing."""
    silent = Clock()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)
        _process(monkeypatch, silent)
    entry = ampcore.auto_plan("cpu").entries[_key()]
    assert silent.labels == [] and (entry.decision, entry.source) == (decision, "cache")


def _edit(entry: dict[str, Any], **costs: Any) -> None:
    entry["costs"].update(costs)


#: edits of the first layer's entry (measured: low 1 ms against float32 4 ms, decision low)
ENTRY_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    # plausible figures that decide wrong: one side 8x too slow or too fast, within the bound of 4
    "low-8x-slower": lambda e: (_edit(e, low_ms=e["costs"]["low_ms"] * 8), e.update(decision="fp32")),
    "fp32-8x-faster": lambda e: (_edit(e, fp32_ms=e["costs"]["fp32_ms"] / 8), e.update(decision="fp32")),
    # the poison marked as already measured twice ("checked": trusted)
    "poison-marked-checked": lambda e: (
        _edit(e, low_ms=e["costs"]["fp32_ms"] * 8.61, checked=True),
        e.update(decision="fp32"),
    ),
    "decision-flipped": lambda e: e.update(decision="fp32"),  # the figures say low
    "runs-forged": lambda e: _edit(e, runs=10**30, fp32_spread=3.0),
    "costs-removed": lambda e: e.update(costs=None, decision="fp32"),
    "nan": lambda e: _edit(e, low_ms=float("nan")),
    "inf": lambda e: _edit(e, fp32_ms=float("inf")),
    "negative": lambda e: _edit(e, low_ms=-1.0),
    "zero": lambda e: _edit(e, fp32_ms=0),
    "string": lambda e: _edit(e, runs="5"),
    "missing-field": lambda e: e["costs"].pop("low_ms"),
    "unknown-field": lambda e: _edit(e, speedup=2.0),
    "decision-unknown": lambda e: e.update(decision="fp16"),
}


@pytest.mark.parametrize("edit", list(ENTRY_EDITS))
def test_an_edited_or_damaged_cache_entry_is_measured_again_and_replaced(
    edit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    data = json.loads(path.read_text())
    ENTRY_EDITS[edit](data["entries"][key])
    path.write_text(json.dumps(data))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"{path.name}.*{re.escape(key[:20])}"):
        _process(monkeypatch, clock)
    entry = ampcore.auto_plan("cpu").entries[key]
    assert "low" in clock.labels and (entry.decision, entry.source) == ("low", "measured")
    assert json.loads(path.read_text())["entries"][key]["decision"] == "low"  # rewritten
    _quiet_process(monkeypatch, "low")


def test_a_cache_entry_without_its_seal_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written by hand or by an older ampcore: its figures are not trusted."""
    _process(monkeypatch, Clock(fp32_best=True))
    path = _path()
    data = json.loads(path.read_text())
    data.pop("seals")
    path.write_text(json.dumps(data))
    clock = Clock(fp32_best=True)
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"{path.name}.*no seal"):
        _process(monkeypatch, clock)
    assert "low" in clock.labels
    _quiet_process(monkeypatch, "fp32")


#: damage of the whole file
FILE_EDITS: dict[str, Callable[[str], str]] = {
    "truncated": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "binary": lambda text: "\x00\xff\xfe garbage",
    "json-list": lambda text: "[1, 2, 3]",
    "entries-a-list": lambda text: json.dumps({**json.loads(text), "entries": [1]}),
    "roots-a-string": lambda text: json.dumps({**json.loads(text), "roots": "x"}),
    "seals-a-list": lambda text: json.dumps({**json.loads(text), "seals": [1]}),
}


@pytest.mark.parametrize("edit", list(FILE_EDITS))
def test_a_damaged_cache_file_is_refused_with_a_warning_and_rewritten(
    edit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _process(monkeypatch, Clock())
    path = _path()
    path.write_text(FILE_EDITS[edit](path.read_text()))
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"cache {re.escape(str(path))}"):
        _process(monkeypatch, clock)
    assert ("low" in clock.labels) == (edit != "roots-a-string")  # (entries intact: only the checks go)
    _quiet_process(monkeypatch, "low")


def test_a_cache_file_larger_than_any_plan_is_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    _process(monkeypatch, Clock())
    path = _path()
    with path.open("r+") as f:
        f.truncate(MAX_CACHE_BYTES + 1)  # sparse: no disk used
    with pytest.warns(ampcore.AmpcoreWarning, match="more than any plan"):
        _process(monkeypatch, Clock())
    _quiet_process(monkeypatch, "low")


def test_a_cache_of_thousands_of_classes_is_checked_within_each_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a cache compares each entry with its module's other classes only (neighbours
    are always of one module): 2,000 classes of 200 modules, counted comparisons."""
    plan = ampcore.auto_plan("cpu")
    for m in range(200):
        for b in range(10):
            plan.set(f"Linear(in_features={m}, out_features=8, bias=True) in=[{2**b}x{m}] grad", Costs(2.0, 1.0, 0.1))
    plan.save(_path())
    calls = [0]
    real = _plan.shape_neighbours

    def counted(a: str, b: str) -> bool:
        calls[0] += 1
        return real(a, b)

    monkeypatch.setattr(_plan, "shape_neighbours", counted)
    forget_plans()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)
        assert len(ampcore.auto_plan("cpu").entries) == 2000
    assert calls[0] <= 2000 * 10  # before: every pair, 4 million


@pytest.mark.parametrize(
    ("field", "value"), [("torch", "2.0.0"), ("threads", 97), ("host", "AVX2"), ("env", {"ONEDNN_MAX_CPU_ISA": "AVX2"})]
)
def test_entries_written_for_another_setting_are_not_used(
    field: str, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _process(monkeypatch, Clock(fp32_best=True))
    path = _path()
    data = json.loads(path.read_text())
    data["fingerprint"][field] = value
    path.write_text(json.dumps(data))
    clock = Clock()
    _process(monkeypatch, clock)
    assert "low" in clock.labels and ampcore.auto_plan("cpu").entries[_key()].decision == "low"
    assert json.loads(path.read_text())["fingerprint"] == ampcore.auto_plan("cpu").fingerprint  # rewritten
    _quiet_process(monkeypatch, "low")


def test_a_cache_edited_between_two_processes_heals_and_plan_show_gives_the_source(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _process(monkeypatch, Clock())
    path, key = _path(), _key()
    data = json.loads(path.read_text())
    ENTRY_EDITS["low-8x-slower"](data["entries"][key])
    path.write_text(json.dumps(data))
    with pytest.warns(ampcore.AmpcoreWarning, match="changed after ampcore wrote it"):
        _process(monkeypatch, Clock())
    forget_plans()
    assert main(["plan", "show", "--device", "cpu"]) == 0
    shown = capsys.readouterr().out
    row = next(line for line in shown.splitlines() if line.startswith(key))
    assert row.split()[-2:] == ["low", "cache"] and "0.25" in row  # low/fp32 as measured, with its spread
    assert main(["plan", "clear", "--device", "cpu"]) == 0 and not path.exists()


def test_a_whole_call_check_edited_to_favour_the_program_is_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict edited with figures that agree with it (the program 2 x faster) is refused by
    its seal and measured again: the program does not run on an edited word."""
    model = _net()
    with torch.enable_grad():  # the last layer float32 (given), the first measured low: a mixed program
        last = tuple(str(shape_class(model[2], (torch.randn(8, 32, dtype=d),), "cpu")) for d in (BF16, torch.float32))

    def steps(clock: Clock) -> None:
        _process(monkeypatch, clock, model, n=4, fp32=last)

    clock = Clock()
    steps(clock)
    assert "root-plan" in clock.labels
    path = _path()
    data = json.loads(path.read_text())
    ((key, check),) = data["roots"].items()
    assert check["verdict"] == "low"  # every root candidate took the same time
    check.update(plan_ms=check["low_ms"] / 2, plan_over_low=0.5, plan_over_fp32=0.5, verdict="plan")
    path.write_text(json.dumps(data))
    again = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match=rf"whole-call check {re.escape(repr(key))}: changed after"):
        steps(again)
    assert "root-plan" in again.labels and ampcore.auto_plan("cpu").roots[key].verdict == "low"


# -- a cache that cannot be written --------------------------------------------------------


@pytest.mark.parametrize("where", ["cache-dir-is-a-file", "cache-file-is-a-directory", "read-only-dir"])
def test_a_cache_that_cannot_be_written_warns_once_and_the_model_trains(
    where: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if where == "cache-dir-is-a-file":
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        monkeypatch.setenv("AMPCORE_AUTO_CACHE", str(blocker))
    elif where == "cache-file-is-a-directory":
        _path().mkdir(parents=True)
    else:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        _path().parent.mkdir(parents=True)
        _path().parent.chmod(0o500)
    clock = Clock()
    with pytest.warns(ampcore.AmpcoreWarning, match="cannot write") as caught:
        model = _process(monkeypatch, clock)
    assert len([w for w in caught if "cannot write" in str(w.message)]) == 1
    assert "low" in clock.labels and ampcore.auto_plan("cpu").entries[_key()].decision == "low"
    assert all(p.grad is not None for p in model.parameters())
    assert not list(tmp_path.rglob("*.tmp"))  # no temporary file left behind
    assert main(["plan", "show", "--device", "cpu"]) == 0
    code = main(["plan", "clear", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == (1 if where == "cache-file-is-a-directory" else 0), out


def test_threads_writing_the_cache_at_once_leave_a_valid_file() -> None:
    plan = ampcore.auto_plan("cpu")
    plan.set(_key(), Costs(4.0, 1.0, 0.1, runs=5))
    path = _path()

    def write(_: int) -> None:  # an error (a shared temporary file renamed away) propagates
        for _ in range(20):
            plan.save(path)
            json.loads(path.read_text())

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(write, range(6)))
    assert not list(path.parent.glob("*.tmp"))
    forget_plans()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)
        assert ampcore.auto_plan("cpu").entries[_key()].decision == "low"


# -- a 0-size batch ------------------------------------------------------------------------


def test_a_zero_size_batch_is_not_measured_for_the_batch_one_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty batch is its own class: timing it (no work but the casts) must not decide for
    batch 1, whose calls do the work."""
    model = _net()
    _process(monkeypatch, Clock(fp32_best=True), model)  # warm: batch 8 measured
    with torch.enable_grad():
        one, empty = (shape_class(model[0], (torch.randn(n, 32),), "cpu") for n in (1, 0))
    assert one != empty
    with ampcore.autocast("cpu", level="auto"):
        model(torch.randn(0, 32))
    assert one not in ampcore.auto_plan("cpu").entries


# -- held-out models of other shapes, measured in their first steps ------------------------


class Decoder(nn.Module):
    """A 2-layer ``nn.TransformerDecoder`` (d 24, 3 heads) over a memory, with a float32 head."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerDecoderLayer(24, 3, dim_feedforward=48, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(24, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.head(self.decoder(x[:, :5], x[:, 5:])))


class Many(nn.Module):
    """A big Linear and many small residual ones (the issue's kind at other shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(16, 64)
        self.small = nn.ModuleList(nn.Linear(8, 8) for _ in range(12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.big(x)[..., :8]
        for layer in self.small:
            y = y + torch.tanh(layer(y))
        return y


def _convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, groups=2), nn.Flatten(), nn.Linear(8 * 2 * 2, 16), nn.Linear(16, 4),
    )  # fmt: skip


def _encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(40, 5, dim_feedforward=16, dropout=0.0, batch_first=True, norm_first=True)
    return nn.Sequential(nn.Linear(16, 40), nn.TransformerEncoder(layer, 3, enable_nested_tensor=False))


HELDOUT: dict[str, tuple[Callable[[], nn.Module], Callable[[int], torch.Tensor]]] = {
    "decoder": (Decoder, lambda i: torch.randn(2, 12, 24)),
    "many-small": (Many, lambda i: torch.randn(4, 16)),
    "convnet": (_convnet, lambda i: torch.randn(2, 3, 8, 8)),
    "encoder-pre-norm": (_encoder, lambda i: torch.randn(2, 6, 16)),
    "many-small-zero-batch": (Many, lambda i: torch.randn((0, 4, 1)[i % 3], 16)),
}


@pytest.mark.parametrize("case", list(HELDOUT))
def test_heldout_models_measured_match_the_fixed_precision(case: str, measuring: _Clock, recordings: list[Any]) -> None:
    make, data = HELDOUT[case]
    inputs = [data(i) for i in range(3)]
    run(make, lambda m, i, enter: _train(m, inputs[i % 3], enter), 6, recordings, measured=True)
    assert "low" in measuring.labels, measuring.labels


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
