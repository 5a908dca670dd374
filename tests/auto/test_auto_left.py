"""Issue 27, eleventh stop: the gaps the last stop noticed and left alone.

1. Two threads recording one model at once: each thread's layers with pre-hooks of their own
   are planned after those hooks (``_hooks.defer`` keys per thread; one thread's end of
   recording left the other's layers to the global hook for the rest of its call).
2. Roots applied call by call for good (arguments the guard cannot see, churning
   signatures) plan such layers after their own hooks too.
3. Hand-written plan entries (no costs) loaded unfrozen: applied, kept out of the cache's
   measured figures, never refused by the next process.
4. A deepcopy or pickle made while a program runs keeps no key of the running program.
5. ``_kinds`` judges a class per instance where its forward's products differ by instance.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, _auto, _clean, _decide, _equal, _wide, fixed
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

X = torch.randn(8, 16)


def _half_weights(layer: nn.Linear) -> None:
    """FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16)`` in pure torch: the layer's own
    pre-hook puts bfloat16 weights in place for its forward (its float32 ones back after)."""
    master = dict(layer._parameters)

    def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
        for name, p in master.items():
            module._parameters[name] = nn.Parameter(p.detach().to(BF16), requires_grad=False)

    def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        module._parameters.update(master)

    layer.register_forward_pre_hook(pre)
    layer.register_forward_hook(post)


def _model() -> nn.Sequential:
    """:func:`_wide` (its Linear(16, 16) layers decided float32) with bfloat16 weights put in
    place by the own pre-hook of its third layer: run with the O1 lists, as torch.autocast."""
    torch.manual_seed(0)
    model = _wide()
    _half_weights(model[2])
    return model


def _reference(x: torch.Tensor) -> Any:
    """:func:`_model`'s output under :func:`fixed`: its third layer's weights bfloat16 for good."""
    torch.manual_seed(0)
    model = _wide()
    model[2].to(BF16)
    with torch.no_grad(), fixed(BF16):
        return model(x)


def _plan_for(model: nn.Module) -> None:
    torch.manual_seed(0)
    _decide(_wide(), lambda m, i, enter: _call(m, X, enter), 1)  # the same layers, no hook


def _call(model: nn.Module, x: Any, enter: Callable[[torch.dtype], Any]) -> Any:
    with torch.no_grad(), enter(BF16):
        return model(x)


# --- (1) two threads recording one model at once ---------------------------------------------


def test_two_threads_recording_one_model_at_once_plan_each_layer_after_its_own_hooks() -> None:
    """Thread A's recording ends while thread B's is inside the model (B waits in the second
    layer's own pre-hook until A is done): B's third layer, whose own pre-hook puts bfloat16
    weights in place, is still planned after that hook (before: A's end of recording removed
    the one deferral both shared, the global hook planned B's layer on its float32 weights
    and ran it in float32 on bfloat16 weights: ``mat1 and mat2 must have the same dtype``)."""
    model = _model()
    _plan_for(model)
    want = _reference(X)
    b_inside, a_done = threading.Event(), threading.Event()

    def wait(module: nn.Module, args: tuple[Any, ...]) -> None:
        if threading.current_thread().name == "A":
            assert b_inside.wait(30), "B never entered"
        elif threading.current_thread().name == "B":
            b_inside.set()
            assert a_done.wait(30), "A never finished"

    model[1].register_forward_pre_hook(wait)
    got: dict[str, Any] = {}

    def worker() -> None:
        name = threading.current_thread().name
        try:
            got[name] = _call(model, X, _auto)
        except BaseException as exc:  # noqa: BLE001 - compared below
            got[name] = exc
        finally:
            if name == "A":
                a_done.set()
            else:
                b_inside.set()

    threads = [threading.Thread(target=worker, name=n) for n in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for name in ("A", "B"):
        assert not isinstance(got[name], BaseException), f"{name}: {got[name]!r}"
        _equal(got[name], want, name)
    _clean(model)


# --- (2) roots applied call by call for good -------------------------------------------------


class _Root(nn.Module):
    """:func:`_model` behind a forward that takes an argument the guard cannot see (a callable)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _model()

    def forward(self, x: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out if then is None else then(out)


def _casts_input(layer: nn.Module) -> None:
    """A layer's own pre-hook that casts its input to bfloat16 (an offload or a user's hook)."""
    layer.register_forward_pre_hook(lambda m, args: (args[0].to(BF16),))


class _ToLow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(BF16)


@pytest.mark.parametrize("own", ["weights", "input"])
@pytest.mark.parametrize("why", ["unsigned", "churning"])
def test_a_root_applied_call_by_call_plans_layers_after_their_own_hooks(
    why: str, own: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root whose calls the guard cannot see (a callable among its arguments), or one whose
    signatures churn (a new batch size every call, beyond its table), applies the plan call
    by call for good: its third layer, whose own pre-hook puts bfloat16 weights in place
    (FSDP2's ``param_dtype``) or casts its input to bfloat16, is planned after that hook on
    every call, as a recorded root's (before: only on the first call; later ones planned it
    float32 on its float32 weights and ran it on bfloat16 ones, ``mat1 and mat2 must have
    the same dtype``, or cast the bfloat16 input to float32 and ran the layer in float32)."""
    from ampcore._auto import _store

    monkeypatch.setattr(_store, "_MAX_SIGNATURES", 2)
    root = _Root()
    if own == "input":
        root.body[2]._forward_pre_hooks.clear()
        root.body[2]._forward_hooks.clear()
        _casts_input(root.body[2])
    torch.manual_seed(0)
    batches = [9 + i % 8 for i in range(12)] if why == "churning" else [8] * 4
    plain = _wide()
    _decide(plain, lambda m, i, enter: [_call(m, torch.randn(b, 16), enter) for b in sorted(set(batches))], 1)
    reference = _wide()
    reference.load_state_dict(root.body.state_dict())
    if own == "weights":
        reference[2].to(BF16)
    else:  # the cast as a module of its own before the layer: the layer planned on its result
        reference = nn.Sequential(*reference[:2], _ToLow(), *reference[2:])
    for i, b in enumerate(batches):
        x = torch.randn(b, 16)
        with torch.no_grad():
            with _auto(BF16):
                got = root(x, torch.relu) if why == "unsigned" else root(x)
            with fixed(BF16):
                out = reference(x)
                want = torch.relu(out) if why == "unsigned" else out
        _equal(got, want, f"call {i}")
    _clean(root)


# --- (4) a copy made while a program runs ----------------------------------------------------


def _ours(module: nn.Module) -> list[Any]:
    """Keys in ``module``'s hook dicts that are not torch's handle ids (ours, or copies of ours)."""
    dicts = (
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
    )
    return [k for m in module.modules() for d in dicts for k in getattr(m, d) if type(k) is not int]


class _Copies(nn.Module):
    """:func:`_mlp`'s layers (a mixed program: its first layer switched to float32) whose
    forward copies itself once armed (an EMA copy taken in the forward, while the program runs)."""

    def __init__(self, how: str, wide: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = (
            _wide() if wide else nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 4))
        )
        self.how, self.armed, self.copies = how, False, list[nn.Module]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        if self.armed:
            self.armed = False
            self.copies.append(_duplicate(self, self.how))
        return out


def _arm_once(model: _Copies) -> None:
    """Arm ``model`` once: ``armed`` is a setting of the model until the forward resets it
    (that call records the root again: a setting changed), state from then on (the next
    armed call runs the program)."""
    model.armed = True
    _call(model, X, _auto)


def _duplicate(model: nn.Module, how: str) -> nn.Module:
    import copy
    import io

    if how == "deepcopy":
        return copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)  # type: ignore[no-any-return]


@pytest.mark.parametrize("wide", [False, True], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_made_while_a_program_runs_keeps_no_key_of_the_run(
    how: str, wide: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model copied inside its own forward while its program runs (its switched layer
    holds the run's hooks, the root its post-hook): the copy holds no :class:`Running`
    (before: ``deepcopy`` copied the run, with its program, plan and region, into the
    copy's dicts, and pickling failed on the program's weak references), its strays go at its
    first call, and it runs as a root of its own."""
    from ampcore._auto import _roots_state
    from ampcore._auto._program import Running

    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")  # no whole-call check: the mixed program runs
    model = _Copies(how, wide)
    _decide(model, lambda m, i, enter: _call(m, X, enter), 1)
    for _ in range(3):  # recorded, settled
        _call(model, X, _auto)
    (last,) = _roots_state._local.last.values()
    assert last.program.switched and last.program.default_fp32 == wide  # its run hooks a switched layer
    _arm_once(model)
    model.armed = True
    got = _call(model, X, _auto)
    clone = model.copies[-1]
    assert not any(isinstance(k, Running) for k in _ours(clone)), "a run copied"
    with torch.no_grad():
        clone(X)  # outside a region: the strays go
    assert _ours(clone) == [], ("a hook of ours left on the copy", _where(clone))
    _equal(got, _call(clone, X, fixed), "the program's call")
    for _ in range(3):  # in regions the copy is a root of its own
        _equal(_call(clone, X, _auto), _call(model, X, fixed), "copy")
        assert _ours(clone) == []
    _clean(model, clone)


def _where(module: nn.Module) -> list[tuple[str, str, Any]]:
    dicts = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_always_called")
    return [
        (n, d, getattr(m, d)[k])
        for n, m in module.named_modules()
        for d in dicts
        for k in getattr(m, d)
        if type(k) is not int
    ]


# --- (3) hand-written plan entries -----------------------------------------------------------


def _measured_beside_hand_written(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A hand-written decision (no costs) loaded unfrozen for one Linear, another Linear
    measured (fake clock) in the same process: the plan is written to the cache.  Returns
    (the hand-written class, the measured one)."""
    from test_auto_trust import _steady

    import ampcore
    from ampcore._auto import _hooks
    from ampcore._auto._shapes import shape_class

    hand, measured, x = nn.Linear(8, 8), nn.Linear(8, 16), torch.randn(4, 8)
    with torch.autocast("cpu", dtype=BF16):
        hand_key, measured_key = shape_class(hand, (x,), "cpu"), shape_class(measured, (x,), "cpu")
    assert hand_key is not None and measured_key is not None
    fp = ampcore.auto_plan("cpu").fingerprint
    ampcore.load_plan({"format": 2, "fingerprint": fp, "entries": {hand_key: {"decision": "fp32"}}}, freeze=False)
    for name, value in (("spent_s", 0.0), ("clocks", {})):
        monkeypatch.setattr(_hooks._process, name, value)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: _steady(26.9, 11.4))
    with ampcore.autocast("cpu", level="auto"):
        assert hand(x).dtype == torch.float32  # the hand-written decision applies in this process
        assert measured(x).dtype == BF16  # measured: low
    plan = ampcore.auto_plan("cpu")
    assert plan.entries[measured_key].costs is not None and plan.entries[hand_key].costs is None
    return hand_key, measured_key


def test_hand_written_entries_loaded_unfrozen_apply_here_and_stay_out_of_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk cache holds measured figures only: a decision without them (written by hand,
    loaded with ``load_plan(..., freeze=False)``) applies in the process that loaded it and
    is not written; the next process reads the cache without refusing anything (before: the
    entry was written, then refused with a warning by every later read, which rewrote the
    file) and measures that class itself."""
    import warnings

    import ampcore
    from ampcore._auto._cache import cache_files, forget_plans

    hand_key, measured_key = _measured_beside_hand_written(monkeypatch)
    (path,) = cache_files()
    assert hand_key not in path.read_text() and measured_key in path.read_text()
    forget_plans()  # the next process
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)
        plan = ampcore.auto_plan("cpu")
    assert hand_key not in plan.entries
    assert plan.entries[measured_key].source == "cache"


# --- (5) a class judged per instance where its forward depends on instance flags -------------


class _Flagged(nn.Module):
    """A Conv1D-like layer (``x @ weight``) whose flag adds a second product."""

    def __init__(self, n: int, twice: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) * 0.1)
        self.twice = twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.weight
        return out @ self.weight if self.twice else out


@pytest.fixture
def _unjudged() -> Any:
    from ampcore._auto import _shapes

    _shapes.forget_kind(_Flagged)
    yield
    _shapes.forget_kind(_Flagged)


@pytest.mark.usefixtures("_unjudged")
@pytest.mark.parametrize("first", ["once", "twice"])
def test_a_flag_that_adds_a_second_product_is_judged_per_instance(first: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two instances of one class, one whose flag adds a second product: each is judged by
    its own first call (before: the class by the first instance met, so a two-product layer
    met second was planned as a plain product, sharing its shape classes and decisions with
    the one-product layer of the same weights; met first, it left the one-product layers
    unplanned), and their shape classes differ."""
    from ampcore._auto._shapes import MATMUL, planned_ops, shape_class

    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")  # nothing measured: the judgement only
    once, twice = _Flagged(16, twice=False), _Flagged(16, twice=True)
    model = nn.Sequential(once, twice) if first == "once" else nn.Sequential(twice, once)
    x = torch.randn(4, 16)
    for _ in range(2):
        with torch.no_grad(), _auto(BF16):
            got = model(x)
        with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
            want = model(x)
        _equal(got, want, "undecided: the O1 lists")
    _clean(model)
    assert planned_ops(once) == MATMUL[1] and planned_ops(twice) is None
    with torch.autocast("cpu", dtype=BF16):
        assert shape_class(once, (x,), "cpu") is not None and shape_class(twice, (x,), "cpu") is None
    another = _Flagged(16, twice=False)  # the planned flags' kind at once: no watch
    assert planned_ops(another) == MATMUL[1]
    assert (shape_class(another, (x,), "cpu") or "").startswith("_Flagged(weight=16x16, twice=False) in=[4x16]")


@pytest.mark.parametrize("own", ["weights", "input"])
def test_a_region_applied_call_by_call_for_its_whole_life_plans_layers_after_their_own_hooks(own: str) -> None:
    """A ``level="auto"`` region nested in another ampcore region has no roots: the global
    hooks apply the plan to every module call for its whole life.  A layer whose own
    pre-hook puts bfloat16 weights in place (or casts its input) is planned after that hook:
    its parent's call defers it (before: planned on its float32 weights, run in float32 on
    bfloat16 ones, ``mat1 and mat2 must have the same dtype``)."""
    import ampcore

    model = _model()
    if own == "input":
        model[2]._forward_pre_hooks.clear()
        model[2]._forward_hooks.clear()
        _casts_input(model[2])
    _plan_for(model)
    reference = _wide()
    reference.load_state_dict(model.state_dict())
    if own == "weights":
        reference[2].to(BF16)
    else:
        reference = nn.Sequential(*reference[:2], _ToLow(), *reference[2:])
    for i in range(3):
        x = torch.randn(8, 16)
        with torch.no_grad():
            with ampcore.autocast("cpu", dtype=BF16), _auto(BF16):
                got = model(x)
            with fixed(BF16):
                want = reference(x)
        _equal(got, want, f"call {i}")
    _clean(model)


# --- (1, the class) process-wide tables another thread changes meanwhile -------------------


def test_a_plan_measured_by_two_threads_at_once_takes_both_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AutoPlan.set`` looked at the plan's entries in a generator (Python code per entry):
    another thread's measurement setting an entry meanwhile raised ``dictionary changed size
    during iteration`` in this one (simulated: the other thread's entry goes in at the first
    switch point)."""
    from ampcore._auto import _plan
    from ampcore._auto._costs import Costs

    plan = _plan.AutoPlan({"backend": "test"})
    plan.set("Linear(a) in=[4x8] grad", Costs(1.0, 2.0, 0.1))
    real, other = _plan.family_of, [True]

    def family_of(key: str) -> Any:
        if other and key == "Linear(a) in=[4x8] grad":  # inside the look at the entries
            other.clear()
            plan.entries["Linear(c) in=[4x8] grad"] = plan.entries["Linear(a) in=[4x8] grad"]  # the other thread
        return real(key)

    monkeypatch.setattr(_plan, "family_of", family_of)
    assert plan.set("Linear(b) in=[4x8] grad", Costs(2.0, 1.0, 0.1)) == "low"
    assert len(plan.entries) == 3


def test_a_root_stored_by_another_thread_meanwhile_does_not_break_the_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_store.program_for(root, None, plan)`` looked through the root's programs in a
    generator (``Program.valid``: Python code per program): another thread storing a program
    of the root meanwhile raised ``dictionary changed size during iteration``."""
    from ampcore._auto import _store
    from ampcore._auto._program import Program

    root = nn.Linear(2, 2)
    plan = _plan_stub()
    first = Program(plan, 0, False, ())  # type: ignore[arg-type]
    _store._programs[root] = {("a",): first}
    calls = [0]

    def valid(self: Program, plan: Any) -> bool:
        calls[0] += 1
        if calls[0] == 1:
            _store._programs[root][("b",)] = first  # the other thread's store
            return False
        return True

    monkeypatch.setattr(Program, "valid", valid)
    assert _store.program_for(root, None, plan) == 0  # the programs as they were when it looked: none valid
    assert _store.program_for(root, None, plan) is first  # the next lookup sees the other thread's
    _store.forget()


def _plan_stub() -> Any:
    from ampcore._auto._plan import AutoPlan

    return AutoPlan({"backend": "test"})


class _IntKeysOnly(dict):  # type: ignore[type-arg]
    """A hook dict that takes torch's handle ids only (a torch whose dicts refuse other keys)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if type(key) is not int:
            raise TypeError("handle ids only")
        super().__setitem__(key, value)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_of_a_layer_hooked_through_the_public_registration_drops_the_runs_hooks(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a switched layer's dicts refuse the run's key, the run registers its hooks
    through torch's public API (handle ids as keys): a copy made while the program runs holds
    them under those ids, bound to a :class:`~ampcore._auto._stale.Stale`; they go at the
    copy's next call (before: kept for good, each call running them)."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    model = _Copies(how)
    layer = model.body[0]  # switched to float32 in the low-default program
    for name in ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called"):
        setattr(layer, name, _IntKeysOnly())
    _decide(model, lambda m, i, enter: _call(m, X, enter), 1)
    for _ in range(3):
        _call(model, X, _auto)
    _arm_once(model)
    model.armed = True
    _call(model, X, _auto)
    clone = model.copies[-1]
    copied = clone.body[0]
    assert any(type(getattr(v, "__self__", None)).__name__ == "Stale" for v in copied._forward_pre_hooks.values())
    with torch.no_grad():
        clone(X)
    for name in ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called"):
        assert dict(getattr(copied, name)) == {}, name
    _clean(model)
