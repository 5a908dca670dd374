"""Issue 27, eleventh held-out sweep of ``level="auto"``: uses the earlier sweeps did not try
(the model kinds are in ``test_auto_sweep11.py``).

* a GAN step in one region: the critic frozen by ``requires_grad_(False)`` for the
  generator's loss and unfrozen after, ``detach`` between them, two optimizers;
* a root called twice per step at two batch sizes (labelled and unlabelled data), and
  training and ``torch.no_grad`` calls of one root at the same batch size in one region;
* ``torch.utils.checkpoint`` (``use_reentrant=False``, dropout inside) around the whole root;
* gradients by ``torch.autograd.grad`` and a hand-written SGD update; two backward passes
  through one graph (``retain_graph=True``);
* per-sample gradients by ``torch.func.vmap(torch.func.grad(...))`` over
  ``functional_call``;
* the root's ``forward`` replaced mid-run (another order of its layers), parameters
  re-initialised by ``model.apply`` mid-run, the model moved to float64 and back;
* a forward pre-hook with kwargs changing a keyword argument, ``torch.autocast`` entered
  inside the forward with ``cache_enabled=False`` and in float16 inside a bfloat16 region;
* two regions per step (a model, then a frozen critic of its output), the root's
  ``forward`` called directly (no root hooks: its children are the calls), an input that
  requires grad every other step.

Each case is compared step by step with the fixed precision its plan gives
(``test_auto_sweep3.run``), with measured plans (a fake clock) and given plans, and in
float16 regions with given plans.  Strings that change every call (a batch's file names, a
tag) are held by type once two recordings give the same program (before: every call
recorded), and numpy arguments (an array, a ``numpy.float32``) are guarded (before: every
call applied the plan call by call).  No wall clock.
"""

from __future__ import annotations

import pathlib
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, FP16, Enter, _backward, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from test_auto_sweep9 import GAN, _state
from test_auto_sweep10_uses import _mlp
from torch import nn

import ampcore
from ampcore._auto import _guard, _store
from ampcore._auto._program import Program

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class Dropped(nn.Module):
    """An MLP with dropout (the checkpoint's recompute must draw the same mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Swapped(nn.Module):
    """Three layers; :func:`_reordered` is the forward swapped in mid-run."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        self.side = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(F.relu(self.b(F.relu(self.a(x)))))


def _reordered(self: Swapped, x: torch.Tensor) -> torch.Tensor:
    return self.c(F.relu(self.b(F.relu(self.side(x)))) + F.relu(self.a(x)))


class Scaled(nn.Module):
    """A keyword argument scales the hidden state; a pre-hook with kwargs halves it on odd
    batches."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)
        self.register_forward_pre_hook(self._hook, with_kwargs=True)

    @staticmethod
    def _hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if float(args[0][0, 0]) > 0:
            return args, {**kwargs, "scale": kwargs.get("scale", 1.0) * 0.5}
        return None

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.b(F.relu(self.a(x)) * scale)


class Inner(nn.Module):
    """The forward enters ``torch.autocast`` itself: bfloat16 with ``cache_enabled=False``,
    and float16."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.a(x))
        with torch.autocast("cpu", dtype=BF16, cache_enabled=False):
            h = F.relu(self.b(h))
        with torch.autocast("cpu", dtype=FP16):
            h = F.relu(self.c(h))
        return self.d(h)


