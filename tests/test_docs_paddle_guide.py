"""The docs say what runs (issue 30): statements checked against the code they describe."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import ampcore
from ampcore._cli.experiment import EXTRA_MODES, MODES

DOCS = Path(__file__).resolve().parents[1] / "docs"
README = Path(__file__).resolve().parents[1] / "README.md"


def test_levels_md_cpu_o2_black_list_sentence_matches_the_lists() -> None:
    text = " ".join((DOCS / "levels.md").read_text().split())
    sentence = re.search(r"on the \*\*CPU\*\* it holds (.*?) so those run in low precision there", text)
    assert sentence is not None
    held, _, not_held = sentence.group(1).partition("**not**")
    black = ampcore.oplists("cpu", level="O2").black
    named_held = re.findall(r"`(\w+)`", held)
    named_not = re.findall(r"`(\w+)`", not_held)
    assert named_held and named_not
    assert [op for op in named_held if op not in black] == []
    assert [op for op in named_not if op in black] == []


def test_readme_sync_sentence_agrees_with_the_scaler_table() -> None:
    readme = " ".join(README.read_text().split())
    assert "no host syncs outside `step()`" not in readme
    table = (DOCS / "scaler.md").read_text()
    for call in ("get_scale()", "state_dict()", "raise_at_min_scale=True"):
        assert call in table and call in readme


def test_o2_md_gives_decorates_signature_and_defaults() -> None:
    text = (DOCS / "o2.md").read_text()
    signature = inspect.signature(ampcore.decorate)
    assert signature.parameters["level"].default == "O2"
    documented = re.search(r"ampcore\.decorate\((models.*?)\)\n", text, re.S)
    assert documented is not None
    given = " ".join(documented.group(1).split())
    for name, param in signature.parameters.items():
        default = "" if param.default is inspect.Parameter.empty else f"={param.default!r}".replace("'", '"')
        assert f"{name}{default}" in given, name


def test_benchmark_md_lists_every_mode() -> None:
    text = (DOCS / "benchmark.md").read_text()
    for mode in MODES + EXTRA_MODES:
        assert f"| `{mode}` |" in text, mode
