"""Issue 27: the settled path of a ``level="auto"`` root call (``_roots._sentinel``).

A root that ran a program keeps it, with what it was found under, in its thread's
``_roots._Last``: a later call with the same signature runs it without looking the program
up again (no ``plan_of``, no ``program_for``) and reuses one ``Running``.  Each thing the
plan or the program depends on, changed, sends the next call the full way (``_find``) once,
and the call after it is settled again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_programs import Net, _plan
from torch import nn

import ampcore
from ampcore._auto import _hooks, _program, _roots, _roots_state
from ampcore._auto._cache import plans
from ampcore._policy.signature import MADE

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _step(
    net: nn.Module, *args: Any, region: ampcore.autocast | None = None, before: Callable[[], Any] | None = None
) -> Any:
    with region if region is not None else ampcore.autocast("cpu", level="auto"):  # one place in the code
        if before is not None:  # inside the region, before the root call
            before()
        return net(*args)


@pytest.fixture
def finds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[nn.Module]]:
    """The roots whose calls went the full way (``_roots._find``)."""
    found: list[nn.Module] = []
    full = _roots._find
    monkeypatch.setattr(_roots, "_find", lambda module, *a: found.append(module) or full(module, *a))
    yield found


def _no_hooks(net: nn.Module) -> bool:
    hooked = any(m._forward_pre_hooks or m._forward_hooks or m._forward_hooks_always_called for m in net.modules())
    kwargs_marks = any(m._forward_pre_hooks_with_kwargs for m in net.modules())
    return not hooked and not kwargs_marks and not _hooks.installed() and _program.local.run is None


def _settled(net: Net, finds: list[nn.Module]) -> tuple[torch.Tensor, torch.Tensor]:
    """``net``'s inputs, its plan loaded (big layers low, small ones float32) and its program
    settled (recorded, then run); ``finds`` emptied."""
    x, y = torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    for _ in range(3):
        _step(net, x, y)
    finds.clear()
    return x, y


def test_a_settled_root_call_looks_nothing_up_and_reuses_one_running(finds: list[nn.Module]) -> None:
    net = Net(big=0, small=4)
    x, y = _settled(net, finds)
    runs = []
    for _ in range(4):
        out = _step(net, x, y)
        runs.append(_roots._local.last[id(net)].run)
        assert _no_hooks(net) and torch.is_autocast_enabled("cpu") is False
    assert finds == [] and runs[0] is not None and all(r is runs[0] for r in runs) and runs[0].simple
    assert net.small_dtypes() == {torch.float32} and torch.equal(out[1], net(x, y)[1])


def _new_generation(net: Net, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    before = plans.generation
    _plan(net, x, y, big="low", small="fp32")  # the same decisions in a new plan object
    assert plans.generation != before
    return lambda: None


def _more_threads(net: Net, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # another fingerprint: another plan
    return lambda: torch.set_num_threads(threads)


def _new_measurement(net: Net, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    from ampcore._auto import Costs
    from ampcore._auto._shapes import shape_class

    with torch.enable_grad():
        key = shape_class(net.small[0], (y,), "cpu") or ""
    ampcore.auto_plan("cpu").set(key, Costs(fp32_ms=1.0, low_ms=4.0, cast_ms=0.5))  # plan.changes moves
    return lambda: None


def _replaced_layer(net: Net, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    net.small[1] = nn.Linear(8, 8)
    return lambda: None


def _converted_layer(net: Net, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    net.small[2].bfloat16()
    return lambda: None


def _stale_program(net: Net, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    _roots._local.last[id(net)].stale[0] = True  # what a collected module's callback sets
    return lambda: None


@pytest.mark.parametrize(
    "change",
    [_new_generation, _more_threads, _new_measurement, _replaced_layer, _converted_layer, _stale_program],
    ids=["plans-generation", "thread-count", "plan-changes", "module-tree", "weight-dtype", "stale"],
)
def test_what_the_program_depends_on_changed_sends_one_call_the_full_way(
    finds: list[nn.Module], monkeypatch: pytest.MonkeyPatch, change: Callable[..., Callable[[], None]]
) -> None:
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")  # nothing measured: a new plan runs the O1 lists
    net, x, y = Net(big=0, small=4), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    region = ampcore.autocast("cpu", level="auto")  # one object: its spec is the one found under
    for _ in range(3):
        _step(net, x, y, region=region)
    finds.clear()
    _step(net, x, y, region=region)
    assert finds == []
    undo = change(net, x, y)
    try:
        _step(net, x, y, region=region)
        assert finds == [net]  # the full way once
        for _ in range(3):
            _step(net, x, y, region=region)
        assert finds.count(net) <= 3  # recorded again (at most its tries), then settled
        finds.clear()
        _step(net, x, y, region=region)
        assert finds == [] and _no_hooks(net)
    finally:
        undo()


def test_another_region_object_with_the_same_plan_stays_settled_and_another_plan_does_not(
    finds: list[nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")  # nothing measured: a new plan runs the O1 lists
    net, x, y = Net(big=0, small=2), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    region = ampcore.autocast("cpu", level="auto")
    for _ in range(3):
        _step(net, x, y, region=region)
    finds.clear()
    asked: list[Any] = []
    plan_of = _hooks.plan_of
    monkeypatch.setattr(_hooks, "plan_of", lambda r: asked.append(r) or plan_of(r))
    _step(net, x, y, region=region)
    assert finds == [] and asked == []  # the same region object: the plan is not asked
    _step(net, x, y, region=ampcore.autocast("cpu", level="auto"))  # a region made per step: from
    assert finds == [] and asked == [] and net.small_dtypes() == {torch.float32}  # the memo, same spec
    MADE.clear()  # a region made the long way: another spec, the same plan (asked once)
    _step(net, x, y, region=ampcore.autocast("cpu", level="auto"))
    assert finds == [] and len(asked) == 1 and net.small_dtypes() == {torch.float32}
    _step(net, x, y, region=ampcore.autocast("cpu", level="auto", dtype=torch.float16))  # another plan
    assert finds == [net]
    finds.clear()
    _step(net, x, y[:2], region=region)  # another signature (a batch size the plan has no decision for)
    assert finds == [net] and net.small_dtypes() == {torch.bfloat16}


def test_an_entry_left_by_a_collected_root_whose_id_came_back_is_not_used(finds: list[nn.Module]) -> None:
    nets, x, y = [Net(big=0, small=2) for _ in range(2)], torch.randn(4, 32), torch.randn(4, 8)
    _plan(nets[0], x, y, big="low", small="fp32")
    for _ in range(3):
        for net in nets:
            _step(net, x, y)
    finds.clear()
    _roots._local.last[id(nets[1])] = _roots._local.last[id(nets[0])]  # as if nets[1] had nets[0]'s id
    _step(nets[1], x, y)
    assert finds == [nets[1]] and nets[1].small_dtypes() == {torch.float32}


def test_a_mixed_program_reuses_its_running_and_hooks_its_switched_module_per_call(finds: list[nn.Module]) -> None:
    net = Net(big=1, small=3, relu=False)
    x, y = _settled(net, finds)
    runs = []
    for _ in range(3):
        net.seen.clear()
        out_x, _ = _step(net, x, y)
        runs.append(_roots._local.last[id(net)].run)
        assert net.seen["big.0"] == torch.bfloat16 == out_x.dtype and net.small_dtypes() == {torch.float32}
        assert _no_hooks(net)
    assert finds == [] and all(r is runs[0] for r in runs) and runs[0] is not None and not runs[0].simple


def test_an_exception_in_a_settled_root_leaves_its_running_ready_for_the_next_call() -> None:
    class Sometimes(Net):
        boom = False

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if self.boom:
                raise KeyboardInterrupt  # skips torch's always-call hooks
            return super().forward(x, y)

    for big in (0, 1):  # a program that hooks nothing, and one with a switched module
        net, x, y = Sometimes(big=big, small=2, relu=False), torch.randn(4, 32), torch.randn(4, 8)
        _plan(net, x, y, big="low", small="fp32")
        for _ in range(3):
            _step(net, x, y)
        for boom in (True, False, True, False):
            net.boom = boom
            net.seen.clear()
            if boom:
                with pytest.raises(KeyboardInterrupt):
                    _step(net, x, y)
            else:
                _step(net, x, y)
                assert net.small_dtypes() == {torch.float32}
            assert _no_hooks(net) and not torch.is_autocast_enabled("cpu")
            assert not torch.nn.modules.module._global_forward_pre_hooks


def test_two_places_in_the_code_in_turn_keep_their_own_roots(finds: list[nn.Module]) -> None:
    nets, x, y = [Net(big=0, small=2) for _ in range(2)], torch.randn(4, 32), torch.randn(4, 8)
    _plan(nets[0], x, y, big="low", small="fp32")

    def first() -> None:
        with ampcore.autocast("cpu", level="auto"):
            nets[0](x, y)

    def second() -> None:
        with ampcore.autocast("cpu", level="auto"):
            nets[1](x, y)

    for _ in range(3):
        first()
        second()
    sites = [s for s in _roots._local.sites.values() if s.roots]
    assert sorted(len(s.roots) for s in sites) == [1, 1]  # each place knows its own model only
    finds.clear()
    for _ in range(2):
        first()
        second()
    assert finds == [] and all(net.small_dtypes() == {torch.float32} for net in nets)
    _roots.forget()
    assert _roots._local.site is None and _roots._local.sites == {}


@pytest.mark.parametrize("flag_readable", [True, False], ids=["flag-read", "is_compiling-called"])
def test_a_region_entered_while_torch_compiles_or_exports_takes_the_global_hooks(
    monkeypatch: pytest.MonkeyPatch, flag_readable: bool
) -> None:
    """A region's entry reads torch.compiler's flag (where this torch has it) instead of
    calling ``is_compiling()``: set (dynamo compiling, a non-strict export), the region is
    not eligible and holds the global hooks, as before."""
    if not flag_readable:
        monkeypatch.setattr(_roots, "_compiler", _roots._AskCompiling())
    region = ampcore.autocast("cpu", level="auto")  # made outside: while compiling it would be torch's
    for compiling in (True, False):
        monkeypatch.setattr(torch.compiler, "_is_compiling_flag", compiling)
        with region:
            eligible = _roots._local.entered[-1][1] is not None
            global_hooks = bool(_hooks._process.handles)
        assert eligible is not compiling and global_hooks is compiling
    assert not _hooks.installed()


def test_a_settled_root_dropped_by_its_user_is_collected(finds: list[nn.Module]) -> None:
    """The kept ``_Last`` and its ``Running`` hold no strong reference to the root or its
    region between calls: a model the user drops is freed (with its programs)."""
    import gc
    import weakref

    for big in (0, 1):  # a program that hooks nothing, and one with a switched module
        net = Net(big=big, small=2, relu=False)
        _settled(net, finds)
        x, y = torch.randn(4, 32), torch.randn(4, 8)
        _step(net, x, y)
        assert _roots._local.last[id(net)].run is not None
        ref, layer, key = weakref.ref(net), weakref.ref(net.small[0]), id(net)
        del net
        gc.collect()
        assert ref() is None and layer() is None and key not in _roots._local.last


def _two_nets() -> tuple[list[Net], Callable[[nn.Module], Any]]:
    """Two nets, the plan of their layers loaded, and a function decorated with an auto region
    that calls the net it is given on their inputs."""
    nets, x, y = [Net(big=0, small=2) for _ in range(2)], torch.randn(4, 32), torch.randn(4, 8)
    _plan(nets[0], x, y, big="low", small="fp32")

    @ampcore.autocast("cpu", level="auto")
    def call(net: nn.Module) -> Any:
        return net(x, y)

    return nets, call


def test_regions_entered_through_the_decorator_find_their_callers_place(finds: list[nn.Module]) -> None:
    """``@ampcore.autocast(...)``: the place is the decorated function's caller (the frames of
    ampcore's wrapper are skipped); two callers in turn keep their own roots."""
    nets, call = _two_nets()

    for _ in range(3):
        call(nets[0])  # one place
        call(nets[1])  # another place
    places = [s for s in _roots._local.sites.values() if s.roots]
    assert sorted(len(s.roots) for s in places) == [1, 1]
    finds.clear()
    for _ in range(2):
        call(nets[0])
        call(nets[1])
    assert finds == [] and all(net.small_dtypes() == {torch.float32} for net in nets)


