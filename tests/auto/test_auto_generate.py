"""Issue 27 (tenth stop): GPT-2 ``generate()`` inside a ``level="auto"`` region.

Two causes kept it at 1.85 x min(fp32, torch.autocast), call by call on every decoding step:

1. the decoding calls pass a ``transformers`` ``DynamicCache`` (an object holding lists of
   layers whose key and value tensors grow every step), which the guard could not see: no
   program.  The guard now reads an object holding plain data (:func:`_guard._state`), its
   tensors by shape class, so a cache growing one token a step keeps its signature within
   a power-of-two bucket, and the whole-call check runs the forward on copies of it;
2. ``transformers``' ``Conv1D`` (``torch.addmm(bias, x, weight)``) was not a planned kind:
   a class whose forward is one product with its own matrix is now found by its ops at its
   first call (:mod:`ampcore._auto._kinds`) and planned as ``Linear``.

Each test failed before its fix.  The Conv1D-like module here is written in the test (no
``transformers``); the GPT-2 tests skip without ``transformers``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, counting, fixed  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, _clean, load
from test_auto_sweep3_models import _Clock
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

import ampcore
from ampcore._auto import _guard, _program, _shapes, _store, _verify
from ampcore._auto._shapes import planned_ops, shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class AddmmLayer(nn.Module):
    """A layer as ``transformers.pytorch_utils.Conv1D``: weight ``[in, out]``, one ``addmm``."""

    def __init__(self, nx: int, nf: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size)


class MatmulLayer(nn.Module):
    """``x @ weight + bias``: a product with its own matrix, then its bias added."""

    def __init__(self, nx: int, nf: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class TwoProducts(nn.Module):
    """Two products and a nonlinearity: not a plain product (left to the O1 lists)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.weight) @ self.weight


class Scaled(nn.Module):
    """A matrix that is not multiplied (an elementwise scale): not a product kind."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight[0]


def _auto() -> Any:
    return ampcore.autocast("cpu", level="auto")


@pytest.fixture(autouse=True)
def _unwatched() -> Any:
    """The test's layer classes met anew (the kinds found are kept per class, process-wide)."""
    classes = (AddmmLayer, MatmulLayer, TwoProducts, Scaled)
    for cls in classes:
        _shapes._BY_TYPE.pop(cls, None)
    yield
    for cls in classes:
        _shapes._BY_TYPE.pop(cls, None)


# --- (2) a Conv1D-like layer is planned -------------------------------------------------------


@pytest.mark.parametrize("layer", [AddmmLayer, MatmulLayer])
def test_a_layer_whose_forward_is_one_product_with_its_weight_is_planned(layer: type[nn.Module]) -> None:
    """Before: never planned (not a planned type), so it ran bfloat16 as under torch.autocast
    whatever its measurements said.  Now its first call in an auto region is watched, and the
    next ones are planned: a float32 decision switches it (float32 output)."""
    torch.manual_seed(0)
    model = nn.Sequential(layer(16, 32), nn.ReLU(), nn.Linear(32, 8))  # type: ignore[call-arg]
    x = torch.randn(4, 16)
    assert planned_ops(model[0]) is None  # not planned by its type
    with _auto():
        model(x)  # watched
    _clean(model)
    assert planned_ops(model[0]) == _shapes.MATMUL[1]
    with torch.autocast("cpu", dtype=BF16):
        key = shape_class(model[0], (x,), "cpu")
    assert key is not None and key.startswith(f"{layer.__name__}(weight=16x32, bias=32) in=[4x16]")
    load(BF16, {key: "fp32", shape_class(model[2], (torch.zeros(4, 32),), "cpu") or "": "low"})
    for _ in range(3):
        with fixed(BF16):
            want = model(x)
        with _auto():
            got = model(x)
        _clean(model)
        assert got.dtype == want.dtype == BF16
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    seen: list[torch.dtype] = []
    handle = model[0].register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    with _auto():
        model(x)
    handle.remove()
    assert seen == [torch.float32]  # switched: its program runs it in float32


