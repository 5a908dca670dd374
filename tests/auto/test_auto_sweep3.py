"""Issue 27, third held-out sweep of ``level="auto"``: dimensions the earlier sweeps
(``test_auto_sweep.py``, ``test_auto_inner.py``, ``test_auto_heldout_kinds.py``,
``test_auto_patterns.py``) did not cover.

* float16 regions on the CPU, and the dtype switching between regions of one place;
* inputs that are not float32 tensors: int64 token ids, bool masks, bf16 / fp16 / fp64
  inputs, inputs that require grad, non-contiguous and channels_last inputs, 0-size batches;
* ``torch.set_num_threads`` changing between steps;
* a forward that enters regions itself (ampcore O1 / O0, ``torch.autocast(enabled=False)``)
  and an auto region inside an O1 region;
* training loops with ampcore's ``GradScaler`` and an optimizer step inside the region;
* (``test_auto_sweep3_models.py``) a model changed between steps, roots whose forward
  returns a dict, a dataclass, a list, ``None`` or a generator, and the sweep's cases with
  measured plans.

Each case runs its steps under ``level="auto"`` (a plan given with ``load_plan``: known
decisions, no timing) and, on a copy of the model, under the fixed precision the plan gives
(:func:`fixed`: torch.autocast with each planned call switched by hand, in the region's
dtype; the innermost ampcore region's rules inside a region the forward enters): outputs
(values, dtypes), gradients and parameters equal, nothing of auto left after each step, also
after an exception.  Settled, further steps must record nothing (recordings counted, never
timed).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, counting, fixed  # noqa: F401 (fixture; counting, fixed: for test_auto_sweep4)
from test_auto_sweep import _flat
from torch import nn

import ampcore
from ampcore._auto import Costs, _hooks, _program, _store
from ampcore._auto._program import Program
from ampcore._auto._shapes import planned_ops, shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

BF16, FP16 = torch.bfloat16, torch.float16
Enter = Callable[[torch.dtype], Any]  # a region in a dtype
Step = Callable[[nn.Module, int, Enter], Any]


def _rule(module: nn.Module) -> str:
    """The decisions of every case: a Linear with 16 inputs (or a Conv2d with 3) float32, the
    other planned calls low (mixed programs, both defaults met)."""
    return "fp32" if getattr(module, "in_features", 0) == 16 or getattr(module, "in_channels", 0) == 3 else "low"


def _moved(args: tuple[Any, ...], dtype: torch.dtype) -> tuple[Any, ...]:
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _decide(
    model: nn.Module,
    step: Step,
    steps: int,
    dtypes: tuple[torch.dtype, ...] = (BF16,),
    measured: bool = False,
    clone: Callable[[nn.Module], nn.Module] = copy.deepcopy,
) -> None:
    """Load, for each of ``dtypes``, a plan deciding every shape class ``step`` meets by
    :func:`_rule` (inputs as given, in float32 and in that dtype), the steps run on copies
    made by ``clone`` (a ``copy.deepcopy`` of a model holding a ``torch.jit.script``-ed
    module runs the original's scripted parameters: their gradients would pile up in it);
    ``measured``: give the classes :func:`_rule` decides float32 their costs, the others
    are measured."""
    keys: dict[torch.dtype, dict[str, str]] = {d: {} for d in dtypes}

    def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
        if planned_ops(module) is None:
            return
        for low, found in keys.items():
            for moved in (args, _moved(args, torch.float32), _moved(args, low)):
                key = shape_class(module, moved, "cpu")
                if key is not None:
                    found[key] = _rule(module)

    copies = [clone(model) for _ in range(steps)]  # (before the hook: a clone may trace a module)
    handle = nn.modules.module.register_module_forward_pre_hook(pre)
    try:
        for i, twin in enumerate(copies):
            step(twin, i, lambda dtype: torch.autocast("cpu", dtype=dtype))
    finally:
        handle.remove()
    for low, found in keys.items():
        if not measured:
            load(low, found)
            continue
        plan = ampcore.auto_plan("cpu", low)
        for key, decision in found.items():
            if decision == "fp32":
                plan.set(key, Costs(1.0, 4.0, 0.1), source="given")


def load(dtype: torch.dtype, decisions: dict[str, str]) -> None:
    """A plan of ``decisions`` for the CPU in ``dtype`` (this thread count)."""
    fp = ampcore.auto_plan("cpu", dtype).fingerprint
    entries = {k: {"decision": d} for k, d in decisions.items()}
    ampcore.load_plan({"format": 2, "fingerprint": fp, "entries": entries})


def _clean(*modules: nn.Module) -> None:
    """Nothing of auto is left (``test_auto_sweep._clean``; a user's own hooks, keyed by
    handle ids, may stay): no global hook, no hook of ours, autocast off, no program running."""
    assert not _hooks.installed() and _program.local.run is None and _program.local.rec is None
    assert not torch.is_autocast_enabled("cpu") and _program.local.settled is None
    assert not nn.modules.module._global_forward_pre_hooks and not nn.modules.module._global_forward_hooks
    for root in modules:
        for m in root.modules():
            for hooks in (m._forward_pre_hooks, m._forward_hooks, m._forward_pre_hooks_with_kwargs):
                assert all(type(key) is int for key in hooks), f"a hook left on {m}"


def _auto(dtype: torch.dtype) -> Any:
    return ampcore.autocast("cpu", level="auto", dtype=dtype)


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    return counting(monkeypatch)


def _equal(got: Any, want: Any, what: str) -> None:
    got_t, want_t = list(_flat(got)), list(_flat(want))
    assert [t.dtype for t in got_t] == [t.dtype for t in want_t], what
    for g, w in zip(got_t, want_t, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=what)


def _params(model: nn.Module, reference: nn.Module, what: str) -> None:
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=f"{what}: {name}")
        assert (p.grad is None) == (q.grad is None), f"{what}: {name}.grad"
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=f"{what}: {name}.grad")


def run(
    make: Callable[[], nn.Module],
    step: Step,
    steps: int,
    made: list[Any],
    dtypes: tuple[torch.dtype, ...] = (BF16,),
    settled: int | None = None,
    decide: bool = True,
    default: str | None = None,
    measured: bool = False,
    clone: Callable[[nn.Module], nn.Module] = copy.deepcopy,
) -> nn.Module:
    """``step`` under auto equals it under :func:`fixed`, step by step (outputs, gradients,
    parameters); then the same steps again (``settled``, default ``steps``) record nothing.
    ``decide``: load the plans first (:func:`_decide`; else the test did; ``measured``: the
    classes decided low are measured in the first step, see :func:`measuring`); ``default``: the
    default (``"fp32"`` or ``"low"``) the model's programs must have (the case is what it
    says it is); ``clone``: how the reference is made from the model."""
    torch.manual_seed(0)
    model = make()
    reference = clone(model)
    if decide:
        _decide(model, step, steps, dtypes, measured, clone)
    for i in range(steps):
        torch.manual_seed(i)
        want = step(reference, i, fixed)
        torch.manual_seed(i)
        got = step(model, i, _auto)
        _clean(model)
        _equal(got, want, f"step {i}")
        _params(model, reference, f"step {i}")
    if default is not None:
        defaults = {p.default_fp32 for p in _store._programs.get(model, {}).values() if isinstance(p, Program)}
        assert defaults == {default == "fp32"}, f"programs' defaults: {defaults}"
    made.clear()
    for i in range(steps if settled is None else settled):
        step(model, i % steps, _auto)
        _clean(model)
    assert made == [], f"{len(made)} recordings in settled steps"
    return model


def _backward(out: Any) -> None:
    found = [t for t in _flat(out) if t.requires_grad]
    if found:
        sum(t.float().sum() for t in found).backward()


def _mlp() -> nn.Sequential:
    """Linear 16->32 (fp32), ReLU, Linear 32->32 (low), Linear 32->4 (low)."""
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 4))


def _wide() -> nn.Sequential:
    """Mostly float32, the last layer low: a float32 default with a low module switched on."""
    return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 32), nn.Linear(32, 4))


def _into_fp32() -> nn.Sequential:
    """Mostly float32, a low layer feeding a float32 one directly (no op between them)."""
    return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 32), nn.Linear(32, 16), nn.Linear(16, 4))


def _train(model: nn.Module, x: torch.Tensor, enter: Enter, dtype: torch.dtype = BF16, **kw: Any) -> Any:
    with enter(dtype):
        out = model(x, **kw)
    _backward(out)
    return out


# --- (1) float16 on the CPU, and the dtype switching between regions of one place ----------


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
def test_a_float16_region_matches_its_fixed_precision(make: Any, default: str, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    run(make, lambda m, i, enter: _train(m, x, enter, FP16), 3, recordings, (FP16,), default=default)


def test_a_float16_model_in_a_float16_region(recordings: list[Any]) -> None:
    """Weights that are not float32: the O1 lists, as torch.autocast."""
    x = torch.randn(8, 16).to(FP16)
    run(lambda: _mlp().to(FP16), lambda m, i, enter: _train(m, x, enter, FP16), 3, recordings, (FP16,))


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_a_low_layer_feeding_a_float32_layer_directly(dtype: torch.dtype, recordings: list[Any]) -> None:
    """Its output reached the float32 layer without an op between them: a float32 default
    (no hook on the float32 layer) left it in low precision there (mat1 and mat2 must have
    the same dtype), on every settled step."""
    x = torch.randn(8, 16)
    run(_into_fp32, lambda m, i, enter: _train(m, x, enter, dtype), 3, recordings, (dtype,), default="low")


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
def test_the_dtype_switching_between_regions_of_one_place(make: Any, default: str, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    order = [BF16, FP16, FP16, BF16, FP16, BF16]
    run(make, lambda m, i, enter: _train(m, x, enter, order[i]), len(order), recordings, (BF16, FP16), default=default)


# --- (2) inputs that are not float32 tensors ----------------------------------------------


class Tokens(nn.Module):
    """int64 token ids through an Embedding, a bool padding mask, a Linear stack."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.body = _mlp()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids).masked_fill(~mask.unsqueeze(-1), 0.0)
        return self.body(h)