@pytest.mark.parametrize("flag_readable", [True, False], ids=["flag-read", "is_compiling-called"])
def test_a_settled_root_called_while_the_compiling_flag_is_set_runs_no_program(
    finds: list[nn.Module], monkeypatch: pytest.MonkeyPatch, flag_readable: bool
) -> None:
    """The sentinel asks ``is_dynamo_compiling()`` (dynamo folds it), then reads the flag (a
    non-strict export runs eager Python with it set): set, the root runs the region's O1
    lists as torch.autocast would, its program untouched."""
    if not flag_readable:
        monkeypatch.setattr(_roots, "_compiler", _roots._AskCompiling())
    net = Net(big=0, small=2)
    x, y = _settled(net, finds)
    last = _roots._local.last[id(net)]
    _step(net, x, y, before=lambda: monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True))
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", False)
    assert net.small_dtypes() == {torch.bfloat16} and finds == [] and _roots._local.last[id(net)] is last
    _step(net, x, y)
    assert net.small_dtypes() == {torch.float32} and finds == [] and _no_hooks(net)


def test_a_root_called_with_signatures_in_turn_keeps_each_settled(
    finds: list[nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Micro-batches of two sizes, an inference loop's short last batch, a loss module fed
    two batch sizes: each signature the root ran keeps its ``_Last`` (and its ``Running``),
    so a switch of signature looks nothing up and makes nothing."""
    net = Net(big=0, small=2)
    x, y = _settled(net, finds)
    sizes = (4, 2, 4, 1, 4)  # the plan decides the small layers at each size (O1: bf16 elsewhere)
    for n in sizes * 2:
        _step(net, x[:n], y[:n])
    finds.clear()
    runs: dict[int, Any] = {}
    made: list[Any] = []
    init = _roots._Last.__init__
    monkeypatch.setattr(_roots._Last, "__init__", lambda self, *a: made.append(a) or init(self, *a))
    for n in sizes * 3:
        _, out = _step(net, x[:n], y[:n])
        run = _roots._local.last[id(net)].run
        assert run is runs.setdefault(n, run) and out.shape[0] == n and _no_hooks(net)
    assert finds == [] and made == [] and len(runs) == 3
    assert net.small_dtypes() == {torch.float32}  # the full batch's program ran last


def test_a_root_fed_more_signatures_than_it_keeps_settled_stays_correct(finds: list[nn.Module]) -> None:
    """Beyond the signatures a root keeps settled, the oldest go and the calls stay right."""
    net = Net(big=0, small=2)
    x, y = _settled(net, finds)
    xs, ys = torch.randn(40, 32), torch.randn(40, 8)
    for _ in range(2):
        for n in range(1, 41):
            _, out = _step(net, xs[:n], ys[:n])
            assert out.shape[0] == n and _no_hooks(net)
    assert len(_roots._local.last[id(net)].alts) <= _roots_state._MAX_SIGNATURES
    _step(net, x, y)
    assert net.small_dtypes() == {torch.float32}


def test_the_place_of_a_region_is_found_without_reading_line_numbers(
    finds: list[nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame's ``f_lineno`` decodes its code's line table from the start: its cost grows
    with the function entering the region (a 2,000-line one: 10 us per read).  The place is
    the instruction (``f_lasti``): two places in one function still keep their own roots."""
    import sys
    import types

    read: list[int] = []

    class Spy:
        def __init__(self, frame: types.FrameType) -> None:
            self.frame = frame

        f_code = property(lambda self: self.frame.f_code)
        f_lasti = property(lambda self: self.frame.f_lasti)
        f_back = property(lambda self: None if self.frame.f_back is None else Spy(self.frame.f_back))

        @property
        def f_lineno(self) -> int:
            read.append(self.frame.f_lineno)
            return self.frame.f_lineno

    spied = types.SimpleNamespace(_getframe=lambda depth=0: Spy(sys._getframe(depth + 1)), modules=sys.modules)
    monkeypatch.setattr(_roots, "sys", spied)
    nets, decorated = _two_nets()
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            decorated.__wrapped__(nets[0])  # type: ignore[attr-defined]
        with ampcore.autocast("cpu", level="auto"):
            decorated.__wrapped__(nets[1])  # type: ignore[attr-defined]
        decorated(nets[0])
    places = [s for s in _roots._local.sites.values() if s.roots]
    assert sorted(len(s.roots) for s in places) == [1, 1, 1] and read == []
    with ampcore.autocast("cpu", level="auto"):  # another place: a site of its own
        decorated.__wrapped__(nets[0])  # type: ignore[attr-defined]
    assert len([s for s in _roots._local.sites.values() if s.roots]) == 4 and read == []


def test_regions_whose_dtype_or_thread_count_take_turns_keep_each_settled(
    finds: list[nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each region dtype and thread count has its own plan, so the same signature has a
    program per plan: a root whose regions take turns between them keeps each settled
    (a switch looks nothing up)."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")  # nothing measured: a new plan runs the O1 lists
    net, x, y = Net(big=0, small=2), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    threads = torch.get_num_threads()
    dtypes = (torch.bfloat16, torch.float16)

    def turn(i: int) -> Any:
        torch.set_num_threads(threads + (i // 2) % 2)
        return _step(net, x, y, region=ampcore.autocast("cpu", level="auto", dtype=dtypes[i % 2]))

    try:
        for i in range(12):
            turn(i)
        finds.clear()
        for i in range(8):
            turn(i)  # the plan loaded is bfloat16's at the first thread count; the others: O1
            assert _no_hooks(net) and net.small_dtypes() == {torch.float32 if i % 4 == 0 else dtypes[i % 2]}
        assert finds == []
    finally:
        torch.set_num_threads(threads)
