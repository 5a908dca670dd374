"""Region entry and exit near torch.autocast's cost (issue 26 item 3), every guarantee kept.

A region that entered before enters again from a plan kept for its arguments (what does not
depend on the enclosing state: its policy's route, kernels and table, torch's acceptance of
its flags), so entry and exit run a handful of Python calls.  Counted here, never timed: the
counts are what the speed follows (docs/performance.md, issue 26 item 3).  The guarantees
are tested with the plan in use: asyncio and thread checks, torch.compile's and
torch.export's paths, regions inside a checkpoint's recomputation, nested custom lists,
state restored when a step fails.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

import ampcore
from ampcore._auto import _hooks
from ampcore._policy import autocast as autocast_module
from ampcore._policy import entry, level_hooks
from ampcore._policy.compile import guard_mode
from ampcore._policy.executor import compiled_module
from ampcore._policy.thread_state import thread_state

BF16, FP32 = torch.bfloat16, torch.float32
X = torch.randn(4, 4)
REGIONS: dict[str, dict[str, Any]] = {
    "O1": {},
    "custom": {"custom_white_list": {"add"}},
    "OD": {"level": "OD"},
    "O2": {"level": "O2"},
    "disabled": {"enabled": False},
}


def _python_calls(run: Callable[[], object]) -> list[str]:
    """The Python functions ``run`` calls (itself excluded), in order."""
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: object) -> None:
        if event == "call":
            calls.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_qualname}")

    gc.collect()  # earlier tests' garbage: its weakref callbacks are not the region's calls
    gc.disable()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls[1:]


def _enter_exit(**kwargs: Any) -> Callable[[], None]:
    def run() -> None:
        with ampcore.autocast(device="cpu", **kwargs):
            pass

    return run


def _warm(run: Callable[[], object]) -> None:
    for _ in range(3):  # torch accepts the flags, the kernels are registered, the plan kept
        run()


@pytest.fixture
def no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process that never ran torch.compile (an earlier test may have): regions with
    a policy push no guard mode (compile.py), whose calls are counted apart."""
    for module in (autocast_module, entry):
        monkeypatch.setattr(module, "compile_in_use", lambda: False)


def _python_kernels_extra(kwargs: dict[str, Any]) -> int:
    """Python calls a region with a policy adds under the Python executor: its shadow key
    switched on (2) and off, its policy set and restored (2 + restore), the guard check."""
    region = ampcore.autocast(device="cpu", **kwargs)
    return 6 if region._spec.policy is not None and compiled_module() is None else 0


def _clean() -> None:
    assert thread_state().stack == [] and thread_state().policies == {}
    assert not torch.is_autocast_enabled("cpu") and torch.mm(X, X).dtype == FP32


@pytest.mark.usefixtures("no_compile")
@pytest.mark.parametrize("name", sorted(REGIONS))
def test_a_region_made_again_enters_and_exits_in_a_few_python_calls(name: str) -> None:
    run = _enter_exit(**REGIONS[name])
    _warm(run)
    calls = _python_calls(run)
    # construction (torch.compiler.is_compiling, the plugin generation, the memo's key)
    # + __enter__ + __exit__ (+ the torch flags' saver for a region without a policy):
    # 20-25 calls before issue 26 item 3
    assert len(calls) <= 11 + _python_kernels_extra(REGIONS[name]), calls
    _clean()


@pytest.mark.usefixtures("no_compile")
@pytest.mark.parametrize("name", sorted(REGIONS))
def test_a_reused_region_object_enters_and_exits_in_a_few_python_calls(name: str) -> None:
    region = ampcore.autocast(device="cpu", **REGIONS[name])

    def run() -> None:
        with region:
            pass

    _warm(run)
    calls = _python_calls(run)
    assert len(calls) <= 4 + _python_kernels_extra(REGIONS[name]), calls
    _clean()


@pytest.mark.usefixtures("no_compile")
@pytest.mark.parametrize("outer", ["O1", "custom", "O2"])
@pytest.mark.parametrize("inner", ["O1", "custom", "OD"])
def test_nested_regions_enter_from_their_plan_and_keep_their_lists(outer: str, inner: str) -> None:
    outer_region = ampcore.autocast(device="cpu", custom_black_list={"softmax"}, **REGIONS[outer])
    inner_region = ampcore.autocast(device="cpu", **REGIONS[inner])
    x = torch.randn(4, 4)

    def run() -> list[torch.dtype]:
        with outer_region:
            with inner_region:
                got = [(x + x).dtype, torch.softmax(x, -1).dtype, torch.mm(x, x).dtype]
            return [*got, (x + x).dtype, torch.softmax(x, -1).dtype]

    first = run()
    _warm(run)
    assert run() == first
    with outer_region:  # the inner region's custom lists merged on top of the outer's: once
        calls = _python_calls(lambda: inner_region.__exit__(None, None, inner_region.__enter__()))
        assert len(calls) <= 4 + _python_kernels_extra({**REGIONS[inner], "custom_black_list": {"softmax"}}), calls
    assert first[1] == FP32  # the outer's black list reaches inside the inner region
    if inner == "custom":
        assert first[0] == BF16
    _clean()


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["O1", "O2", "custom"])
def test_under_a_torch_function_mode_a_planned_region_enters_through_torch_autocast(name: str) -> None:
    region = ampcore.autocast(device="cpu", **REGIONS[name])
    _warm(lambda: region.__exit__(None, None, region.__enter__()))
    with _PassThrough(), region:
        assert type(thread_state().stack[-1].torch_region) is torch.autocast
        assert torch.mm(X, X).dtype == BF16
    _clean()


