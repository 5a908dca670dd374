"""Issue 27: what a root's program must not miss inside the root call.

Four classes the sweep (``test_auto_sweep.py``) left open, each compared step after step
with the fixed precision the plan gives (its helpers: torch.autocast with each planned call
switched by hand):

* a number argument whose value changes every call (a step counter, a temperature) settles
  on one program, while a number that picks another path still gets its own;
* layers kept in plain lists, tuples and dicts (not registered submodules), or passed in as
  arguments, get the plan on every path and after being replaced;
* inner shapes that change while the root's signature does not (MoE-style routing, a slice
  by a module attribute) get their own shape class's decision;
* ``torch.utils.checkpoint`` inside the root: its recompute in backward runs with the
  autocast state of the checkpoint's entry and no module hooks, so the planned calls in
  there follow that state (else a ``CheckpointError`` or other gradients).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, tiny_bert  # noqa: F401 (fixture)
from test_auto_sweep import LOW, _auto, _classes, _clean, _fixed, _flat, _load, _plan, _same
from torch import nn

import ampcore
from ampcore._auto import _guard, _hooks, _loose, _roots, _store

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _recordings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The root calls recorded from now on (their roots' class names)."""
    seen: list[str] = []
    record = _roots._record
    monkeypatch.setattr(_roots, "_record", lambda m, *a: seen.append(type(m).__name__) or record(m, *a))
    return seen


# --- 1. a number argument whose value changes every call -------------------------------------


class Stepped(nn.Module):
    """``lin`` (float32) and ``head`` (low); a step counter and a temperature that change every
    call and a number ``path`` that picks the branch (``b``: float32)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)
        self.b = nn.Linear(16, 24)
        self.cb = nn.Linear(24, 4)

    def forward(self, x: torch.Tensor, step: int, temperature: float = 1.0, path: int = 0) -> torch.Tensor:
        if path:
            return self.cb(torch.relu(self.b(x))) * temperature
        return self.head(torch.tanh(self.lin(x)) * temperature) + (step % 2)


def _stepped() -> tuple[Stepped, torch.Tensor]:
    net, x = Stepped(), torch.randn(8, 16)
    _plan([(net.lin, (8, 16), "fp32"), (net.head, (8, 16), "low"), (net.b, (8, 16), "low"), (net.cb, (8, 24), "fp32")])
    return net, x


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_a_step_counter_and_a_temperature_settle_on_one_program(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    net, x = _stepped()

    def call(i: int) -> Any:
        return net(x, i, 0.5 + i / 8) if how == "positional" else net(x, step=i, temperature=0.5 + i / 8)

    _same(net, call, steps=4)
    seen = _recordings(monkeypatch)
    _same(net, lambda i: call(i + 100), steps=6)
    assert seen == []  # held by type: no recording (the global hooks) per step


def test_a_number_that_picks_the_path_still_gets_its_own_program(monkeypatch: pytest.MonkeyPatch) -> None:
    net, x = _stepped()
    paths = [0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1]
    _same(net, lambda i: net(x, i, 0.5, paths[i]), steps=len(paths))
    seen = _recordings(monkeypatch)
    _same(net, lambda i: net(x, i + 50, 0.5, paths[i]), steps=len(paths))
    assert seen == []
    assert net(x, 3, 0.5, 1).dtype == torch.float32  # outside a region, as plain torch


@pytest.mark.parametrize("default", ["low", "fp32"])
def test_a_step_counter_in_a_dict_that_sometimes_picks_a_path(monkeypatch: pytest.MonkeyPatch, default: str) -> None:
    """The counter is held by type after two equal recordings; every 5th step calls a layer
    the program did not see (its guard applies the plan), also after the counter was
    loosened."""

    class Every(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 16)
            self.extra = nn.Linear(16, 24)
            self.back = nn.Linear(24, 16)

        def forward(self, batch: dict[str, Any]) -> torch.Tensor:
            h = self.b(torch.tanh(self.a(batch["x"]))) * batch["scale"]
            if batch["step"] % 5 == 4:
                h = self.back(torch.relu(self.extra(h)))
            return h

    net, x = Every(), torch.randn(8, 16)
    other = "fp32" if default == "low" else "low"
    pairs = [(net.a, (8, 16), default), (net.b, (8, 16), default)]
    _plan([*pairs, (net.extra, (8, 16), other), (net.back, (8, 24), other)])
    _same(net, lambda i: net({"x": x, "step": i, "scale": 1.0 + i / 10}), steps=12)
    seen = _recordings(monkeypatch)
    _same(net, lambda i: net({"x": x, "step": 20 + i, "scale": 2.0 + i / 10}), steps=3)  # no path change
    assert seen == []


def test_a_bool_flag_is_never_held_by_type() -> None:
    net, x = _stepped()
    sig = [_guard.signature((x, i, 0.5, True), None, net) for i in range(2)]
    assert _loose.loosen(net, sig[1], {sig[0]: "P"}, lambda p: True) is not None
    flags = [_guard.signature((x, 1, 0.5, flag), None, net) for flag in (True, False)]
    assert _loose.loosen(net, flags[1], {flags[0]: "P"}, lambda p: True) is None
    assert flags[0] != flags[1] and _guard.signature((x, 7, 0.5, True), None, net) != flags[1]


def test_a_size_given_as_a_number_is_guarded_when_it_is_held_by_type() -> None:
    class Take(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
            return self.lin(x[:n]).sum(0)

    net, x = Take(), torch.randn(64, 16)
    _plan([(net.lin, (8, 16), "fp32")])  # rows 5..8 float32; 40 rows: not in the plan (the O1 lists)
    sizes = [8, 5, 7, 40, 6, 33]
    _same(net, lambda i: net(x, sizes[i]), steps=len(sizes))


# --- 2. layers in plain lists, tuples and dicts, or passed as arguments ----------------------


class Plain(nn.Module):
    """Registered ``a`` and ``ca`` (low); layers kept in a plain list, tuple and dict (float32),
    the path picked by an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.ca = nn.Linear(16, 16)
        self.layers = [nn.Linear(16, 24), nn.Linear(24, 16)]
        self.pair = (nn.Linear(16, 8),)
        self.heads = {"x": nn.Linear(16, 4), "y": nn.Linear(16, 2)}
        self.use = "x"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ca(torch.relu(self.a(x)))
        if self.use == "y":
            h = self.layers[1](torch.relu(self.layers[0](h)))
            return self.heads["y"](h).sum(1) + self.pair[0](h).sum(1)
        return self.heads["x"](h).sum(1)


