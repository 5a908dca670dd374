"""Issue 27: a settled ``level="auto"`` region costs an O1 region plus a lookup.

Counted in Python function calls (``sys.setprofile``), not in time: what auto runs on top of
an O1 region at the same place in the code, for an empty region and for a region calling a
root whose program is settled (float32 default, nothing switched: a model of small layers
that all decided float32, which must then run as float32 does).
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from torch import nn

import ampcore
from ampcore._auto import _hooks, _program, _roots, _store
from ampcore._auto._shapes import shape_class

#: Python calls an empty settled auto region may add to an O1 region: its two level hooks
#: (torch.compiler.is_compiling's flag is read, not called: 2 calls fewer)
EMPTY_EXTRA = 2
#: and a root call that runs its program: torch's hook path (its ``inner`` and
#: is_compiling, 3), the sentinel as the root's pre-hook with is_dynamo_compiling (2), the
#: signature and the tree's check (2), the post-hook (1); the program's lookup and its
#: start and stop are inline (a settled root's last program and Running are kept)
ROOT_EXTRA = 8


pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _python_calls(run: Callable[[], Any]) -> int:
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += event == "call"

    gc.collect()  # earlier tests' garbage: its weakref callbacks are not the region's calls
    gc.disable()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        gc.enable()
    return count


def _small_net() -> tuple[nn.Module, torch.Tensor]:
    net, x = nn.Sequential(*(nn.Linear(8, 8) for _ in range(6))), torch.randn(4, 8)
    with torch.enable_grad():
        key = shape_class(net[0], (x,), "cpu") or ""
    ampcore.load_plan(
        {"format": 2, "fingerprint": ampcore.auto_plan("cpu").fingerprint, "entries": {key: {"decision": "fp32"}}}
    )
    return net, x


def test_an_empty_settled_auto_region_costs_an_o1_region_plus_its_two_hooks() -> None:
    auto, o1 = ampcore.autocast("cpu", level="auto"), ampcore.autocast("cpu", level="O1")
    net, x = _small_net()

    def region(which: ampcore.autocast, call: bool) -> None:
        with which:
            if call:
                net(x)

    for _ in range(3):
        region(auto, True)  # the site's root is known: its hooks go in and out with each region
        region(o1, False)
    extra = _python_calls(lambda: region(auto, False)) - _python_calls(lambda: region(o1, False))
    assert extra <= EMPTY_EXTRA, extra


def test_a_root_running_an_all_float32_program_costs_its_two_hooks_and_runs_as_float32() -> None:
    auto, o1 = ampcore.autocast("cpu", level="auto"), ampcore.autocast("cpu", level="O1")
    net, x = _small_net()

    def step(which: ampcore.autocast) -> torch.Tensor:
        with which:
            out: torch.Tensor = net(x)
        return out

    for _ in range(3):
        step(auto)
    (program,) = _store._programs[net].values()
    assert isinstance(program, _program.Program) and program.default_fp32 and program.switched == ()
    extra = _python_calls(lambda: step(auto)) - _python_calls(lambda: step(o1))
    assert extra <= EMPTY_EXTRA + ROOT_EXTRA, extra
    assert torch.equal(step(auto), net(x)) and not _hooks.installed() and not net._forward_pre_hooks


def test_threads_running_one_root_in_their_own_regions_leave_no_hook() -> None:
    net, x = _small_net()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(30):
                with ampcore.autocast("cpu", level="auto"):
                    out = net(x)
                    # (a float32 root leaves autocast off for the region's ops after it: docs/auto.md)
                    assert out.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
                assert not torch.is_autocast_enabled("cpu")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert not _hooks.installed() and not net._forward_pre_hooks and not net._forward_hooks
    assert not torch.nn.modules.module._global_forward_pre_hooks


def test_without_torchs_hook_dicts_the_public_registration_does_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_roots, "_GLOBAL_PRE", None)  # a torch whose global pre-hooks are not a dict
    net, x = _small_net()
    calls: list[str] = []
    pre = _hooks._pre
    monkeypatch.setattr(_hooks, "_pre", lambda *a: calls.append(type(a[0]).__name__) or pre(*a))

    def step() -> torch.Tensor:
        with ampcore.autocast("cpu", level="auto"):  # one place in the code: the root is known there
            out: torch.Tensor = net(x)
        return out

    for _ in range(2):
        step()
    calls.clear()
    expected = net(x)
    for _ in range(3):
        assert torch.equal(step(), expected)
    assert calls == []  # the program ran: no global hook
    assert not _hooks.installed() and not net._forward_pre_hooks and not net._forward_hooks
    assert not torch.nn.modules.module._global_forward_pre_hooks


#: Python calls an auto region made per step may add to ``torch.autocast`` made per step:
#: its level's budget check when made, its two level hooks
MADE_EXTRA = 3


@pytest.mark.parametrize("level", ["O1", "auto"])
def test_a_region_made_entered_and_exited_per_step_costs_torch_autocasts_python_calls(level: str) -> None:
    """User code's ``with ampcore.autocast(...)`` in the loop (issue 27, host-bound steps):
    made (the memo of its arguments), entered and exited, an O1 region calls no more Python
    functions than ``torch.autocast`` made per step does (torch's flags are set inline, no
    object with Python methods of ours per region); an auto region adds its check and its
    two level hooks."""
    net, x = _small_net()

    def ours() -> None:
        with ampcore.autocast("cpu", level=level):
            pass

    def torchs() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pass

    for _ in range(3):
        with ampcore.autocast("cpu", level=level):  # (auto: the site's root is known)
            net(x)
        ours()
        torchs()
    extra = _python_calls(ours) - _python_calls(torchs)
    assert extra <= (0 if level == "O1" else MADE_EXTRA), extra
    with ampcore.autocast("cpu", level=level):  # torch's state as torch.autocast leaves it
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not _hooks.installed()
