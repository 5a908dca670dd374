"""``ampcore oplists``: text, JSON and Markdown output, arguments, errors."""

from __future__ import annotations

import json

import pytest

from ampcore._cli.main import main

# (arguments, text that must appear in the output)
OUTPUTS = [
    (
        ["oplists", "--device", "cpu"],
        [
            "backend cpu",
            "AutocastCPU",
            "white (run in the low-precision dtype): 2",
            "cat index_copy stack",
            "every other op: follow-inputs",
        ],
    ),
    (
        ["oplists", "--device", "cpu", "--custom-white", "elementwise_add,relu", "--custom-black", "mm"],
        ["custom white: ['add', 'relu']  custom black: ['mm']"],
    ),
    (["oplists", "--device", "cpu", "--level", "od"], ["level OD", "every other op: float32"]),
    (
        ["oplists", "--device", "cuda", "--dtype", "fp16"],
        ["float16", "of which float32 through an output dtype", "banned"],
    ),
    (["oplists", "--device", "cpu", "--markdown"], ["| list | ops |", "| white (", "`mm`"]),
    (["oplists", "--device", "cpu", "--custom-white", "add", "--overloads"], ["add.Tensor", "low"]),
]


@pytest.mark.parametrize(("argv", "expected"), OUTPUTS)
def test_output(argv: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    out = capsys.readouterr().out
    for text in expected:
        assert text in out


def test_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["oplists", "--device", "cpu", "--level", "O2", "--custom-black", "gelu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["level"] == "O2" and data["unlisted"] == "low-precision"
    assert "gelu" in data["black"] and "cat" in data["white"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["oplists", "--device", "cpu", "--custom-black", "linaer"], "did you mean 'linear'"),
        (["oplists", "--device", "cpu", "--dtype", "int8"], "unknown dtype name; valid: bfloat16"),
        (["oplists", "--device", "cpu", "--custom-white", "add", "--custom-black", "add"], "in both lists"),
        (["oplists", "--device", "tpu9"], "unknown backend 'tpu9'"),
    ],
)
def test_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    assert message in capsys.readouterr().err