def _plain() -> tuple[Plain, torch.Tensor]:
    net, x = Plain(), torch.randn(8, 16)
    pairs: list[tuple[nn.Module, tuple[int, ...], str]] = [(net.a, (8, 16), "low"), (net.ca, (8, 16), "low")]
    pairs += [(net.layers[0], (8, 16), "fp32"), (net.layers[1], (8, 24), "fp32"), (net.pair[0], (8, 16), "fp32")]
    pairs += [(net.heads["x"], (8, 16), "fp32"), (net.heads["y"], (8, 16), "fp32")]
    _plan(pairs)
    return net, x


def test_layers_in_plain_containers_get_the_plan_on_a_path_the_recording_did_not_see() -> None:
    net, x = _plain()
    uses = ["x", "x", "y", "x", "y", "y", "x"]

    def call(i: int) -> Any:
        net.use = uses[i]
        return net(x)

    _same(net, call, steps=len(uses))


@pytest.mark.parametrize("how", ["item", "attribute", "dict-item"])
def test_a_layer_replaced_in_a_plain_container_records_again(how: str) -> None:
    net, x = _plain()
    _same(net, lambda i: net(x), steps=2)
    old = net.heads["x"]  # still referenced: not collected, so only the container shows it
    if how == "item":
        net.heads["x"] = nn.Linear(16, 4)  # the same class: float32
    elif how == "attribute":
        net.heads = {"x": nn.Linear(16, 4), "y": net.heads["y"]}
    else:
        net.heads.update(x=nn.Linear(16, 4))
    _same(net, lambda i: net(x), steps=3)
    assert old is not net.heads["x"]


