"""Cheap region entry (issue 26 item 3): torch's autocast flags set directly once torch
accepted them, and constructions remembered by their arguments, with every guarantee kept."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)
from conftest import make_adapter
from torch.overrides import TorchFunctionMode

import ampcore
from ampcore._policy.executor import compiled_module
from ampcore._policy.signature import MADE
from ampcore._policy.thread_state import thread_state
from ampcore._policy.torch_state import CompiledRegion, DirectAutocast

BF16, FP32 = torch.bfloat16, torch.float32
X = torch.randn(4, 4)


def _torch_flags() -> tuple[object, ...]:
    return (
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        torch.is_autocast_cache_enabled(),
        torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.AutocastIPU),
    )


@pytest.mark.parametrize("level", ["O1", "OD", "O2"])
def test_a_second_region_sets_torchs_flags_directly_and_restores_them(level: str) -> None:
    before = _torch_flags()
    with ampcore.autocast(device="cpu", level=level):
        pass
    with ampcore.autocast(device="cpu", level=level, cache_enabled=False):
        # with a policy and the compiled kernels: the shadow key and their table in the same call
        one_call = level != "O1" and compiled_module() is not None
        assert type(thread_state().stack[-1].torch_region) is (CompiledRegion if one_call else DirectAutocast)
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == BF16
        assert not torch.is_autocast_cache_enabled()
        assert torch.mm(X, X).dtype == BF16
        with ampcore.autocast(device="cpu", level=level, enabled=False):
            assert not torch.is_autocast_enabled("cpu") and torch.mm(X, X).dtype == FP32
        assert torch.is_autocast_enabled("cpu")
    assert _torch_flags() == before


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_direct_entry_restores_torchs_flags_after_an_exception_and_inside_torch_autocast(level: str) -> None:
    with ampcore.autocast(device="cpu", level=level):
        pass
    with torch.autocast("cpu", dtype=torch.float16):
        outer = _torch_flags()
        with pytest.raises(KeyError), ampcore.autocast(device="cpu", level=level):
            assert torch.get_autocast_dtype("cpu") == BF16
            raise KeyError("inside")
        assert _torch_flags() == outer
    assert not torch.is_autocast_enabled("cpu")


def test_nested_regions_of_other_policies_restore_each_others_tables() -> None:
    x = torch.randn(4, 4)
    for _ in range(2):  # the second round enters in one call where the compiled kernels run
        with ampcore.autocast(device="cpu", level="OD"):
            with ampcore.autocast(device="cpu", level="O2"):
                assert torch.relu(x).dtype == BF16
                with ampcore.autocast(device="cpu", custom_white_list={"add"}):
                    assert (x + x).dtype == BF16 and torch.relu(x).dtype == FP32
                assert torch.relu(x).dtype == BF16
            assert torch.relu(x.bfloat16()).dtype == FP32
        assert (x + x).dtype == FP32 and not torch.is_autocast_enabled("cpu")


def test_the_weight_cast_cache_is_dropped_when_the_outermost_region_exits() -> None:
    weight = torch.randn(4, 4, requires_grad=True)
    with ampcore.autocast(device="cpu"):
        pass
    with ampcore.autocast(device="cpu"):
        first = torch.mm(X, weight)
        with ampcore.autocast(device="cpu"):  # the inner exit keeps the outer's cache
            pass
        assert first.dtype == BF16
    with torch.no_grad():
        weight.mul_(2)
    with ampcore.autocast(device="cpu"):  # the cast of the changed weight, not a stale one
        torch.testing.assert_close(torch.mm(X, weight), torch.mm(X, weight.detach().bfloat16()).to(BF16))


def test_under_a_torch_function_mode_regions_enter_through_torch_autocast() -> None:
    """torch.export's pre-dispatch tracing sees regions through torch.autocast's enter hook."""
    with ampcore.autocast(device="cpu", level="O2"):
        pass
    with TorchFunctionMode(), ampcore.autocast(device="cpu", level="O2"):
        assert type(thread_state().stack[-1].torch_region) is torch.autocast


def test_constructions_are_remembered_by_their_arguments_only() -> None:
    ampcore.autocast(device="cpu", custom_white_list=["add"])
    region = ampcore.autocast(device="cpu", custom_white_list=("add",))  # the same lists
    assert region.custom_white_list == frozenset({"add"}) and region._spec.policy is not None
    names = iter(["mul"])  # an iterator is read once, the long way
    assert ampcore.autocast(device="cpu", custom_white_list=names).custom_white_list == frozenset({"mul"})
    with pytest.raises(ampcore.AmpcoreError):  # bad values are never remembered
        ampcore.autocast(device="cpu", level="O7")
    with pytest.raises(ampcore.AmpcoreError):
        ampcore.autocast(device="cpu", level="O7")
    assert not any(key[2] == "O7" for key in MADE)


def test_a_plugin_registered_later_is_seen_by_a_remembered_construction(register) -> None:  # type: ignore[no-untyped-def]
    """Registering a plugin changes the manager's generation: devices resolve again."""
    ampcore.autocast(device="cpu")
    register(make_adapter("late", ampcore_op_list_adjustments=lambda dtype: {"black": ["mm"]}), name="late")
    with ampcore.autocast(device="late"):
        assert torch.mm(X, X).dtype == FP32
    with ampcore.autocast(device="cpu"):
        assert torch.mm(X, X).dtype == BF16


_CACHE_RACE = """
import threading, torch, ampcore
from torch.utils._python_dispatch import TorchDispatchMode
from ampcore._policy.executor import compiled_module
assert compiled_module() is not None, "the compiled executor must run here"

class Through(TorchDispatchMode):  # a Python mode: autocast's weight cast calls into Python
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

lin, x, stop = torch.nn.Linear(8, 8), torch.randn(2, 8), threading.Event()

def casts():
    with Through():
        while not stop.is_set():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lin(x)  # cached_cast holds torch's cast-cache mutex while the mode runs

thread = threading.Thread(target=casts)
thread.start()
for _ in range(20000):
    with ampcore.autocast("cpu", custom_white_list={"add"}):  # the compiled kernel's leave
        pass
stop.set()
thread.join()
print("done")
"""


def test_a_region_leaving_while_another_thread_casts_a_weight_through_python_does_not_deadlock() -> None:
    """The compiled kernel's exit cleared torch's cast cache holding the GIL while another
    thread, inside ``cached_cast`` (holding the cache's mutex), waited for the GIL to run a
    Python dispatch mode: both waited for ever (CI's faked-GPU run hung in an auto test with
    two threads).  torch.clear_autocast_cache releases the GIL; so must the kernel."""
    if compiled_module() is None:
        pytest.skip("the compiled policy kernel does not run here (no compiler, or AMPCORE_POLICY_KERNEL=python)")
    try:
        done = subprocess.run([sys.executable, "-c", _CACHE_RACE], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: a region's exit and another thread's weight cast waited for each other")
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]