@pytest.mark.parametrize("layer", [TwoProducts, Scaled])
def test_a_layer_that_does_more_than_one_product_is_not_planned(layer: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(layer(16), nn.Linear(16, 4))  # type: ignore[call-arg]
    with _auto():
        model(torch.randn(4, 16))
    _clean(model)
    assert planned_ops(model[0]) is None and _shapes.known_kind(layer) is None


def test_a_planned_product_layer_is_measured_with_warm_up_and_spread(measuring: _Clock) -> None:
    """Its classes are measured as Linear's are: warmed up (the first runs untimed), then
    rounds of both sides, with their spread and count in the plan."""
    torch.manual_seed(0)
    model = nn.Sequential(AddmmLayer(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    for _ in range(3):
        with _auto():
            model(x)
        _clean(model)
    plan = ampcore.auto_plan("cpu", BF16)
    mine = [e for key, e in plan.entries.items() if key.startswith("AddmmLayer(")]
    assert len(mine) == 1 and mine[0].source == "measured" and mine[0].decision == "low"  # the clock's: 1 ms low
    costs = mine[0].costs
    assert costs is not None and costs.runs >= 2 and costs.low_spread >= 0.0
    assert measuring.labels.count("fp32") == measuring.labels.count("low") >= 3  # warm-up + rounds


# --- (1) the guard reads a cache object ---------------------------------------------------------


class Layer:
    """A cache layer: keys and values that grow along dimension -2 (as transformers' DynamicLayer)."""

    def __init__(self, keys: torch.Tensor | None = None) -> None:
        self.keys = keys
        self.values = None if keys is None else keys.clone()
        self.is_initialized = keys is not None


class Cache:
    """A KV cache object: a list of layers, updated by the forward."""

    def __init__(self, layers: int, length: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        self.layers = [
            Layer(torch.zeros(1, 2, length, 4, dtype=dtype, device=device) if length else None) for _ in range(layers)
        ]
        self.offloading = False


def test_a_cache_object_is_guarded_by_type_state_and_shape_classes() -> None:
    sig = _guard.signature
    x = torch.zeros(1, 1, 8)
    same = [sig((x,), {"cache": Cache(2, n)}) for n in (9, 12, 16)]
    assert same[0] is not None and same[0] == same[1] == same[2]  # one bucket: 16
    assert sig((x,), {"cache": Cache(2, 17)}) != same[0]  # the next bucket
    assert sig((x,), {"cache": Cache(2, 9, BF16)}) != same[0]  # a dtype
    assert sig((x,), {"cache": Cache(2, 9, device="meta")}) != same[0]  # a device
    assert sig((x,), {"cache": Cache(3, 9)}) != same[0]  # more layers
    assert sig((x,), {"cache": Cache(2, 0)}) != same[0]  # empty (prefill): None held
    other = Cache(2, 9)
    other.offloading = True
    assert sig((x,), {"cache": other}) != same[0]  # a flag's value
    kind = Cache(2, 9)
    kind.kind = Layer  # type: ignore[attr-defined]  # a class it holds (DynamicCache(): its kind of layer)
    assert sig((x,), {"cache": kind}) is not None and sig((x,), {"cache": kind}) != same[0]


def test_what_the_guard_cannot_read_is_still_call_by_call() -> None:
    """Callables (but functions defined at a module's level and builtins: by identity since
    the twelfth sweep), objects without a ``__dict__`` and objects beyond the cap: None."""
    x = torch.zeros(2)

    class Big:
        def __init__(self) -> None:
            self.items = [torch.zeros(1)] * (_guard._HELD_MAX + 1)

    class Loop:
        def __init__(self) -> None:
            self.me = self

    class Slots:
        __slots__ = ("a",)

    assert _guard.signature((x, functools.partial(print)), None) is None
    assert _guard.signature((x, print), None) is not None  # (held by identity: test_auto_sweep12_args.py)
    assert _guard.signature((x, nn.Linear(2, 2)), None) is None
    assert _guard.signature((x, Slots()), None) is None
    assert _guard.signature((x, Big()), None) is None
    assert _guard.signature((x, Loop()), None) is None  # a cycle spends the cap
    assert _guard.signature((x, lambda: 0), None) is None


def test_the_whole_call_check_runs_on_copies_of_a_cache_the_forward_grows() -> None:
    """A check's runs must not grow (or write into) the cache the real call gets after it."""
    cache = Cache(2, 3)
    copied = _verify._fresh(({"cache": cache},))[0]["cache"]
    assert copied is not cache and copied.layers is not cache.layers and copied.layers[0] is not cache.layers[0]
    copied.layers[0].keys.add_(1.0)  # a static cache writes in place: the original's tensors are not its
    copied.layers[0].keys = torch.cat([copied.layers[0].keys, copied.layers[0].keys], dim=-2)
    assert cache.layers[0].keys.shape[-2] == 3 and float(cache.layers[0].keys.abs().sum()) == 0.0


class Decoder(nn.Module):
    """A tiny decoder with a KV cache object: two AddmmLayer projections and an attention
    product outside planned modules, ``forward(ids, cache=...)`` growing the cache."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.qkv = AddmmLayer(16, 48)
        self.out = AddmmLayer(16, 16)
        self.head = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor, cache: Cache) -> torch.Tensor:
        h = self.embed(ids)
        q, k, v = self.qkv(h).split(16, dim=-1)
        layer = cache.layers[0]
        layer.keys = k if layer.keys is None else torch.cat([layer.keys, k], dim=1)
        layer.values = v if layer.values is None else torch.cat([layer.values, v], dim=1)
        att = torch.softmax(q @ layer.keys.transpose(1, 2) / 4.0, dim=-1) @ layer.values
        return self.head(self.out(att) + h)  # type: ignore[no-any-return]


def _decode(model: nn.Module, enter: Any, steps: int = 10) -> list[torch.Tensor]:
    ids, cache, outs = torch.tensor([[1, 2, 3]]), Cache(1, 0), []
    for _ in range(steps):
        with enter():
            logits = model(ids, cache=cache)
        outs.append(logits)
        ids = logits[:, -1:].float().argmax(-1)
    return outs


def test_decoding_with_a_cache_object_settles_and_equals_the_plans_fixed_choice(
    measuring: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every decoding call ran call by call (the cache was invisible), and the
    product layers in bfloat16 whatever the plan said.  Now the cache's length is a shape
    class: the fourth decoding pass records nothing, and every step equals the plan's fixed
    choice (fixed: each planned call in its plan's precision, torch.autocast elsewhere).
    The prefill's first call (the root met for the first time: its keyword arguments are
    seen only at its end, the cache grown by then) gives no program: recorded at its next call."""
    measuring.ms.update({"fp32": 1.0, "low": 4.0})  # float32 wins every class (as on this CPU)
    measuring.ms.update({"root-plan": 1.0, "root-low": 2.0, "root-fp32": 3.0})  # the program wins its check
    torch.manual_seed(0)
    model = Decoder().eval()
    made = counting(monkeypatch)
    with torch.no_grad():
        for _ in range(3):  # 1: the layers' class watched (prefill), decoding measured and recorded;
            # 2: the prefill's classes measured; 3: the prefill recorded
            _decode(model, _auto)
        _clean(model)
        made.clear()
        got = _decode(model, _auto)
        _clean(model)
        assert made == [], f"{len(made)} recordings in a settled decoding pass"
        want = _decode(model, lambda: fixed(BF16))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    programs = [p for p in _store._programs.get(model, {}).values() if isinstance(p, _program.Program)]
    assert programs and all(p.switched or p.default_fp32 for p in programs)  # the float32 decisions apply


def _gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers", reason="the GPT-2 generate tests need transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    cfg.bos_token_id = cfg.eos_token_id = None
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _generate(model: nn.Module, enter: Any, ids: torch.Tensor) -> Any:
    with enter():
        out = model.generate(
            ids,
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    return out.sequences, out.scores


@pytest.mark.parametrize("fp32_wins", [True, False])
def test_gpt2_generate_settles_and_equals_the_plans_fixed_choice(
    measuring: _Clock, monkeypatch: pytest.MonkeyPatch, fp32_wins: bool
) -> None:
    """Repeated ``generate()`` calls: recordings stop after the first calls; every call's
    tokens and scores equal the plan's fixed choice; where the plan is low everywhere (the
    whole-call check too), they equal torch.autocast's."""
    if fp32_wins:
        measuring.ms.update({"fp32": 1.0, "low": 4.0})
    else:  # low everywhere: the O1 lists win every check
        measuring.ms.update({"root-plan": 2.0, "root-low": 1.0, "root-fp32": 3.0})
    model = _gpt2()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    made = counting(monkeypatch)
    for _ in range(3):
        _generate(model, _auto, ids)
        _clean(model)
    made.clear()
    got = _generate(model, _auto, ids)
    _clean(model)
    assert made == [], f"{len(made)} recordings in a settled generate() call"
    decoding = [p for sig, p in _store._programs[model].items() if _guard.holds_objects(sig)]
    assert sum(isinstance(p, _program.Program) for p in decoding) >= 2  # programs, not call by call
    conv1d = model.transformer.h[0].attn.c_attn  # type: ignore[union-attr,index]
    assert planned_ops(conv1d) == _shapes.MATMUL[1]  # transformers' Conv1D: planned by its ops
    references = [lambda: fixed(BF16)] + ([] if fp32_wins else [lambda: torch.autocast("cpu", dtype=BF16)])
    for enter in references:
        want = _generate(model, enter, ids)
        assert torch.equal(got[0], want[0])
        for g, w in zip(got[1], want[1], strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_a_new_roots_first_call_keys_no_program_by_the_cache_it_grew(monkeypatch: pytest.MonkeyPatch) -> None:
    """A root met for the first time gets its keyword arguments only at its end: the cache
    then holds what the forward appended.  Before, its program was stored under that grown
    state (a signature no call enters with); now that call gives none, and its next call,
    seen at entry, records it."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
    _shapes.set_kind(AddmmLayer, _shapes.MATMUL)  # planned already: no watch in the first call
    torch.manual_seed(0)
    model = Decoder().eval()
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        entry = _guard.signature((ids,), {"cache": Cache(1, 0)}, model)
        for i in range(2):  # one place in the code: the second call finds the root marked
            with _auto():
                model(ids, cache=Cache(1, 0))
            _clean(model)
            if i == 0:
                assert [p for p in _store._programs.get(model, {}).values() if isinstance(p, _program.Program)] == []
    assert entry is not None and isinstance(_store._programs[model].get(entry), _program.Program)