def test_a_layer_in_a_plain_list_converted_to_low_precision_is_seen() -> None:
    net, x = _plain()
    net.use = "y"
    _same(net, lambda i: net(x), steps=2)
    net.layers[1].to(LOW)  # cannot run in float32 any more: the O1 lists, as torch.autocast
    got = _auto(lambda: net(x))
    _clean(net)
    decisions = ampcore.auto_plan("cpu").to_dict()["entries"]
    _load(
        {k: e["decision"] for k, e in decisions.items() if not k.startswith("Linear(in_features=24, out_features=16")}
    )
    want = _fixed(lambda: net(x))  # the same plan without the converted layer's classes
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_layers_in_nested_and_private_plain_containers() -> None:
    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 16)
            self._blocks = [[nn.Linear(16, 24)], {"out": (nn.Linear(24, 4),)}]
            self.deep = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.b(torch.relu(self.a(x)))
            if self.deep:
                return self._blocks[1]["out"][0](self._blocks[0][0](h))
            return h

    net, x = Nested(), torch.randn(8, 16)
    inner, out = net._blocks[0][0], net._blocks[1]["out"][0]
    _plan([(net.a, (8, 16), "low"), (net.b, (8, 16), "low"), (inner, (8, 16), "fp32"), (out, (8, 24), "fp32")])
    deep = [False, False, True, False, True]

    def call(i: int) -> Any:
        net.deep = deep[i]
        return net(x)

    _same(net, call, steps=len(deep))
    net._blocks[0][0] = nn.Linear(16, 24)  # replaced two levels down (the old one still referenced)
    net.deep = True
    _same(net, lambda i: net(x), steps=2)
    assert inner is not net._blocks[0][0]


def test_a_layer_passed_as_an_argument() -> None:
    class Apply(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
            return layer(torch.relu(self.a(x)))

    net, x = Apply(), torch.randn(8, 16)
    outs = [nn.Linear(16, 4), nn.Linear(16, 6)]
    _plan([(net.a, (8, 16), "low"), (outs[0], (8, 16), "fp32"), (outs[1], (8, 16), "low")])
    both = nn.ModuleList([net, *outs])
    _same(both, lambda i: net(x, outs[i % 2]), steps=5)


# --- 3. inner shapes that change while the root's signature does not -------------------------


def _buckets(module: nn.Module, width: int, small: str, large: str, limit: int = 8) -> list[Any]:
    """``module``'s classes on 1..64 rows: ``small`` up to ``limit`` rows, else ``large``."""
    return [(module, (n, width), small if n <= limit else large) for n in (1, 2, 4, 8, 16, 32, 64)]


class MoE(nn.Module):
    """Two experts; each row goes to the expert its first feature picks (``torch.nonzero``)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(16, 2)
        self.experts = nn.ModuleList([nn.Linear(16, 16), nn.Linear(16, 16)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.router(x).float().sum()
        picked = [torch.nonzero(x[:, 0] > 0).squeeze(1), torch.nonzero(x[:, 0] <= 0).squeeze(1)]
        outs = [expert(x[rows]).float().sum(0) for expert, rows in zip(self.experts, picked, strict=True)]
        return outs[0] + outs[1] + gate


def _route(net: MoE, counts: list[int]) -> None:
    """``net`` equals the fixed precision on batches of 64 rows whose first ``counts[i]`` rows
    go to expert 0 (the others to expert 1)."""
    _plan([(net.router, (64, 16), "low"), *_buckets(net.experts[0], 16, "fp32", "low")])

    def call(i: int) -> Any:
        x = torch.linspace(-1, 1, 64 * 16).reshape(64, 16)
        x[:, 0] = -1.0
        x[: counts[i], 0] = 1.0
        return net(x)

    _same(net, call, steps=len(counts))


@pytest.mark.parametrize("first", [3, 40])
def test_moe_routing_gets_each_expert_batch_s_decision(first: int) -> None:
    net = MoE()
    _plan([(net.router, (64, 16), "low"), *_buckets(net.experts[0], 16, "fp32", "low")])
    counts = [first, 60, 5, 33, 2, 48, 7, 61]

    _route(net, counts)


def test_moe_routing_by_counts_from_bincount_read_with_tolist() -> None:
    class Split(MoE):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            order = torch.argsort((x[:, 0] <= 0).to(torch.int8), stable=True)
            counts = torch.bincount((x[:, 0] <= 0).long(), minlength=2).tolist()
            parts = torch.split(x[order], counts)
            return sum(e(p).float().sum(0) for e, p in zip(self.experts, parts, strict=True)) + self.router(x).sum()

    net = Split()
    _plan([(net.router, (64, 16), "low"), *_buckets(net.experts[0], 16, "fp32", "low")])
    counts = [40, 3, 60, 5, 33]

    _route(net, counts)


class Sliced(nn.Module):
    """A slice by a module attribute (``k``) changed between steps."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 64
        self.pre = nn.Linear(16, 16)
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.relu(self.pre(x))[: self.k]).sum(0)


