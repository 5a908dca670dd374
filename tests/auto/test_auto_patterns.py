"""Issue 27: usage patterns of ``level="auto"`` regions the benchmarks never use.

The benchmarks run one model, one training step per region.  Here: inference loops
(``no_grad``, ``inference_mode``, ``eval()``, a smaller last batch), several roots per region
(a model and a loss module, a GAN's G and D in one region and in two, a teacher in
``no_grad``), a model called twice per region (siamese, two micro-batches, gradient
accumulation with a region per micro-batch), wrapper roots (a DDP-like module, a
``train_step`` helper that enters the region, the decorator form), keyword-only calls (HF
style, ``labels=``), validation every few steps in the same region code, models alternating
through one place in the code (also more than its roots' cap), and sequence lengths over
more values than a root keeps programs for.

Each pattern runs its steps under ``level="auto"`` (a plan loaded with ``load_plan``: known
decisions, no timing) and, on a copy of its modules, under the fixed precision the plan
gives (``test_auto_sweep.fixed_region``): outputs (values and dtypes) and gradients equal,
nothing of auto left after each step.  Settled, further steps must not record again (no
recording with its dispatch mode: counted, not timed).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, counting  # noqa: F401 (fixture)
from test_auto_sweep import LOW, _clean, _flat, _load, fixed_region
from torch import nn

import ampcore
from ampcore._auto import _hooks, _roots_state, _store
from ampcore._auto._shapes import planned_ops, shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

Enter = Callable[[], Any]
Step = Callable[[list[nn.Module], int, Enter], list[Any]]


def _mlp(i: int = 16, h: int = 32, o: int = 4) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o))


def _auto() -> Any:
    return ampcore.autocast("cpu", level="auto")


def _decide(modules: list[nn.Module], step: Step, steps: int) -> None:
    """Load a plan deciding every shape class ``step`` meets (float32 and bfloat16 inputs):
    a Linear with 16 inputs float32, every other one low (mixed programs)."""
    keys: dict[str, str] = {}

    def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
        if planned_ops(module) is None:
            return
        for dtype in (torch.float32, LOW):
            moved = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
            key = shape_class(module, moved, "cpu")
            if key is not None:
                keys[key] = "fp32" if getattr(module, "in_features", 0) == 16 else "low"

    handle = nn.modules.module.register_module_forward_pre_hook(pre)
    try:
        for i in range(steps):
            step(copy.deepcopy(modules), i, lambda: torch.autocast("cpu", enabled=False))
    finally:
        handle.remove()
    _load(keys)


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The recordings made (those with their dispatch mode: the ones that may give programs)."""
    yield counting(monkeypatch)


def _run(make: Callable[[], list[nn.Module]], step: Step, steps: int, made: list[Any], settled: int = 4) -> None:
    """``step`` under auto equals it under the fixed precision, step by step; then ``settled``
    more steps (the same sequence again) record nothing."""
    torch.manual_seed(0)
    modules = make()
    reference = copy.deepcopy(modules)
    _decide(modules, step, steps)
    for i in range(steps):
        torch.manual_seed(i)
        want = list(_flat(step(reference, i, fixed_region)))
        torch.manual_seed(i)
        got = list(_flat(step(modules, i, _auto)))
        _clean(*modules)
        assert [t.dtype for t in got] == [t.dtype for t in want], f"step {i}"
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        for p, q in zip(
            (p for m in modules for p in m.parameters()), (q for m in reference for q in m.parameters()), strict=True
        ):
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
    made.clear()
    for i in range(settled):
        step(modules, i % steps, _auto)
        _clean(*modules)
    assert made == [], f"{len(made)} recordings in {settled} settled steps"


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().pow(2).mean()


# --- inference loops ----------------------------------------------------------------------

BATCHES = [8, 8, 8, 3]  # the last batch is smaller


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "eval-grad"])
def test_inference_loops_with_a_smaller_last_batch(mode: str, recordings: list[Any]) -> None:
    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        ms[0].eval()
        x = torch.randn(BATCHES[i], 16)
        grad = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, torch.enable_grad)
        with grad(), enter():
            out = ms[0](x)
        return [out.detach().clone() if mode == "inference_mode" else out]

    _run(lambda: [_mlp()], step, len(BATCHES), recordings, settled=8)


# --- several roots per region --------------------------------------------------------------


def test_a_model_and_a_separate_loss_module(recordings: list[Any]) -> None:
    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        model, loss_fn = ms
        n = BATCHES[i]
        with enter():
            loss = loss_fn(model(torch.randn(n, 16)), torch.randint(0, 4, (n,)))
        loss.backward()
        return [loss]

    _run(lambda: [_mlp(), nn.CrossEntropyLoss()], step, len(BATCHES), recordings)


