"""Issue 28, row 10: one parser for device strings behind every entry point.  ``"cpu:²"``
passed ``str.isdigit()`` and reached ``int()`` (a ValueError); every malformed index is an
AmpcoreError saying the index must be a non-negative integer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import ampcore
from ampcore.integrations import AmpcoreSettings

BAD = ["cpu:\u00b2", "cpu:\u0663", "cpu:\uff10", "cpu:-1", "cpu: 0", "cpu:1.0", "cpu:", "cpu:0x1", "cpu:+1"]

ENTRY_POINTS: dict[str, Callable[[str], object]] = {
    "autocast": lambda d: ampcore.autocast(device=d),
    "GradScaler": lambda d: ampcore.GradScaler(d),
    "GradScaler(enabled=False)": lambda d: ampcore.GradScaler(d, enabled=False),
    "oplists": lambda d: ampcore.oplists(d),
    "auto_plan": lambda d: ampcore.auto_plan(d),
    "get_backend": lambda d: ampcore.get_backend(d),
    "decorate": lambda d: ampcore.decorate(torch.nn.Linear(2, 2), level="O2", device=d),
    "AmpcoreSettings": lambda d: AmpcoreSettings(device=d),
    "auto_plan_table": lambda d: ampcore.debugging.auto_plan_table(d),
}


@pytest.mark.parametrize("device", BAD)
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_a_malformed_device_index_is_an_ampcore_error(entry: str, device: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match="the index must be a non-negative integer"):
        ENTRY_POINTS[entry](device)


@pytest.mark.parametrize("entry", ["autocast", "GradScaler", "oplists", "get_backend"])
def test_an_ascii_index_still_works(entry: str) -> None:
    ENTRY_POINTS[entry]("cpu:0")


def test_the_cli_gives_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from ampcore._cli.main import main

    assert main(["oplists", "--device", "cpu:\u00b2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "ampcore oplists: error: device='cpu:\u00b2': the index must be a non-negative integer in ASCII "
        "digits after ':' (e.g. 'cuda:0')"
    )