@pytest.mark.parametrize("ks", [[64, 64, 3, 64, 5], [3, 3, 64, 2, 33]], ids=["full-first", "short-first"])
def test_a_slice_by_a_module_attribute_gets_its_shape_class_s_decision(ks: list[int]) -> None:
    net, x = Sliced(), torch.randn(64, 16)
    _plan([(net.pre, (64, 16), "low"), *_buckets(net.lin, 16, "fp32", "low")])

    def call(i: int) -> Any:
        net.k = ks[i]
        return net(x)

    _same(net, call, steps=len(ks))


def test_a_float32_model_with_a_guarded_inner_shape_keeps_a_float32_default(monkeypatch: pytest.MonkeyPatch) -> None:
    net, x = Sliced(), torch.randn(64, 16)
    _plan([(net.pre, (64, 16), "fp32"), *_buckets(net.lin, 16, "fp32", "fp32")])
    ks = [3, 40, 5, 64, 7, 33]

    def call(i: int) -> Any:
        net.k = ks[i]
        return net(x)

    _same(net, call, steps=len(ks))
    seen = _recordings(monkeypatch)
    _same(net, call, steps=len(ks))
    assert seen == []  # the guard's float32 decisions change nothing: no new recording
    (program,) = _store._programs[net].values()
    assert program.default_fp32 and len(program.unseen) == 1  # lin: guarded, its shape changes