def test_int64_token_ids_and_a_bool_mask(recordings: list[Any]) -> None:
    ids = torch.randint(0, 50, (4, 6))
    mask = torch.rand(4, 6) > 0.3
    run(Tokens, lambda m, i, enter: _train(m, ids, enter, mask=mask), 3, recordings)


class Cast(nn.Module):
    """A model that takes any floating input and casts it to float32 first (fp64 data)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.float())


@pytest.mark.parametrize("dtype", [BF16, FP16, torch.float64], ids=str)
@pytest.mark.parametrize("region", [BF16, FP16], ids=["bf16-region", "fp16-region"])
def test_low_precision_and_double_inputs(dtype: torch.dtype, region: torch.dtype, recordings: list[Any]) -> None:
    x = torch.randn(8, 16).to(dtype)
    make = Cast if dtype == torch.float64 else _mlp
    run(make, lambda m, i, enter: _train(m, x, enter, region), 3, recordings, (region,))


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
def test_an_input_that_requires_grad_gets_the_same_gradient(make: Any, default: str, recordings: list[Any]) -> None:
    grads: dict[int, list[torch.Tensor]] = {}

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i), requires_grad=True)
        out = _train(m, x, enter)
        grads.setdefault(id(m), []).append(x.grad)
        return out, x.grad

    run(make, step, 3, recordings, default=default)


def test_non_contiguous_inputs(recordings: list[Any]) -> None:
    x = torch.randn(16, 8).t()  # 8 x 16, strides (1, 8)
    sliced = torch.randn(8, 32)[:, ::2]
    assert not x.is_contiguous() and not sliced.is_contiguous()
    run(_mlp, lambda m, i, enter: _train(m, x if i % 2 else sliced, enter), 4, recordings)


class Convs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)  # fp32 (3 in-channels)
        self.body = nn.Conv2d(8, 8, 3, padding=1)  # low
        self.head = nn.Linear(8, 4)  # low

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(torch.relu(self.stem(x)))).mean((2, 3)))


@pytest.mark.parametrize("layout", ["channels_last-input", "channels_last-model"])
def test_channels_last(layout: str, recordings: list[Any]) -> None:
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)

    def make() -> nn.Module:
        model = Convs()
        return model.to(memory_format=torch.channels_last) if layout.endswith("model") else model

    run(make, lambda m, i, enter: _train(m, x, enter), 3, recordings)


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
def test_a_zero_size_batch(make: Any, default: str, recordings: list[Any]) -> None:
    batches = [torch.randn(8, 16), torch.randn(0, 16), torch.randn(8, 16), torch.randn(0, 16)]
    run(make, lambda m, i, enter: _train(m, batches[i], enter), len(batches), recordings, default=default)


# --- (3) torch.set_num_threads changing between steps ---------------------------------------


@pytest.fixture
def threads() -> Iterator[int]:
    """The thread count before the test, set again after it."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
