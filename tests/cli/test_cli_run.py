"""``ampcore run`` and ``AMPCORE_AUTOCAST`` (issue 30): PAI's zero-code switch."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ampcore
from ampcore._cli.main import main
from ampcore._cli.run import ENV_VAR, parse_env

SCRIPT = textwrap.dedent(
    """
    import sys, torch
    x = torch.randn(4, 4)
    RESULT = {"argv": sys.argv[1:], "mm": torch.mm(x, x).dtype, "add": (x + x).dtype, "name": __name__}
    sys.modules["tests_run_result"] = RESULT
    if "--exit" in sys.argv:
        sys.exit(int(sys.argv[-1]))
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _result() -> dict[str, object]:
    return sys.modules.pop("tests_run_result")  # type: ignore[return-value]


def test_run_puts_an_unchanged_script_under_autocast(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    argv_before = sys.argv[:]
    assert main(["run", "--device", "cpu", "--level", "O1", str(script), "--epochs", "3"]) == 0
    result = _result()
    assert result == {"argv": ["--epochs", "3"], "mm": torch.bfloat16, "add": torch.float32, "name": "__main__"}
    assert sys.argv == argv_before and not torch.is_autocast_enabled("cpu")


def test_the_environment_variable_gives_the_settings(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "cpu:bf16:OD")
    assert main(["run", str(script)]) == 0
    assert _result()["add"] == torch.float32
    monkeypatch.setenv(ENV_VAR, "cpu:bf16:O2")
    with pytest.warns(ampcore.AmpcoreWarning, match="parameters stay float32.*ampcore.decorate"):
        assert main(["run", str(script)]) == 0
    assert _result()["add"] == torch.bfloat16


def test_options_win_over_the_environment_and_custom_lists_work(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "cpu:bf16:OD")
    assert main(["run", "--level", "O1", "--white-list", "elementwise_add", str(script)]) == 0
    assert _result()["add"] == torch.bfloat16


def test_the_scripts_exit_code_is_the_commands(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "cpu")
    assert main(["run", str(script), "--exit", "3"]) == 3
    _result()


def test_float16_warns_that_loss_scaling_needs_code(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.warns(ampcore.AmpcoreWarning, match="loss is not scaled.*GradScaler"):
        assert main(["run", "--device", "cpu", "--dtype", "fp16", str(script)]) == 0
    assert _result()["mm"] == torch.float16


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ("cpu:bf16:O9", r"invalid level.*from AMPCORE_AUTOCAST='cpu:bf16:O9'"),
        ("cpu:int8", r"dtype"),
        ("a:b:c:d", r"expected AMPCORE_AUTOCAST=DEVICE\[:DTYPE\[:LEVEL\]\]"),
        ("  ", r"expected AMPCORE_AUTOCAST=DEVICE"),
        ("nosuchdevice", r"nosuchdevice"),
    ],
)
def test_a_bad_environment_variable_fails_before_the_script_runs(
    env: str, match: str, script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_VAR, env)
    assert main(["run", str(script)]) == 1
    assert "tests_run_result" not in sys.modules
    err = capsys.readouterr().err
    assert "ampcore run: error:" in err
    import re

    assert re.search(match, err), err


def test_missing_script_or_target(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert main(["run", "--device", "cpu", "no_such_script.py"]) == 1
    assert "no such script 'no_such_script.py'" in capsys.readouterr().err
    assert main(["run", "--device", "cpu"]) == 1
    assert "name a script" in capsys.readouterr().err


def test_parse_env_fields() -> None:
    assert parse_env("cuda") == {"device": "cuda"}
    assert parse_env(":fp16") == {"dtype": "fp16"}
    assert parse_env("cpu:bf16:O1") == {"device": "cpu", "dtype": "bf16", "level": "O1"}


def test_run_a_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    (tmp_path / "zero_code_train_mod.py").write_text(SCRIPT)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "--device", "cpu", "-m", "zero_code_train_mod", "--lr", "1"]) == 0
    result = _result()
    assert (result["argv"], result["mm"], result["name"]) == (["--lr", "1"], torch.bfloat16, "__main__")