class Checked(nn.Sequential):
    """A forward that tests a mask and reads a float: data-dependent ops that pick no size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if not bool(torch.all(torch.isfinite(x))) or x.abs().max().item() > 1e6:
            raise ValueError("bad input")
        return super().forward(x)


@pytest.mark.parametrize("kind", [nn.Sequential, Checked])
def test_shapes_that_follow_the_root_s_arguments_are_not_guarded(kind: type[nn.Sequential]) -> None:
    """The settled path of a model whose inner shapes follow its arguments stays hook-free."""
    net = kind(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    _plan([(net[0], (8, 16), "fp32"), (net[2], (8, 32), "fp32")])
    x = torch.randn(8, 16)
    _same(net, lambda i: net(x), steps=2)
    _auto(lambda: net(x))
    (program,) = _store._programs[net].values()
    assert program.unseen == () and program.switched == ()


def test_classes_that_differ_only_in_input_dtype_are_not_guarded() -> None:
    net, x = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)), torch.randn(8, 16)
    as_float, as_low = _classes(net[0], (8, 16))
    _load({as_float: "fp32", as_low: "low", **dict.fromkeys(_classes(net[2], (8, 32)), "fp32")})
    _same(net, lambda i: net(x), steps=3)
    (program,) = _store._programs[net].values()
    assert program.unseen == ()


def test_a_root_called_with_keyword_tensors_is_not_guarded() -> None:
    """The first call of a root in a region is recorded before its keyword arguments are
    known (the global pre-hook has none): whether its shapes follow them is decided after."""

    class Keywords(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 32)
            self.out = nn.Linear(32, 4)

        def forward(self, *, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.out(torch.relu(self.lin(x)) * mask)

    net, x, mask = Keywords(), torch.randn(8, 5, 16), torch.ones(8, 5, 1)
    _plan([(net.lin, (8, 5, 16), "fp32"), (net.out, (8, 5, 32), "low")])
    _same(net, lambda i: net(x=x, mask=mask), steps=3)
    (program,) = _store._programs[net].values()
    assert program.unseen == () and len(program.switched) == 1


# --- 4. torch.utils.checkpoint inside the root ----------------------------------------------


class Ckpt(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 4)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=self.reentrant)
        return self.head(h)


def _ambient(run: Callable[[], Any], inside: nn.Module) -> Any:
    """``_fixed(run)`` with the planned calls inside ``inside`` (checkpointed) left to the
    autocast state, as the checkpoint's recompute runs them."""
    skip = {id(m) for m in inside.modules()}
    handles = [
        m.register_forward_pre_hook(lambda mod, a: torch.set_autocast_enabled("cpu", True))
        for m in inside.modules()
        if id(m) in skip and isinstance(m, nn.Linear)
    ]
    try:
        return _fixed(run)
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("decisions", [("fp32", "low", "fp32"), ("low", "fp32", "low"), ("fp32", "fp32", "fp32")])
def test_checkpoint_recompute_matches_the_forward(reentrant: bool, decisions: tuple[str, str, str]) -> None:
    net, x = Ckpt(reentrant), torch.randn(8, 16, requires_grad=True)
    d0, d2, dh = decisions
    decided: dict[str, str] = {}
    for grad in (True, False):  # the reentrant forward runs under no_grad
        for module, d in ((net.block[0], d0), (net.block[2], d2), (net.head, dh)):
            decided.update(dict.fromkeys(_classes(module, (8, 16), grad=grad), d))
    _load(decided)
    for _ in range(3):
        net.zero_grad(set_to_none=True)
        want = _ambient(lambda: net(x), net.block)
        want.float().sum().backward()
        want_grads = [p.grad.clone() for p in net.parameters()]
        net.zero_grad(set_to_none=True)
        got = _auto(lambda: net(x))
        _clean(net)
        got.float().sum().backward()  # non-reentrant: a CheckpointError where dtypes differed
        assert got.dtype == want.dtype
        torch.testing.assert_close(list(_flat(got)), list(_flat(want)), rtol=0, atol=0)
        for p, w in zip(net.parameters(), want_grads, strict=True):
            torch.testing.assert_close(p.grad, w, rtol=0, atol=0)


def test_checkpoint_sequential_inside_the_root() -> None:
    class Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
            self.head = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.utils.checkpoint.checkpoint_sequential(self.body, 2, x, use_reentrant=False))

    net, x = Seq(), torch.randn(8, 16, requires_grad=True)
    _plan([(net.body[0], (8, 16), "fp32"), (net.body[2], (8, 16), "low"), (net.head, (8, 16), "fp32")])
    for _ in range(3):
        want = _ambient(lambda: net(x), net.body)
        got = _auto(lambda: net(x))
        _clean(net)
        got.float().sum().backward()
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_transformers_gradient_checkpointing(reentrant: bool) -> None:
    """A Hugging Face encoder with ``gradient_checkpointing_enable()``: its layers' recompute
    raised ``CheckpointError`` at the first backward where a Linear in them was decided
    float32 (``use_reentrant=False``)."""
    model = tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ids, mask = torch.randint(0, 100, (2, 10)), torch.ones(2, 10, dtype=torch.long)
    decisions: dict[str, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            for grad in (True, False):
                shape = (2, module.in_features) if "pooler" in name else (2, 10, module.in_features)
                for key in _classes(module, shape, grad=grad):
                    decisions[key] = "fp32" if "intermediate" in name or "pooler" in name else "low"
    _load(decisions)
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        want = _ambient(lambda: model(input_ids=ids, attention_mask=mask).pooler_output, model.encoder)
        want.float().sum().backward()
        want_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        got = _auto(lambda: model(input_ids=ids, attention_mask=mask).pooler_output)
        assert not _hooks.installed() and not torch.is_autocast_enabled("cpu")  # (the model has hooks of its own)
        got.float().sum().backward()
        assert got.dtype == want.dtype == torch.float32  # the pooler: float32 by the plan
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        # reentrant: ampcore's O1 region itself differs from torch.autocast by a few 1e-5 in
        # this model's embedding gradients (not auto's doing: level O1 alike; noted, issue 27)
        tol = 1e-4 if reentrant else 0.0
        for g, w in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)
