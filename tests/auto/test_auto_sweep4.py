"""Issue 27, fourth held-out sweep of ``level="auto"``: model code from the real world and
torch features the earlier sweeps (``test_auto_sweep.py``, ``test_auto_sweep3*.py``,
``test_auto_inner.py``, ``test_auto_patterns.py``, ``test_auto_heldout_kinds.py``) did not use.

* Hugging Face (tiny configs): GPT-2 ``generate()`` with the KV cache, called twice; a T5
  and a BART encoder-decoder forward with labels; tied word embeddings;
* ``torch.func.functional_call`` (the same and new parameters each step) and ``torch.vmap``
  over a model; a custom ``torch.autograd.Function``; ``torch.nn.utils.parametrize``
  (orthogonal, a custom parametrization) and ``spectral_norm``; ``torch.utils.checkpoint``
  (``use_reentrant=False``) around a submodule; complex parameters and intermediates; a
  ``channels_last`` model; a ``__torch_function__`` subclass input; an ``nn.ModuleDict``
  routed by a string argument; a user's forward hook on the root that changes its output
  (and a pre-hook that changes its input on some steps); a root whose forward raises on
  some steps (also in its whole-call check).

Each case runs with :func:`test_auto_sweep3.run`: its steps under auto (a plan loaded) equal
them under the fixed precision the plan gives (outputs, dtypes, gradients, parameters),
nothing of auto is left after each step, and the same steps again record nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, _backward, _mlp, _train, _wide, counting, fixed, run
from test_auto_sweep3_models import _Clock
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

import ampcore

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    return counting(monkeypatch)


# --- (1) Hugging Face models ----------------------------------------------------------------


def _gpt2(n_embd: int = 16, **config: Any) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=n_embd, n_layer=2, n_head=2, **config)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_gpt2_generate_with_the_kv_cache_called_twice(recordings: list[Any]) -> None:
    """Greedy decoding, a few tokens, under ``torch.no_grad`` (generate's own); the lm_head
    (16 inputs) float32, the rest of GPT-2 (transformers' Conv1D: addmm) the O1 lists."""
    ids = torch.randint(0, 64, (2, 5))

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=4,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        return out.sequences, out.scores

    run(_gpt2, step, 2, recordings)


def test_gpt2_with_tied_word_embeddings_trains(recordings: list[Any]) -> None:
    """``lm_head.weight`` is ``wte.weight``: its gradient sums both uses."""
    ids = torch.randint(0, 64, (2, 6))

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        model.train()
        with enter(BF16):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss, out.logits

    model = run(
        lambda: _gpt2(tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), step, 3, recordings
    )
    assert model.lm_head.weight is model.transformer.wte.weight


def _t5() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(cfg)


def _bart() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BartForConditionalGeneration(cfg)


@pytest.mark.parametrize("make", [_t5, _bart], ids=["t5", "bart"])
def test_an_encoder_decoder_forward_with_labels(make: Any, recordings: list[Any]) -> None:
    src, labels = torch.randint(1, 64, (2, 7)), torch.randint(1, 64, (2, 5))

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = model(input_ids=src, attention_mask=torch.ones_like(src), labels=labels)
        out.loss.backward()
        return out.loss, out.logits

    run(make, step, 3, recordings)


# --- (2) torch.func ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        "same",
        "new-each-step",
        "alternating-with-its-own",
        "new-bf16-each-step",
        "bf16-alternating",
        "new-each-call-under-grad",
    ],
)
def test_functional_call_over_a_model(params: str, recordings: list[Any]) -> None:
    """``functional_call`` swaps the model's parameters for the call: the same tensors each
    step, new ones (fast weights of meta-learning; in bfloat16: the O1 lists), every other
    step the model's own, or under ``torch.func.grad``."""
    x = torch.randn(8, 16)
    given: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def weights(model: nn.Module, i: int) -> dict[str, torch.Tensor]:
        key = (id(model), 0 if params == "same" else i)
        if key not in given:
            dtype = BF16 if "bf16" in params else torch.float32
            given[key] = {n: (p * (1 + i / 8)).to(dtype).detach().requires_grad_() for n, p in model.named_parameters()}
        return given[key]

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        if params in ("alternating-with-its-own", "bf16-alternating") and i % 2:
            return _train(model, x, enter)
        p = weights(model, i)
        if params == "new-each-call-under-grad":
            with enter(BF16):
                grads = torch.func.grad(lambda q: torch.func.functional_call(model, q, (x,)).float().square().sum())(p)
            return [grads[n] for n in sorted(grads)]
        with enter(BF16):
            out = torch.func.functional_call(model, p, (x,))
        _backward(out)
        return out, [p[n].grad for n in sorted(p)]

    run(_wide, step, 4, recordings)