@pytest.mark.parametrize("name", ["O1", "O2"])
def test_under_ampcores_own_guard_mode_a_planned_region_still_enters_directly(name: str) -> None:
    """torch.compile in use: regions with a policy push a guard mode, a TorchFunctionMode of
    ampcore's own; regions nested in them do not need torch.autocast's entry for it."""
    region = ampcore.autocast(device="cpu", **REGIONS[name])
    _warm(lambda: region.__exit__(None, None, region.__enter__()))
    outer = ampcore.autocast(device="cpu", custom_white_list={"add"})
    with guard_mode(outer._spec.policy), region:
        assert type(thread_state().stack[-1].torch_region) is not torch.autocast
        assert torch.mm(X, X).dtype == BF16
    with guard_mode(outer._spec.policy), _PassThrough(), region:
        assert type(thread_state().stack[-1].torch_region) is torch.autocast
    _clean()


@pytest.mark.parametrize("name", ["O1", "custom"])
def test_a_planned_region_inside_a_checkpoint_recomputation_restores_the_outer_policy(name: str) -> None:
    """The recomputation puts the forward's policy back with no region on the stack; a
    region entered inside it (here O1 or custom lists inside O2) restores that policy."""
    inner = ampcore.autocast(device="cpu", **REGIONS[name])
    _warm(lambda: inner.__exit__(None, None, inner.__enter__()))
    seen: list[tuple[torch.dtype, torch.dtype]] = []

    def block(t: torch.Tensor) -> torch.Tensor:
        with inner:
            a = torch.mm(t, t)
        b = torch.relu(t)  # O2: low precision, after the inner region exited
        seen.append((a.dtype, b.dtype))
        return (a.float() * b.float()).sum()

    x = torch.randn(4, 4, requires_grad=True)
    with ampcore.autocast(device="cpu", level="O2"):
        y = checkpoint(block, x, use_reentrant=False)
    y.backward()
    assert seen == [(BF16, BF16), (BF16, BF16)]  # the forward, then the recomputation
    _clean()


class _FailingExit:
    """Level hooks whose region_exited raises (a stand-in for a failing plan hook)."""

    def check(self) -> None:
        pass

    def region_entered(self) -> None:
        pass

    def region_exited(self) -> None:
        raise KeyError("hook")


@pytest.fixture
def failing_auto_hooks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in while the test runs; a region made meanwhile holds it in the memo of
    validated constructions, so the memo is emptied after (a later test's region of the
    same form would raise from it)."""
    from ampcore._policy.signature import MADE

    monkeypatch.setitem(level_hooks._hooks, "auto", _FailingExit())
    MADE.clear()
    yield
    MADE.clear()


@pytest.mark.usefixtures("failing_auto_hooks")
def test_a_failing_exit_hook_still_restores_the_thread_state() -> None:
    region = ampcore.autocast(device="cpu", level="auto")
    region.__enter__()
    assert torch.is_autocast_enabled("cpu")
    with pytest.raises(KeyError, match="hook"):
        region.__exit__(None, None, None)
    _clean()


def test_a_region_made_with_another_dtype_has_its_own_plan() -> None:
    for _ in range(3):
        with ampcore.autocast(device="cpu", dtype=torch.float16, level="O2"):
            assert torch.relu(X).dtype == torch.float16
        with ampcore.autocast(device="cpu", dtype=BF16, level="O2"):
            assert torch.relu(X).dtype == BF16
            with ampcore.autocast(device="cpu", dtype=torch.float16, cache_enabled=False):
                assert torch.mm(X, X).dtype == torch.float16 and not torch.is_autocast_cache_enabled()
            assert torch.is_autocast_cache_enabled() and torch.relu(X).dtype == BF16
    _clean()


PLANNED_BEFORE_THE_EXECUTOR = """
import torch, ampcore
from ampcore._policy.executor import compiled_module
from ampcore._policy.thread_state import thread_state
from ampcore._policy.torch_state import CompiledRegion, DirectAutocast
x = torch.randn(4, 4)
o1 = ampcore.autocast(device="cpu")
for i in range(3):  # an O1-only process so far: torch's flags set from Python, nothing built
    with o1:
        assert i == 0 or type(thread_state().stack[-1].torch_region) is DirectAutocast
