"""A held-out check of O2's master-weight updates (issue 31): a decorated model and optimizer
against torch's optimizer stepping float32 copies of the masters with the same widened
gradients, bit for bit, every step (the masters, the low-precision weights, the optimizer
state, the loss scale).

The model has the awkward parameters of real models: tied weights (an embedding and its
output head), a 0-dim and an empty parameter, a non-contiguous one, a layer whose gradient is
missing on odd steps, a frozen layer still held by the optimizer, a LayerNorm (float32 under
float16).  Its parameters are split into two param groups with different options.  The
gradients are a function of the weights the model holds, ``coef * (weight - target)`` in the
model parameter's dtype, so that they follow training as a loss's would (and an LBFGS closure
can compute them); the reference gets the same gradients widened (``.float()``, exact).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import ampcore
from ampcore._o2.master import master_weights_of
from ampcore._o2.update_walk import UpdateWalk

LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: the step whose gradients hold an inf (scaled runs: it must be skipped)
INF_AT = 2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.scalar = nn.Parameter(torch.tensor(0.75))
        self.empty = nn.Parameter(torch.empty(0, 3))
        self.strided = nn.Parameter(torch.randn(8, 6).t())  # not contiguous
        self.side = nn.Linear(8, 8)  # no gradient on odd steps
        self.wide = nn.Linear(8, 37)  # several chunks of the smallest walk, and a tail
        self.frozen = nn.Linear(8, 8).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - not used by the sweep
        return self.head(self.norm(self.lin(self.emb(x))))


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def two_groups(model: nn.Module, second: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The model's parameters in two param groups (the second with ``second``'s options)."""
    first = {"emb.weight", "lin.weight", "lin.bias", "scalar"}
    named = dict(model.named_parameters(remove_duplicate=True))
    named.update({n: p for n, p in model.named_parameters(remove_duplicate=False) if "frozen" in n})
    return [
        {"params": [p for n, p in named.items() if n in first]},
        {"params": [p for n, p in named.items() if n not in first], **second},
    ]


def groups_of(model: nn.Module, case: Case) -> list[dict[str, Any]]:
    groups = two_groups(model, case.second)
    if case.exclude:
        held = {id(p) for n, p in model.named_parameters(remove_duplicate=False) if n in case.exclude}
        groups = [{**g, "params": [p for p in g["params"] if id(p) not in held]} for g in groups]
    if case.one_group:
        return [{"params": [p for group in groups for p in group["params"]]}]
    return groups


@dataclass
class Case:
    """One optimizer configuration of the sweep."""

    make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]
    #: options of the second param group
    second: dict[str, Any] = field(default_factory=dict)
    closure: bool = False
    #: all parameters in one param group (LBFGS takes no more)
    one_group: bool = False
    #: parameters the optimizer does not hold (torch's Adafactor divides by an empty one's size)
    exclude: frozenset[str] = frozenset()
    #: the embedding's gradients are sparse (rows 1, 4 and 6), as ``nn.Embedding(sparse=True)`` makes them
    sparse: bool = False
    #: an LR scheduler of torch over the optimizer, stepped every step
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None