@pytest.mark.parametrize("regions", [1, 2])
def test_a_gan_with_g_and_d_in_one_or_two_regions(regions: int, recordings: list[Any]) -> None:
    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        g, d = ms
        with enter():
            fake = g(torch.randn(8, 16))
            d_loss = _loss(d(fake.detach())) - _loss(d(torch.randn(4, 32)))
            if regions == 1:
                g_loss = -_loss(d(fake))
        if regions == 2:
            d_loss.backward()
            with enter():
                g_loss = -_loss(d(fake))
            g_loss.backward()
        else:
            (d_loss + g_loss).backward()
        return [fake, d_loss, g_loss]

    _run(lambda: [_mlp(16, 32, 32), _mlp(32, 64, 1)], step, 3, recordings)


def test_teacher_student_with_the_teacher_in_no_grad(recordings: list[Any]) -> None:
    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        teacher, student = ms
        teacher.eval()
        x = torch.randn(8, 16)
        with enter():
            with torch.no_grad():
                t = teacher(x)
            loss = _loss(student(x) - t)
        loss.backward()
        return [t, loss]

    _run(lambda: [_mlp(), _mlp()], step, 3, recordings)


# --- a model called more than once per region ----------------------------------------------


@pytest.mark.parametrize("second", [8, 3], ids=["siamese", "two-micro-batches"])
def test_a_model_called_twice_per_region(second: int, recordings: list[Any]) -> None:
    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        with enter():
            a, b = ms[0](torch.randn(8, 16)), ms[0](torch.randn(second, 16))
            loss = _loss(a) + _loss(b)
        loss.backward()
        return [a, b]

    _run(lambda: [_mlp()], step, 3, recordings)


def test_gradient_accumulation_with_a_region_per_micro_batch(recordings: list[Any]) -> None:
    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        outs = []
        for n in (8, 8, 3):
            with enter():
                out = ms[0](torch.randn(n, 16))
            (_loss(out) / 3).backward()
            outs.append(out)
        return outs

    _run(lambda: [_mlp()], step, 2, recordings)


# --- wrapper roots, helpers, the decorator, keyword-only calls ------------------------------


class Wrapper(nn.Module):
    """A DDP-like wrapper: its forward calls the inner model with whatever it was given."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class HFStyle(nn.Module):
    """Keyword-only arguments, ``labels=`` computing the loss inside, a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp(16, 32, 8)

    def forward(self, input_ids: Any = None, attention_mask: Any = None, labels: Any = None) -> dict[str, Any]:
        logits = self.body(input_ids * attention_mask)
        loss = None if labels is None else nn.functional.cross_entropy(logits.float(), labels)
        return {"loss": loss, "logits": logits}


@pytest.mark.parametrize("form", ["ddp-wrapper", "train-step-helper", "decorator", "hf-kwargs"])
def test_wrapper_roots_helpers_the_decorator_and_kwargs_only_calls(form: str, recordings: list[Any]) -> None:
    def train_step(model: nn.Module, batch: torch.Tensor, enter: Enter) -> Any:
        with enter():  # the helper enters the region for its caller
            return model(batch)

    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        x = torch.randn(BATCHES[i], 16)
        if form == "ddp-wrapper":
            with enter():
                out = ms[0](x)
        elif form == "train-step-helper":
            out = train_step(ms[0], x, enter)
        elif form == "decorator":
            out = enter()(lambda: ms[0](x))()
        else:
            with enter():
                out = ms[0](input_ids=x, attention_mask=torch.ones_like(x), labels=torch.randint(0, 8, (len(x),)))
            out["loss"].backward()
            return [out]
        _loss(out).backward()
        return [out]

    make = {"ddp-wrapper": lambda: [Wrapper(_mlp())], "hf-kwargs": lambda: [HFStyle()]}.get(form, lambda: [_mlp()])
    _run(make, step, len(BATCHES), recordings)


# --- a region that sometimes takes another branch; models alternating -----------------------


def test_validation_every_few_steps_in_the_same_region_code(recordings: list[Any]) -> None:
    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        validate = i % 3 == 2
        ms[0].train(not validate)
        with torch.set_grad_enabled(not validate), enter():
            out = ms[0](torch.randn(32 if validate else 8, 16))
        if not validate:
            _loss(out).backward()
        return [out]

    _run(lambda: [_mlp()], step, 6, recordings, settled=6)