with ampcore.autocast(device="cpu", level="O2"):  # the executor is chosen here
    pass
kinds = []
for _ in range(3):
    with ampcore.autocast(device="cpu", level="O2"):
        with o1:  # inside O2: no policy in force, torch's own lists
            kinds.append(type(thread_state().stack[-1].torch_region).__name__)
            assert torch.relu(x.bfloat16()).dtype == torch.bfloat16 and torch.mm(x, x).dtype == torch.bfloat16
            assert (x + x).dtype == torch.float32
        assert torch.relu(x).dtype == torch.bfloat16
    with o1:
        kinds.append(type(thread_state().stack[-1].torch_region).__name__)
expected = "CompiledRegion" if compiled_module() is not None else "DirectAutocast"
assert kinds[-2:] == [expected, expected], kinds
assert thread_state().policies == {} and not torch.is_autocast_enabled("cpu")
print("ok", kinds)
"""


def test_regions_planned_before_the_executor_was_chosen_plan_again_once_it_is() -> None:
    from test_kernel_registration import run_child

    done = run_child(PLANNED_BEFORE_THE_EXECUTOR)
    assert "ok" in done.stdout


#: regions made the ways users write them in a training loop (issue 27: a region made per
#: step paid the long validation in every form but the keyword-only one, 33-50 Python calls)
MADE_FORMS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "keywords": ((), {"device": "cpu"}),
    "positional device": (("cpu",), {}),
    "positional device and dtype": (("cpu", BF16), {}),
    "torch's keyword name": ((), {"device_type": "cpu"}),
    "level auto": ((), {"device": "cpu", "level": "auto"}),
    "positional device, level auto": (("cpu",), {"level": "auto"}),
}


@pytest.mark.parametrize("form", sorted(MADE_FORMS))
def test_a_region_made_again_in_any_usual_form_is_made_from_the_memo(form: str) -> None:
    args, kwargs = MADE_FORMS[form]
    made = [ampcore.autocast(*args, **kwargs) for _ in range(3)]
    calls = _python_calls(lambda: ampcore.autocast(*args, **kwargs))
    hooks = level_hooks.level_hooks(made[-1].level)  # level auto checks its budget again: its calls
    checks = 0 if hooks is None else 1 + len(_python_calls(hooks.check))
    # __new__ (the compiling check), __init__, the plugin generation, the memo's keys: 7-8
    # calls; the long way is 33-50
    assert len(calls) <= 8 + checks, calls
    again = ampcore.autocast(*args, **kwargs)
    assert (again.device_type, again.dtype, again.level, again.enabled) == (
        made[0].device_type,
        made[0].dtype,
        made[0].level,
        made[0].enabled,
    )
    assert again._spec is made[-1]._spec  # the first may have loaded the plugins: not remembered


def test_a_memoized_auto_region_still_checks_a_budget_changed_since(monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(2):
        ampcore.autocast("cpu", level="auto")
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "abc")
    with pytest.raises(ampcore.AmpcoreError, match="AMPCORE_AUTO_BUDGET"):
        ampcore.autocast("cpu", level="auto")
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    assert ampcore.autocast("cpu", level="auto").level == "auto"


def test_an_auto_region_made_again_reads_an_unset_budget_without_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its budget check runs whenever one is made: an unset ``AMPCORE_AUTO_BUDGET`` (the usual
    case) costs no ``os.environ.get`` (Mapping.get raises and catches KeyError: 0.6 us)."""
    monkeypatch.delenv("AMPCORE_AUTO_BUDGET", raising=False)
    hooks = level_hooks.level_hooks("auto")
    assert hooks is not None
    assert hooks.check is _hooks.check  # the level's check itself: no call in between (tenth stop)
    assert _python_calls(hooks.check) == []
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "2.5")
    assert "_validate.py:env_number" in _python_calls(hooks.check)  # set: read and checked


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("cpu",), {"device": "cpu"}, "given twice"),
        (("cpu",), {"devise": "cpu"}, "unknown keyword"),
        (("cpu", "float64"), {}, "float64"),
    ],
)
def test_a_bad_positional_region_raises_every_time(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    for _ in range(2):  # never remembered: the second construction raises too
        with pytest.raises(ampcore.AmpcoreError, match=match):
            ampcore.autocast(*args, **kwargs)


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_a_region_given_paddles_use_promote_warns_every_time_it_is_made(how: str) -> None:
    args: tuple[Any, ...] = (True, None, None, "O2", "bfloat16", True) if how == "positional" else ()
    kwargs: dict[str, Any] = {} if args else {"level": "O2", "dtype": "bfloat16", "use_promote": True}
    for _ in range(3):  # never made from the memo: the warning is the construction's
        with pytest.warns(ampcore.AmpcoreWarning, match="use_promote"):
            ampcore.autocast(*args, **kwargs)