def _targets(model: nn.Module, step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def sparse_rows(grads: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
    """``grads`` with the embedding's gradient sparse (three rows)."""
    dense = grads["emb.weight"]
    if dense is not None:
        rows = torch.tensor([1, 4, 6])
        sparse = torch.sparse_coo_tensor(rows[None], dense[rows], dense.shape, check_invariants=True)
        grads["emb.weight"] = sparse.coalesce()
    return grads


def gradients(held: Mapping[str, torch.Tensor], step: int, scale: float) -> dict[str, torch.Tensor | None]:
    """``name -> gradient`` in the dtype of ``held[name]`` (the weight the model holds), or
    None (the ``side`` layer on odd steps); an inf at step :data:`INF_AT` when ``scale`` > 1."""
    gen = torch.Generator().manual_seed(1000 + step)
    grads: dict[str, torch.Tensor | None] = {}
    for name, weight in held.items():
        target = torch.randn(weight.shape, generator=gen)
        coef = 0.3 + 0.05 * step
        if name.startswith("side.") and step % 2:
            grads[name] = None
            continue
        grad = coef * (weight.detach().float() - target) * scale
        if step == INF_AT and scale > 1 and name == "lin.weight":
            grad[0, 0] = math.inf
        grads[name] = grad.to(weight.dtype)
    return grads


def loss_of(held: Mapping[str, torch.Tensor], step: int) -> float:
    gen = torch.Generator().manual_seed(1000 + step)
    total = 0.0
    for weight in held.values():
        target = torch.randn(weight.shape, generator=gen)
        total += float(((weight.detach().float() - target) ** 2).sum())
    return total


class Side:
    """One training run: a model, its optimizer, its scaler and scheduler."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, scaler: Any, sched: Any, held: Any) -> None:
        self.model, self.opt, self.scaler, self.sched = model, opt, scaler, sched
        #: name -> the weight whose dtype and value the gradient is computed from
        self.held = held
        self.params = dict(model.named_parameters())
        self.sparse = False
        #: parameters no optimizer holds (they get no master)
        self.unheld: frozenset[str] = frozenset()

    def set_grads(self, grads: Mapping[str, torch.Tensor | None], widen: bool, accumulate: bool) -> None:
        for name, grad in grads.items():
            param = self.params[name]
            if not param.requires_grad:
                continue
            if grad is None:
                if not accumulate:
                    param.grad = None
                continue
            value = grad.float() if widen else grad
            wanted = getattr(param, "grad_dtype", None)  # (master_grad=True: only parameters with masters)
            value = value if wanted is None else value.to(wanted)
            if accumulate and param.grad is not None:
                param.grad.add_(value)
            else:
                param.grad = value.clone()


@dataclass
class Options:
    dtype: str = "bf16"
    scaler: str | None = None  # "ampcore", "torch"
    clip: bool = False
    set_to_none: bool = True
    steps: int = 5
    #: decorate's ``master_grad``: backward's gradients are float32 (the decorated side gets
    #: the widened gradients, as the reference)
    master_grad: bool = False
    #: ampcore's own updates walk chunks of this many elements (tiny: every parameter but
    #: the smallest spans several), None: the backend's walk
    chunk: int | None = None


def scale_of(scaler: Any) -> float:
    return 1.0 if scaler is None or not scaler.is_enabled() else float(scaler.get_scale())


def _scaler(kind: str | None) -> Any:
    if kind == "ampcore":
        return ampcore.GradScaler("cpu", init_scale=1024.0, growth_interval=2, enabled=True)
    if kind == "torch":
        return torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    return None


Prepare = Callable[[nn.Module, torch.optim.Optimizer], None]


def build(case: Case, options: Options, seed: int = 0, before: Prepare | None = None) -> tuple[Side, Side]:
    """(the decorated side, torch's float32 reference side); ``before`` is called with the
    model and optimizer to decorate, before decorate."""
    low = LOW[options.dtype]
    model = make_net(seed)
    ref_model = copy.deepcopy(model)
    opt = case.make(groups_of(model, case))
    ref_opt = case.make(groups_of(ref_model, case))
    if before is not None:
        before(model, opt)
    model, opt = ampcore.decorate(model, opt, level="O2", dtype=low, device="cpu", master_grad=options.master_grad)
    if options.chunk is not None:
        weights = master_weights_of(opt)
        assert weights is not None
        weights.walk = UpdateWalk(options.chunk, adaptive=False)
    sched = case.scheduler(opt) if case.scheduler else None
    ref_sched = case.scheduler(ref_opt) if case.scheduler else None
    dec = Side(model, opt, _scaler(options.scaler), sched, None)
    dec.held = dec.params
    ref = Side(ref_model, ref_opt, _scaler("torch" if options.scaler else None), ref_sched, None)
    dec.sparse = ref.sparse = case.sparse
    dec.unheld = frozenset(name for name in case.exclude if name in dec.params)
    ref.held = {n: HeldAs(ref.params[n], dec.params[n].dtype) for n in ref.params}
    return dec, ref


class HeldAs:
    """The reference's float32 weight as the decorated model holds it (rounded to its dtype)."""

    def __init__(self, param: torch.Tensor, dtype: torch.dtype) -> None:
        self.param, self.dtype = param, dtype

    @property
    def shape(self) -> torch.Size:
        return self.param.shape

    def detach(self) -> HeldAs:
        return self

    def float(self) -> torch.Tensor:
        return self.param.detach().to(self.dtype).float()


def step(side: Side, index: int, options: Options, widen: bool, closure: bool) -> None:
    """One training step of ``side`` (``widen``: the float32 reference)."""
    widen = widen or options.master_grad
    if side.scaler is not None:
        side.scaler.scale(torch.ones(()))  # what scaling a loss does to the scaler
    scale = scale_of(side.scaler)
    grads = gradients(side.held, index, scale)
    if side.sparse:
        grads = sparse_rows(grads)
    if closure:

        def evaluate() -> float:  # LBFGS views every gradient flat: contiguous ones
            fresh = {n: None if g is None else g.contiguous() for n, g in gradients(side.held, index, scale).items()}
            side.set_grads(fresh, widen, accumulate=False)
            return loss_of(side.held, index)

        side.opt.step(evaluate)  # type: ignore[no-untyped-call]
    else:
        side.set_grads(grads, widen, accumulate=not options.set_to_none)
        if options.clip:
            if side.scaler is not None:
                side.scaler.unscale_(side.opt)
            params = [p for group in side.opt.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, 0.5)
        if side.scaler is not None:
            side.scaler.step(side.opt)
            side.scaler.update()
        else:
            side.opt.step()
    if side.sched is not None:
        side.sched.step()
    side.opt.zero_grad(set_to_none=options.set_to_none)


def same_run(dec: Side, ref: Side, where: str) -> None:
    """The decorated side's masters, weights, optimizer state and loss scale are the reference's."""
    got, want = dec.model.state_dict(), ref.model.state_dict()
    assert got.keys() == want.keys(), where
    for key, value in want.items():
        if key in dec.unheld:  # no master: saved as the low-precision weight, widened
            value = value.to(dec.params[key].dtype).to(value.dtype)
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), f"{where}: {key} differs"
    for name, param in dec.params.items():
        expect = ref.params[name].detach().to(param.dtype)
        assert torch.equal(param.detach(), expect), f"{where}: weight {name} is not its master rounded"
    same_state(dec.opt.state_dict(), ref.opt.state_dict(), where)
    assert scale_of(dec.scaler) == scale_of(ref.scaler), where


def same_state(got: Mapping[str, Any], want: Mapping[str, Any], where: str) -> None:
    assert got["param_groups"] == want["param_groups"], f"{where}: param groups differ"
    assert got["state"].keys() == want["state"].keys(), f"{where}: state of other parameters"
    for index, entries in want["state"].items():
        assert got["state"][index].keys() == entries.keys(), f"{where}: state keys of {index}"
        for key, value in entries.items():
            mine = got["state"][index][key]
            assert _equal(mine, value), f"{where}: {index}.{key} differs"


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and (a.is_sparse or b.is_sparse):
        return a.is_sparse == b.is_sparse and a.dtype == b.dtype and torch.equal(a.to_dense(), b.to_dense())
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def train_both(case: Case, options: Options) -> tuple[Side, Side]:
    """Both sides trained ``options.steps`` steps, compared after each."""
    dec, ref = build(case, options)
    for index in range(options.steps):
        step(dec, index, options, widen=False, closure=case.closure)
        step(ref, index, options, widen=True, closure=case.closure)
        same_run(dec, ref, f"step {index}")
    return dec, ref


def _flavours(name: str, cls: Any, kwargs: dict[str, Any], fused: bool, second: dict[str, Any]) -> dict[str, Case]:
    """``name`` in torch's for-loop and foreach flavours (and fused where torch has it on the CPU)."""
    exclude = frozenset({"empty"}) if cls is torch.optim.Adafactor else frozenset()
    made = {
        f"{name}-loop": Case(lambda g: cls(g, **kwargs, foreach=False), second, exclude=exclude),
        f"{name}-foreach": Case(lambda g: cls(g, **kwargs, foreach=True), second, exclude=exclude),
    }
    if fused:
        made[f"{name}-fused"] = Case(lambda g: cls(g, **kwargs, fused=True), second, exclude=exclude)
    return made


_O = torch.optim
#: (name, class, options, has a fused flavour on the CPU, options of the second param group)
_SPECS: list[tuple[str, Any, dict[str, Any], bool, dict[str, Any]]] = [
    ("sgd", _O.SGD, {"lr": 0.1}, True, {"lr": 0.05, "weight_decay": 0.01}),
    ("sgd-momentum", _O.SGD, {"lr": 0.1, "momentum": 0.9}, True, {"nesterov": True, "weight_decay": 0.02}),
    ("sgd-dampening", _O.SGD, {"lr": 0.1, "momentum": 0.5, "dampening": 0.3, "maximize": True}, True, {"lr": 0.2}),
    ("sgd-decay-maximize", _O.SGD, {"lr": 0.1, "weight_decay": 0.05, "maximize": True}, True, {"maximize": False}),
    ("adam", _O.Adam, {"lr": 0.01}, True, {"lr": 0.02, "weight_decay": 0.1}),
    ("adam-amsgrad", _O.Adam, {"lr": 0.01, "amsgrad": True, "maximize": True}, True, {"betas": (0.5, 0.9)}),
    ("adam-decoupled", _O.Adam, {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}, True, {}),
    ("adamw", _O.AdamW, {"lr": 0.01}, True, {"weight_decay": 0.0, "eps": 1e-6}),
    ("adamw-amsgrad", _O.AdamW, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.3}, True, {"lr": 0.003}),
    ("adamax", _O.Adamax, {"lr": 0.02}, False, {"weight_decay": 0.1}),
    ("nadam", _O.NAdam, {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}, False, {"lr": 0.02}),
    ("nadam-coupled", _O.NAdam, {"lr": 0.01, "weight_decay": 0.1}, False, {"momentum_decay": 0.002}),
    ("radam", _O.RAdam, {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}, False, {"lr": 0.02}),
    ("adagrad", _O.Adagrad, {"lr": 0.05, "lr_decay": 0.01}, True, {"weight_decay": 0.1}),
    ("adadelta", _O.Adadelta, {"lr": 1.0}, False, {"rho": 0.8, "weight_decay": 0.1}),
    ("rmsprop", _O.RMSprop, {"lr": 0.01, "centered": True, "momentum": 0.5}, False, {"centered": False}),
    ("rprop", _O.Rprop, {"lr": 0.01}, False, {"etas": (0.4, 1.3), "maximize": True}),
    ("asgd", _O.ASGD, {"lr": 0.01, "t0": 2.0}, False, {"weight_decay": 0.1}),
    ("adafactor", _O.Adafactor, {"lr": 0.01}, False, {"weight_decay": 0.1}),
]

#: every case of the sweep, by name
CASES: dict[str, Case] = {}
for _spec in _SPECS:
    CASES.update(_flavours(*_spec))
CASES["lbfgs"] = Case(lambda g: _O.LBFGS(g, lr=0.5, max_iter=3), closure=True, one_group=True)
CASES["lbfgs-wolfe"] = Case(
    lambda g: _O.LBFGS(g, lr=0.5, max_iter=4, line_search_fn="strong_wolfe"), closure=True, one_group=True
)
#: the optimizers ampcore updates itself (master_sgd.py, master_sgd_torch.py, master_adam.py)
OWN = [name for name in CASES if name.startswith(("sgd", "adam-", "adamw", "adam"))]
OWN = [name for name in OWN if not name.startswith(("adamax", "adagrad", "adadelta", "adafactor"))]