def test_the_thread_count_changing_between_steps(make: Any, default: str, threads: int, recordings: list[Any]) -> None:
    """Each thread count has its own plan (the fingerprint holds it): the region uses the
    plan of the count it runs with, and a settled loop that switches counts records nothing."""
    x = torch.randn(8, 16)
    counts = [1, 2, 2, 1, 2, 1]

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        torch.set_num_threads(counts[i])
        return _train(m, x, enter)

    for count in (1, 2):  # a plan for each count
        torch.set_num_threads(count)
        _decide(make(), lambda m, i, enter: _train(m, x, enter), 1)
    run(make, step, len(counts), recordings, decide=False, default=default)


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
def test_the_thread_count_changing_between_root_calls_of_one_region(
    make: Any, default: str, threads: int, recordings: list[Any]
) -> None:
    x = torch.randn(8, 16)

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        found = []
        with enter(BF16):
            for count in (1, 2, 1):
                torch.set_num_threads(count)
                found.append(m(x))
        _backward(found)
        return found

    for count in (1, 2):
        torch.set_num_threads(count)
        _decide(make(), lambda m, i, enter: _train(m, x, enter), 1)
    run(make, step, 3, recordings, decide=False, default=default)


# --- (4) a forward that enters regions itself; auto inside O1 ------------------------------