class Critic(nn.Module):
    """A model and a frozen critic of its output."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _mlp()
        self.critic = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1)).requires_grad_(False)


def _cases() -> dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module, int, Enter], Any]]]:
    x, real, y = torch.randn(8, 16), torch.randn(8, 16), torch.randint(0, 4, (8,))
    store: dict[int, Any] = {}
    swapped: set[int] = set()

    def gan(m: nn.Module, i: int, enter: Enter) -> Any:
        opt_g, opt_d = _state(
            m, lambda m: (torch.optim.Adam(m.g.parameters(), 1e-3), torch.optim.Adam(m.d.parameters(), 1e-3)), store
        )
        z = torch.randn(8, 8)
        with enter(BF16):
            fake = m.g(z)
            loss_d = F.softplus(m.d(fake.detach())).float().mean() + F.softplus(-m.d(real)).float().mean()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            m.d.requires_grad_(False)
            out = m.d(fake)
            loss_g = F.softplus(-out).float().mean()
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
            m.d.requires_grad_(True)
        return loss_d, out

    def twice(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            labelled, unlabelled = m(x), m(x[:3] * 2)
        (F.cross_entropy(labelled.float(), y) + unlabelled.float().softmax(-1).pow(2).mean()).backward()
        return labelled, unlabelled

    def no_grad_between(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            with torch.no_grad():
                target = m(x.flip(0))
            out = m(x)
        F.mse_loss(out.float(), target.float()).backward()
        return out, target

    def checkpointed(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False)
        _backward(out)
        return out

    def by_grad(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m(x)
        params = [p for p in m.parameters() if p.requires_grad]
        grads = torch.autograd.grad(F.cross_entropy(out.float(), y), params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.add_(g, alpha=-0.1)
        return out, grads

    def retained(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m(x)
        out.float().pow(2).mean().backward(retain_graph=True)
        out.float().abs().mean().backward()
        return out

    def per_sample(m: nn.Module, i: int, enter: Enter) -> Any:
        params = {k: v.detach() for k, v in m.named_parameters()}

        def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
            out = torch.func.functional_call(m, p, (xi[None],))
            return F.cross_entropy(out.float(), yi[None])

        with enter(BF16):
            grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
        with torch.no_grad():
            for name, p in m.named_parameters():
                p.add_(grads[name].mean(0), alpha=-0.1)
        return grads

    def swap(m: nn.Module, i: int, enter: Enter) -> Any:
        if i == 3 and id(m) not in swapped:
            swapped.add(id(m))
            m.forward = types.MethodType(_reordered, m)  # type: ignore[method-assign]
        return _train(m, x, enter)

    def reinit(m: nn.Module, i: int, enter: Enter) -> Any:
        if i == 2:
            torch.manual_seed(99)
            m.apply(lambda layer: layer.reset_parameters() if isinstance(layer, nn.Linear) else None)
        return _train(m, x, enter)

    def double(m: nn.Module, i: int, enter: Enter) -> Any:
        m.to(torch.float64 if i in (2, 3) else torch.float32)  # (each step: _decide runs a fresh copy per step)
        return _train(m, x.double() if i in (2, 3) else x, enter)

    def critic(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m.model(x)
        with enter(BF16):
            score = m.critic(out.float().softmax(-1))
        (F.cross_entropy(out.float(), y) - score.float().mean()).backward()
        return out, score

    def direct(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m.forward(x) if i % 2 else m(x)
        _backward(out)
        return out

    def grad_input(m: nn.Module, i: int, enter: Enter) -> Any:
        xi = x.clone().requires_grad_(i % 2 == 0)
        out = _train(m, xi, enter)
        return out, xi.grad

    return {
        "gan-critic-frozen-by-requires-grad": (GAN, gan),
        "root-twice-two-batch-sizes": (_mlp, twice),
        "no-grad-and-training-same-batch": (_mlp, no_grad_between),
        "checkpoint-around-the-root": (Dropped, checkpointed),
        "autograd-grad-hand-sgd": (_mlp, by_grad),
        "retain-graph-two-backwards": (_mlp, retained),
        "per-sample-grads-vmap-grad": (_mlp, per_sample),
        "forward-swapped-mid-run": (Swapped, swap),
        "reinit-by-apply-mid-run": (_mlp, reinit),
        "float64-and-back": (_mlp, double),
        "pre-hook-with-kwargs": (Scaled, lambda m, i, enter: _train(m, x * (1 if i % 2 else -1), enter)),
        "inner-autocast-no-cache-and-fp16": (Inner, lambda m, i, enter: _train(m, x, enter)),
        "two-regions-model-then-critic": (Critic, critic),
        "forward-called-directly": (_mlp, direct),
        "input-grad-every-other-step": (_mlp, grad_input),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_uses_measured_match_the_fixed_precision(case: str, measuring: Any, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,), measured=True)


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_uses_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,))


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_uses_in_float16_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, lambda m, i, enter: step(m, i, lambda dtype: enter(FP16)), 6, recordings, (FP16,))


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)


# --- strings that change every call -----------------------------------------------------------


class Tagged(nn.Module):
    """Called with a batch dict holding the samples' file names and a tag: strings that
    change every call and pick nothing; ``head`` picks one of two heads by name."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.heads = nn.ModuleDict({"cls": nn.Linear(32, 4), "wide": nn.Linear(32, 8)})

    def forward(self, batch: dict[str, Any], tag: str = "", head: str = "cls") -> torch.Tensor:
        return self.heads[head](self.body(batch["x"]))


def _batch(i: int) -> dict[str, Any]:
    return {"x": torch.randn(8, 16), "paths": [f"/data/{i:05d}-{j}.png" for j in range(8)]}


def test_strings_that_change_every_call_are_held_by_type_after_two_recordings(
    recordings: list[Any], measuring: Any
) -> None:
    """File names in a batch and a tag, new every call: before, every call was a new
    signature, recorded (the global hooks and a dispatch mode on every op: 1.4-1.5 x a
    settled call, sweep 7) and the program store churned; now, as a number that changes
    every call (``_loose.loosen``), a string whose recordings give the same program is held
    by type.  A string that picks a path (``head``) gives another program: still by value."""
    torch.manual_seed(0)
    model = Tagged()
    for i in range(4):  # measured (the fake clock), programs recorded
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            model(_batch(i), tag=f"step {i}").float().sum().backward()
    recordings.clear()
    for i in range(4, 16):
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            model(_batch(i), tag=f"step {i}").float().sum().backward()
    assert len(recordings) <= 2, f"{len(recordings)} recordings in 12 calls"
    for i in range(16, 34):  # another head by name: its own programs and loose signature
        if i == 28:
            recordings.clear()
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            out = model(_batch(i), tag=f"step {i}", head="wide" if i % 2 else "cls")
        assert out.shape[1] == (8 if i % 2 else 4)
        out.float().sum().backward()
    assert recordings == [], f"{len(recordings)} recordings in the last 6 calls"


