"""What a newcomer sees first: ``ampcore info`` fits 100 columns, and no torch NumPy warning
precedes a command in an install without NumPy (other warnings still show)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import make_adapter

import ampcore
from ampcore._cli.launch import launched_as_cli, quiet_torch_numpy_warning
from ampcore._cli.main import main

_BIN = Path(sys.executable).parent


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_info_fits_100_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= 100, out
    assert "cpu" in out and "Backends" in out


def test_long_reasons_and_device_names_move_below_or_shorten(
    register: Callable[..., ampcore.Backend], capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "the vendor runtime libvendor.so.3 was not found on LD_LIBRARY_PATH; " * 3
    register(make_adapter("longreason", ampcore_unavailable_reason=lambda: reason))
    register(make_adapter("longname", ampcore_device_name=lambda device_index: "Vendor Accelerator " + "X" * 120))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert _widest(out) <= 100, out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["longreason"])
    assert "no [" in row and "libvendor" not in row
    assert "libvendor.so.3" in out.split("Notes:")[1]  # the reason, below the table
    assert "Vendor Accelerator XXX" in out and "..." in out
    assert main(["info", "--wide"]) == 0
    assert "Vendor Accelerator " + "X" * 120 in capsys.readouterr().out


def test_launched_as_cli_knows_the_two_entry_points() -> None:
    assert launched_as_cli(["/venv/bin/ampcore", "info"], ["/venv/bin/python", "/venv/bin/ampcore", "info"])
    assert launched_as_cli(["-m", "info"], ["python3", "-X", "dev", "-m", "ampcore", "info"])
    assert launched_as_cli(["C:\\venv\\Scripts\\ampcore.exe"], ["python.exe", "C:\\venv\\Scripts\\ampcore.exe"])
    assert not launched_as_cli(["train.py"], ["python", "train.py"])
    assert not launched_as_cli(["-m"], ["python", "-m", "pytest"])
    assert not launched_as_cli(["-c"], ["python", "-c", "import ampcore"])


def test_the_filter_hides_only_torchs_numpy_message() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_torch_numpy_warning(force=True)
        for message, module in (
            ("Failed to initialize NumPy: No module named 'numpy'", "torch._subclasses.functional_tensor"),
            ("Failed to initialize NumPy: mine", "mylib"),
            ("something else", "torch.nn"),
        ):
            warnings.warn_explicit(message, UserWarning, "x.py", 1, module=module)
    assert [str(w.message) for w in caught] == ["Failed to initialize NumPy: mine", "something else"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["script", "module"])
def test_no_numpy_warning_before_a_command(tmp_path: Path, launcher: str) -> None:
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named numpy (blocked by the test)", name="numpy")\n'
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    script = _BIN / "ampcore"
    if launcher == "script" and not script.exists():
        pytest.skip(f"no ampcore console script beside {sys.executable}")
    command = [str(script)] if launcher == "script" else [sys.executable, "-m", "ampcore"]
    run = subprocess.run([*command, "info"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "Failed to initialize NumPy" not in run.stderr, run.stderr
    # a library import is left alone: the warning is torch's to give there
    library = subprocess.run(
        [sys.executable, "-c", "import ampcore"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert "Failed to initialize NumPy" in library.stderr