INNER: dict[str, Callable[[], Any]] = {
    "O1": lambda: ampcore.autocast("cpu", level="O1"),
    "O0": lambda: ampcore.autocast("cpu", level="O0"),
    "torch-off": lambda: torch.autocast("cpu", enabled=False),
    "ampcore-off": lambda: ampcore.autocast("cpu", enabled=False),
    "torch-fp16": lambda: torch.autocast("cpu", dtype=FP16),
    "auto": lambda: ampcore.autocast("cpu", level="auto"),
}


class Inner(nn.Module):
    """Layers of both decisions before, inside and after a region the forward enters (its
    input cast to float32 there, as code that switches autocast off does).  ``wide``: four
    float32 layers and one low one whose output is returned as it is (a float32 default);
    else three and three (a low default)."""

    def __init__(self, inner: str, wide: bool = False) -> None:
        super().__init__()
        self.inner, self.wide = inner, wide
        self.a = nn.Linear(16, 16)  # fp32
        self.b = nn.Linear(16, 16)  # fp32
        self.c = nn.Linear(16, 32)  # fp32
        self.d = nn.Linear(32, 4 if wide else 32)  # low
        self.e = nn.Linear(32, 16)  # low
        self.f = nn.Linear(16, 4)  # fp32

    def forward(self, x: torch.Tensor) -> Any:
        h = self.a(x)
        with INNER[self.inner]():
            h = self.b(torch.relu(h.float()))
            g = self.d(self.c(h))  # an fp32 layer, then a low one
            if not self.wide:
                g = self.e(g * 2 + 1)  # ops after a switched layer, inside the inner region
        if self.wide:
            return self.f(h), g
        return self.f(g.float())