def test_a_string_that_picks_a_path_still_matches_the_fixed_precision(recordings: list[Any]) -> None:
    """Tags and file names held by type must not let a head picked by name run another's
    program: the string picking the head, new values of it appearing late."""

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        head = ("cls", "cls", "wide", "cls", "wide", "wide")[i]
        return _train(m, _batch(i), enter, tag=f"step {i}", head=head)

    run(Tagged, step, 6, recordings, (BF16,))


class Weighted(nn.Module):
    """Called with plain data the guard could not describe before: numpy values (as a data
    loader without tensor conversion gives them: a ``numpy.float32`` temperature, an array
    of per-sample weights), a ``torch.Generator`` for its noise, a ``pathlib.Path``, a
    ``slice`` and a ``range``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor, weights: Any, temperature: Any, **plain: Any) -> torch.Tensor:
        if plain.get("generator") is not None:
            x = x + 0.1 * torch.randn(x.shape, generator=plain["generator"])
        out = self.body(x[plain.get("rows", slice(None))]) * torch.from_numpy(weights)[:, None].to(x.dtype)
        return out / float(temperature)


def _numpy_args(i: int) -> tuple[Any, Any]:
    np = pytest.importorskip("numpy")
    return np.linspace(0.5, 1.5, 8, dtype=np.float32) + i / 100, np.float32(1.0 + i / 100)


def test_numpy_and_other_plain_arguments_settle(recordings: list[Any], measuring: Any) -> None:
    """Before, the guard could not describe a numpy scalar or array, a generator, a path, a
    slice or a range (no ``__dict__``): every call applied the plan call by call (the global
    hooks on every module call: 1.24-1.28 x float32 where a settled call is 1.07, on 24
    small Linear layers).  Now an array is held like a tensor (shape, dtype), a numpy scalar
    as a Python number (by type once it changes every call), a generator by its device (its
    state is data), the others by value."""
    torch.manual_seed(0)
    model, x, g = Weighted(), torch.randn(8, 16), torch.Generator().manual_seed(0)
    plain = {"generator": g, "path": pathlib.Path("/data/run-1"), "rows": slice(0, 8), "steps": range(3)}
    for i in range(16):
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            model(x, *_numpy_args(i), **plain).float().sum().backward()
    assert len(recordings) <= 4, f"{len(recordings)} recordings in 16 calls"
    recordings.clear()
    for i in range(16, 22):
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            model(x, *_numpy_args(i), **plain).float().sum().backward()
    sig = _guard.signature((x, *_numpy_args(21)), plain, model)
    assert sig is not None and isinstance(_store.program_for(model, sig, ampcore.auto_plan("cpu", BF16)), Program)
    assert recordings == []
    other = _guard.signature((x, _numpy_args(0)[0][:4], _numpy_args(0)[1]), None)
    assert other is not None and other != _guard.signature((x, *_numpy_args(0)), None)  # (the array's shape)


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "given"])
def test_numpy_and_other_plain_arguments_match_the_fixed_precision(
    measured: bool, request: Any, recordings: list[Any]
) -> None:
    """(Measured: the whole-call check runs the root again; the generator it is given must
    draw the same noise in the real call as in the fixed precision's.)"""
    if measured:
        request.getfixturevalue("measuring")
    x = torch.randn(8, 16)

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        weights, temperature = _numpy_args(i)
        g = torch.Generator().manual_seed(i)
        return _train(m, x, enter, weights=weights, temperature=temperature, generator=g, rows=slice(0, 8))

    run(Weighted, step, 6, recordings, (BF16,), measured=measured)


class Noisy(nn.Module):
    """Noise drawn from a generator the model holds (``self.gen``), as a sampler would."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        self.gen = torch.Generator().manual_seed(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x + 0.1 * torch.randn(x.shape, generator=self.gen))


def test_a_generator_the_model_holds_draws_as_in_the_fixed_precision(measuring: Any, recordings: list[Any]) -> None:
    """The whole-call check runs the root again: before, each run drew from the model's own
    generator (the default generator's state was kept, not this one's), so the real call
    drew other noise than the fixed precision's (step 2 differed)."""
    x = torch.randn(8, 16)
    run(Noisy, lambda m, i, enter: _train(m, x, enter), 6, recordings, (BF16,), measured=True)
