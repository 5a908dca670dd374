"""docs/debugging.md's worked example (examples/debug_overflow.py) finds what it says."""

from __future__ import annotations

import importlib.util
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("debug_overflow", ROOT / "examples" / "debug_overflow.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_worked_example_finds_the_exp_in_the_pool(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["debug_overflow.py", "--device", "cpu"])
    with warnings.catch_warnings():
        _example().main()
    out = capsys.readouterr().out
    assert "float32 finite: True\nfloat16 finite: False" in out
    assert "aten::exp.default produced non-finite values in module Classifier.pool (NaivePool)" in out
    assert re.search(r"\n +1  Classifier\.pool +inf +inf +float32 +float16 +1  <- first over threshold\n", out)
    assert "\nfp16_range exp Classifier.pool float32[8, 16, 1]" in out
    assert "check_numerics: no finding" in out


def test_the_statistics_table_in_the_docs_is_the_real_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["debug_overflow.py"])
    with warnings.catch_warnings():
        _example().main()
    out = capsys.readouterr().out
    docs = (ROOT / "docs" / "debugging.md").read_text()
    table = re.search(r"```\n(op +\| +FP32 calls.*?total .*?)\n```", docs, re.S)
    assert table is not None
    assert table.group(1) in out