@pytest.mark.parametrize("wide", [False, True], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("inner", list(INNER))
def test_a_forward_that_enters_a_region_itself(inner: str, wide: bool, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    run(lambda: Inner(inner, wide), lambda m, i, enter: _train(m, x, enter), 3, recordings)


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
def test_an_auto_region_inside_an_o1_region(make: Any, default: str, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)

    @contextlib.contextmanager
    def outer(enter: Enter, dtype: torch.dtype) -> Iterator[None]:
        if enter is _auto:
            with ampcore.autocast("cpu", level="O1"), _auto(dtype):
                yield
        else:
            with enter(dtype):
                yield

    run(make, lambda m, i, enter: _train(m, x, lambda d: outer(enter, d)), 3, recordings)  # call by call: no program


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("around", ["torch-off", "O1", "O0"])  # torch-fp16: torch's weight cache fails it
def test_a_settled_root_called_inside_a_region_of_its_own(
    make: Any, default: str, around: str, recordings: list[Any]
) -> None:
    """Every other step calls the root inside ``around`` (within the auto region): its
    settled program must not apply there, nor leave autocast on after it."""
    x = torch.randn(8, 16)

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            first = m(x)
            with INNER[around]() if i % 2 else contextlib.nullcontext():
                second = m(x)
            after = torch.is_autocast_enabled("cpu")
            third = m(x)
        _backward((first, second, third))
        return first, second, third, torch.tensor(after)

    run(make, step, 4, recordings, default=default)


class Sometimes(nn.Module):
    """Runs its layers inside ``INNER[inner]`` where ``self.off`` (state the call does not show)."""

    def __init__(self, inner: str, wide: bool) -> None:
        super().__init__()
        self.inner, self.off = inner, False
        self.layers = _wide() if wide else _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.off:
            return self.layers(x)
        with INNER[self.inner]():
            return self.layers(x.float())


@pytest.mark.parametrize("wide", [False, True], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("inner", ["torch-off", "torch-fp16", "O0", "O1"])
@pytest.mark.parametrize("first", [False, True], ids=["recorded-outside", "recorded-inside"])
def test_a_region_the_forward_enters_on_some_steps_only(
    inner: str, wide: bool, first: bool, recordings: list[Any]
) -> None:
    """The program was recorded with the other state: the flag is not part of the signature.
    (A float32-default program recorded without the forward's torch.autocast(dtype=float16)
    ran its float32 layers in float16 until issue 27's thirteenth stop: ``_auto._entered``;
    more such regions in ``test_auto_forward_regions.py``.)"""
    x = torch.randn(8, 16)
    offs = [first, not first, not first, first, not first, first]

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        m.off = offs[i]
        return _train(m, x, enter)

    run(lambda: Sometimes(inner, wide), step, len(offs), recordings)


@pytest.mark.parametrize("inner", ["torch-off", "O1"])
def test_an_exception_inside_a_region_the_forward_entered_leaves_nothing(inner: str) -> None:
    x = torch.randn(8, 16)
    model = Inner(inner, wide=True)
    _decide(model, lambda m, i, enter: _train(m, x, enter), 1)
    for _ in range(2):  # recorded, then settled
        with _auto(BF16):
            model(x)

    def boom(module: nn.Module, args: Any, output: Any) -> None:
        raise RuntimeError("boom")

    handle = model.d.register_forward_hook(boom)
    with pytest.raises(RuntimeError, match="boom"), _auto(BF16):
        model(x)
    handle.remove()
    _clean(model)
    with fixed(BF16):
        want = model(x)
    with _auto(BF16):
        got = model(x)
    _equal(got, want, "after the exception")


# --- (5) training loops: ampcore's GradScaler, the optimizer step inside the region --------


@pytest.mark.parametrize(("make", "default"), [(_mlp, "low"), (_wide, "fp32")], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("where", ["step-inside", "step-outside"])
def test_a_training_loop_with_the_grad_scaler(
    make: Any, default: str, dtype: torch.dtype, where: str, recordings: list[Any]
) -> None:
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    state: dict[int, tuple[Any, Any]] = {}

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        if id(m) not in state:
            opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
            state[id(m)] = (opt, ampcore.GradScaler("cpu", dtype=dtype, init_scale=256.0, growth_interval=2))
        opt, scaler = state[id(m)]
        with enter(dtype):
            out = m(x)
            loss = nn.functional.mse_loss(out.float(), y)
            if where == "step-inside":
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
        if where == "step-outside":
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        return out, loss, scaler.get_scale() if hasattr(scaler, "get_scale") else None

    run(make, step, 4, recordings, (dtype,), default=default)