@pytest.mark.parametrize("models", [2, 20, _roots_state._MAX_ROOTS + 4], ids=["two", "twenty", "over-the-roots-cap"])
def test_models_alternating_through_one_place_in_the_code(
    models: int, recordings: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each model a root of the same place in the code.  Up to the place's cap (64) every
    one keeps its program: no global hooks once settled.  Before, the cap was 16: an
    ensemble of 20 small models ran call by call under the global hooks for ever (1.9 x
    float32 per model step against 1.4 x with programs)."""

    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        outs = []
        for model in ms:
            with enter():
                out = model(torch.randn(8, 16))
            _loss(out).backward()
            outs.append(out)
        return outs

    assert 20 < _roots_state._MAX_ROOTS < models or models <= 20

    def make() -> list[nn.Module]:
        return [_mlp() for _ in range(models)]

    _run(make, step, 2, recordings, settled=0 if models > 20 else 2)
    acquired: list[None] = []
    real = _hooks.acquire
    monkeypatch.setattr(_hooks, "acquire", lambda: acquired.append(None) or real())
    modules = make()
    for i in range(3):
        step(modules, i, _auto)
    acquired.clear()
    step(modules, 3, _auto)
    over = models > 20  # the cap's own case: beyond it, the place's regions take the global hooks
    assert (len(acquired) == 0) is not over, f"{len(acquired)} of {models} regions took the global hooks"


# --- more signatures than a root keeps programs for -----------------------------------------


def test_sequence_lengths_over_more_values_than_a_root_keeps_stop_recording(
    recordings: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lengths 1-100 in random order, a root keeping programs for 16 signatures (256 in
    use: the test is shorter): the others apply the plan call by call once it dropped 16.
    Before, the table was cleared when full and every new length recorded again, for ever
    (2.0 x the better of float32 and torch.autocast on such a model)."""
    monkeypatch.setattr(_store, "_MAX_SIGNATURES", 16)
    lengths = list(range(1, 101)) * 3
    random.Random(0).shuffle(lengths)

    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        with enter():
            out = ms[0](torch.randn(lengths[i], 16))
        _loss(out).backward()
        return [out]

    torch.manual_seed(0)
    model = _mlp()
    _decide([model], step, 100)  # every bucket decided
    for i in range(len(lengths)):
        step([model], i, _auto)
        _clean(model)
    recordings.clear()
    for i in range(100):
        step([model], i, _auto)
    assert recordings == []
    programs = _store._programs[model]
    assert len(programs) <= _store._MAX_SIGNATURES + 1  # bounded (and its count of dropped ones)


def test_the_sequence_lengths_pattern_stays_equal_to_the_fixed_precision(recordings: list[Any]) -> None:
    lengths = [*range(1, 81), *range(80, 0, -1), 3, 50, 77]

    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        with enter():
            out = ms[0](torch.randn(lengths[i], 16))
        _loss(out).backward()
        return [out]

    _run(lambda: [_mlp()], step, len(lengths), recordings, settled=0)


# --- exceptions in multi-root regions -------------------------------------------------------


@pytest.mark.parametrize("where", ["loss-module", "second-call", "between-roots"])
def test_an_exception_in_a_settled_multi_root_region_leaves_nothing_and_the_next_step_is_right(
    where: str, recordings: list[Any]
) -> None:
    class Failing(nn.CrossEntropyLoss):
        fail = False

        def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            if self.fail and where == "loss-module":
                raise RuntimeError("boom")
            return super().forward(out, target)

    def step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        model, loss_fn = ms
        with enter():
            a = model(torch.randn(8, 16))
            if loss_fn.fail and where == "between-roots":
                raise RuntimeError("boom")
            b = model(torch.randn(3, 16).requires_grad_(loss_fn.fail and where == "second-call"))
            if loss_fn.fail and where == "second-call":
                raise RuntimeError("boom")
            loss = loss_fn(a, torch.randint(0, 4, (8,))) + _loss(b)
        loss.backward()
        return [a, b, loss]

    def make() -> list[nn.Module]:
        return [_mlp(), Failing()]

    _run(make, step, 3, recordings)
    torch.manual_seed(0)
    modules = make()
    for i in range(3):
        step(modules, i, _auto)
    modules[1].fail = True  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="boom"):
        step(modules, 3, _auto)
    _clean(*modules)
    modules[1].fail = False  # type: ignore[assignment]
    reference = copy.deepcopy(modules)
    torch.manual_seed(5)
    want = step(reference, 0, fixed_region)
    torch.manual_seed(5)
    got = step(modules, 0, _auto)
    _clean(*modules)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0)


# --- a Lightning-like structure ----------------------------------------------------------------


class LitLike(nn.Module):
    """A LightningModule-like model: the loop calls ``training_step`` / ``validation_step``
    (plain methods, not module calls), which call ``self(...)`` and a loss module."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp(16, 32, 4)
        self.loss_fn = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        x, y = batch
        return self.loss_fn(self(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], i: int) -> torch.Tensor:
        x, y = batch
        return self.loss_fn(self(x), y)


def test_a_lightning_like_loop_with_steps_as_methods_and_validation(recordings: list[Any]) -> None:
    def fit_step(ms: list[nn.Module], i: int, enter: Enter) -> list[Any]:
        """The trainer's loop body: its own region around the module's step method."""
        lit = ms[0]
        assert isinstance(lit, LitLike)
        n = (8, 8, 5)[i % 3]
        batch = (torch.randn(n, 16), torch.randint(0, 4, (n,)))
        if i % 4 == 3:  # validation every few steps
            lit.eval()
            with torch.no_grad(), enter():
                loss = lit.validation_step(batch, i)
            lit.train()
            return [loss]
        with enter():
            loss = lit.training_step(batch, i)
        loss.backward()
        return [loss]

    _run(lambda: [LitLike()], fit_step, 8, recordings, settled=8)