def test_load_state_dict_with_assign_in_float32_every_step(recordings: list[Any]) -> None:
    """New float32 parameters every step (``assign=True``: the state's tensors) keep the
    program; the optimizer would hold the old ones, so the gradients are compared."""
    x = torch.randn(8, 16)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        state = {k: v.detach().clone() * (1 + i / 8) for k, v in model.state_dict().items()}
        model.load_state_dict(state, assign=True)
        return _train(model, x, enter)

    run(_wide, step, 3, recordings)


def test_vmap_over_a_model(recordings: list[Any]) -> None:
    x = torch.randn(3, 8, 16)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = torch.vmap(model)(x)
        _backward(out)
        return out

    run(_mlp, step, 3, recordings)


def test_vmap_over_an_ensemble_with_functional_call(recordings: list[Any]) -> None:
    models = [_mlp() for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    x = torch.randn(8, 16)

    class Ensemble(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = _mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
                return torch.func.functional_call(self.base, (p, b), (x,))

            return torch.vmap(one)(params, buffers)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            return model(x)

    run(Ensemble, step, 3, recordings)


# --- (3) autograd and parametrizations --------------------------------------------------


class Clamp(torch.autograd.Function):
    """A straight-through clamp: forward clamps, backward passes the gradient (scaled)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 0.5


class WithFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(Clamp.apply(self.a(x)))


def test_a_custom_autograd_function_in_the_forward(recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    run(WithFunction, lambda m, i, enter: _train(m, x, enter), 3, recordings)


class Symmetric(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w.triu() + w.triu(1).transpose(-1, -2)


def _parametrized(kind: str) -> nn.Module:
    model = _wide()
    for layer in (model[1], model[3]):  # a float32 one and the low one (16 -> 32)
        if kind == "orthogonal":
            nn.utils.parametrizations.orthogonal(layer)
        elif kind == "spectral_norm":
            nn.utils.parametrizations.spectral_norm(layer)
        elif layer.in_features == layer.out_features:
            nn.utils.parametrize.register_parametrization(layer, "weight", Symmetric())
        else:
            nn.utils.parametrize.register_parametrization(layer, "bias", nn.Tanh())
    return model


@pytest.mark.parametrize("kind", ["orthogonal", "custom", "spectral_norm"])
def test_parametrized_layers(kind: str, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    run(lambda: _parametrized(kind), lambda m, i, enter: _train(m, x, enter), 3, recordings)


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head, self.body, self.tail = nn.Linear(16, 16), _mlp(), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, reference: bool = False) -> torch.Tensor:
        body = self.body
        if reference:  # the fixed precision: the checkpoint's calls as its recompute runs them (no hooks)
            body = ampcore.autocast("cpu", level="O1")(body)
        h = torch.utils.checkpoint.checkpoint(body, self.head(x), use_reentrant=False)
        return self.tail(h)


def test_checkpoint_without_reentrant_around_a_submodule(recordings: list[Any]) -> None:
    """The checkpointed body's planned calls follow the autocast state at the checkpoint's
    entry (its recompute in backward runs without module hooks): its float32-decided first
    layer runs low there, the head outside it float32."""
    x = torch.randn(8, 16)
    run(Checkpointed, lambda m, i, enter: _train(m, x, enter, reference=enter is fixed), 3, recordings)


# --- (4) dtypes and layouts -------------------------------------------------------------


class Spectral(nn.Module):
    """Complex intermediates (an FFT and a complex weight) between real Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(17, 4)
        self.w = nn.Parameter(torch.randn(17, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.fft.rfft(self.a(x).float(), dim=-1) * self.w
        return self.b(f.abs())


class ComplexLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.c = nn.Linear(32, 32, dtype=torch.complex64)
        self.b = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.c(self.a(x).float().to(torch.complex64)).real)


@pytest.mark.parametrize("make", [Spectral, ComplexLinear], ids=["complex-intermediates", "complex-linear"])
def test_complex_parameters_and_intermediates(make: Any, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    run(make, lambda m, i, enter: _train(m, x, enter), 3, recordings)


def _convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)
    ).to(memory_format=torch.channels_last)


def test_a_channels_last_model(recordings: list[Any]) -> None:
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    run(_convnet, lambda m, i, enter: _train(m, x, enter), 3, recordings)


class Logged(torch.Tensor):
    """A ``__torch_function__`` subclass (as a tracing or a units library makes)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        Logged.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_torch_function_subclass_input(recordings: list[Any]) -> None:
    x = torch.randn(8, 16).as_subclass(Logged)
    run(_mlp, lambda m, i, enter: _train(m, x, enter), 3, recordings)
    assert Logged.calls > 0


# --- (5) routing, hooks, exceptions -----------------------------------------------------


class Routed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleDict(
            {"fast": nn.Linear(16, 4), "big": nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))}
        )
        self.stem = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, task: str) -> torch.Tensor:
        return self.heads[task](self.stem(x))


def test_a_module_dict_routed_by_a_string_argument(recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    tasks = ["fast", "big", "big", "fast"]

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = model(x, tasks[i])
        _backward(out)
        return out

    run(Routed, step, len(tasks), recordings)


@pytest.mark.parametrize("make", [_mlp, _wide], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("change", ["scale", "float", "dict"])
def test_a_user_forward_hook_on_the_root_changes_its_output(make: Any, change: str, recordings: list[Any]) -> None:
    def hook(module: nn.Module, args: Any, out: torch.Tensor) -> Any:
        if change == "scale":
            return out * 2 + 1
        if change == "float":
            return out.float()
        return {"out": out, "relu": out.relu()}

    def made() -> nn.Module:
        model = make()
        model.register_forward_hook(hook)
        return model

    x = torch.randn(8, 16)
    run(made, lambda m, i, enter: _train(m, x, enter), 3, recordings)


class Flaky(nn.Module):
    """Raises on the steps it is told to, after its first layer ran (a data check)."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.body = make()
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body[0](x)
        if self.fail:
            raise ValueError("bad batch")
        return self.body[1:](h)


@pytest.mark.parametrize("make", [_mlp, _wide], ids=["low-default", "fp32-default"])
def test_a_root_whose_forward_raises_on_some_steps(make: Any, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)
    fails = [True, False, True, False, True]

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        model.fail = fails[i]
        with contextlib.suppress(ValueError), enter(BF16):
            out = model(x)
            _backward(out)
            return out
        return None

    run(lambda: Flaky(make), step, len(fails), recordings)


# --- measured: the sweep's cases where the plan is measured in the first steps ------------


def _measured_cases() -> dict[str, tuple[Any, Any]]:
    x, image = torch.randn(8, 16), torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    src, labels = torch.randint(1, 64, (2, 7)), torch.randint(1, 64, (2, 5))
    fresh: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def params(m: nn.Module, i: int) -> dict[str, torch.Tensor]:
        key = (id(m), i % 2)
        if key not in fresh:
            fresh[key] = {n: (p * (1 + i / 8)).detach().requires_grad_() for n, p in m.named_parameters()}
        return fresh[key]

    def functional(m: nn.Module, i: int, enter: Enter) -> Any:
        p = params(m, i)
        with enter(BF16):
            out = torch.func.functional_call(m, p, (x,))
        _backward(out)
        return out, [p[n].grad for n in sorted(p)]

    def per_sample_grads(m: nn.Module, i: int, enter: Enter) -> Any:
        p = {n: q.detach() for n, q in m.named_parameters()}

        def loss(q: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(m, q, (xi.unsqueeze(0),)).float().square().sum()

        with enter(BF16):
            grads = torch.vmap(torch.func.grad(loss), in_dims=(None, 0))(p, x)
        return [grads[n] for n in sorted(grads)]

    def jacobians(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            func = torch.func.jacrev(lambda xi: m(xi).float())(x[:2])
            graph = torch.autograd.functional.jacobian(lambda xi: m(xi).float(), x[:2])
        return func, graph

    def vmapped(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = torch.vmap(m)(x.view(2, 4, 16))
        _backward(out)
        return out

    def seq2seq(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            out = m(input_ids=src, attention_mask=torch.ones_like(src), labels=labels)
        out.loss.backward()
        return out.loss, out.logits

    def generate(m: nn.Module, i: int, enter: Enter) -> Any:
        with enter(BF16):
            return m.generate(src, max_new_tokens=3, do_sample=False, pad_token_id=0)

    def train(m: nn.Module, i: int, enter: Enter) -> Any:
        return _train(m, x, enter)

    def tied_functional(m: nn.Module, i: int, enter: Enter) -> Any:  # (tie_weights: one tensor, both uses)
        p = {n: (q * (1 + i / 8)).detach().requires_grad_() for n, q in m.named_parameters()}
        with enter(BF16):
            out = torch.func.functional_call(m, p, (), {"input_ids": src, "labels": src})
        out.loss.backward()
        return out.logits, [p[n].grad for n in sorted(p)]

    def flaky(m: nn.Module, i: int, enter: Enter) -> Any:
        m.fail = i in (1, 3)
        with contextlib.suppress(ValueError):
            return _train(m, x, enter)
        return None

    def hooked() -> nn.Module:
        model = _mlp()
        model.register_forward_hook(lambda mod, args, out: out.float() * 2)
        return model

    return {
        "functional-call": (_wide, functional),
        "per-sample-grads": (_mlp, per_sample_grads),
        "vmap": (_mlp, vmapped),
        "jacobians": (_mlp, jacobians),
        "tied-functional": (lambda: _gpt2(32, tie_word_embeddings=True), tied_functional),
        "autograd-function": (WithFunction, train),
        "orthogonal": (lambda: _parametrized("orthogonal"), train),
        "spectral-norm": (lambda: _parametrized("spectral_norm"), train),
        "checkpoint": (Checkpointed, lambda m, i, enter: _train(m, x, enter, reference=enter is fixed)),
        "complex": (Spectral, train),
        "channels-last": (_convnet, lambda m, i, enter: _train(m, image, enter)),
        "subclass-input": (_mlp, lambda m, i, enter: _train(m, x.as_subclass(Logged), enter)),
        "t5": (_t5, seq2seq),
        "raises": (lambda: Flaky(_mlp), flaky),
        "routed": (Routed, lambda m, i, enter: _train(m, x, enter, task=("fast", "big")[i % 2])),
        "root-hook": (hooked, train),
        "gpt2-generate": (lambda: _gpt2(32), generate),
    }


@pytest.mark.parametrize("case", list(_measured_cases()))
def test_measured_cases_match_the_fixed_precision(case: str, measuring: _Clock, recordings: list[Any]) -> None:
    """The first steps measure the classes decided low (and check mixed programs as a
    whole): outputs, gradients and parameters equal the fixed precision; settled steps record
    nothing.  Inside a ``torch.func`` transform nothing is timed (its tensors are wrapped:
    before, the measurement's ``requires_grad_`` raised out of the user's ``vmap``): those
    classes run with the O1 lists until a call outside one measures them."""
    make, step = _measured_cases()[case]
    run(make, step, 6, recordings, measured=True)
    if case in ("vmap", "per-sample-grads"):
        assert measuring.labels == [], measuring.labels
    else:
        assert "low" in measuring.labels, measuring.labels


def test_a_class_met_inside_vmap_is_measured_by_a_call_outside(measuring: _Clock, recordings: list[Any]) -> None:
    """The same shapes inside ``vmap`` (per sample: 8 x 16 of an 8 x 8 x 16 batch) and
    outside, at one place in the code: the call outside measures (every class low; before,
    it ran the program recorded inside, whose classes then were never measured), the
    program inside records again once and then runs as torch.autocast does there (which
    leaves vmapped CPU calls in float32)."""
    model, x = _mlp(), torch.randn(8, 8, 16)
    with torch.autocast("cpu", dtype=BF16):
        want = torch.vmap(model)(x)
    for i in range(6):
        if i == 3:
            recordings.clear()
        with ampcore.autocast("cpu", level="auto"):
            out = model(x[0]) if i == 1 else torch.vmap(model)(x)
        assert ("low" in measuring.labels) == (i >= 1), (i, measuring.labels)
        if i != 1:
            torch.testing.assert_close(out, want, rtol=0, atol=0)
            assert out.dtype == want.dtype
    assert recordings == [], recordings


def test_a_root_that_raises_in_its_whole_call_check_is_checked_at_its_next_call(
    measuring: _Clock, recordings: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixed program's whole-call check (its first layer float32, the others measured low)
    falls on a step whose forward raises (a bad batch): the real call raises too, and the
    next good step checks it.  Before, the error was taken for a forward that cannot run
    again: the check was given up for good (a warning said so) and the program ran
    unchecked."""
    from ampcore._auto import Costs, _verify
    from ampcore._auto._shapes import shape_class

    given_up: list[Exception] = []
    monkeypatch.setattr(_verify, "_unrepeatable", lambda root, exc: given_up.append(exc))
    model, x = Flaky(_mlp), torch.randn(8, 16)
    ampcore.auto_plan("cpu").set(shape_class(model.body[0], (x,), "cpu"), Costs(1.0, 4.0, 0.1), source="given")
    for i in range(9):
        model.fail = i in (1, 3)  # step 3: the first call of the settled signature (its check)
        if i == 6:
            recordings.clear()
        with contextlib.suppress(ValueError), ampcore.autocast("cpu", level="auto"):
            _backward(model(x))
        assert ("root-plan" in measuring.labels) == (i >= 4), (i, measuring.labels)
    assert given_up == []
    assert recordings == []  # settled


@pytest.mark.parametrize("make", [_mlp, _wide], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("change", ["bf16-some-steps", "batch-some-steps"])
def test_a_user_forward_pre_hook_on_the_root_changes_its_input(make: Any, change: str, recordings: list[Any]) -> None:
    """The root's signature is taken before the user's pre-hook runs (the sentinel is a
    global pre-hook): a hook that, by state of its own, casts the input or doubles the batch
    on some steps."""

    def made() -> nn.Module:
        model = make()
        model.calls = 0  # (on the module: copies count their own calls)

        def hook(module: nn.Module, args: tuple[Any, ...]) -> Any:
            module.calls += 1
            if module.calls % 2:
                return None
            (x,) = args
            return (x.to(BF16),) if change == "bf16-some-steps" else (torch.cat([x, x]),)

        model.register_forward_pre_hook(hook)
        return model

    x = torch.randn(8, 16)
    run(made, lambda m, i, enter: _train(m, x, enter), 4, recordings)
