"""Issue 27, thirteenth stop: the gaps the twelfth stop left (helper left2).

* **TorchScript inside a model** (``torch.jit.script`` / ``torch.jit.trace``): the seventh
  sweep's scripted-submodule case (a strict xfail: "its gradient differs from the fixed
  precision's at the first step") had two causes.  The test's plan-making steps ran on
  ``copy.deepcopy`` copies, and a deep copy of a model holding a scripted module runs the
  *original's* scripted parameters (torch: the copies' backward fills the original's
  ``.grad``): six steps of gradients were already in the model when its first auto step ran
  (7 x the reference's).  Once the steps ran on rebuilt copies, auto itself failed: a
  scripted module's ``_modules`` is torch's ``OrderedModuleDict``, not a ``dict``, and the
  guard's snapshot of a program (``dict.values`` on each) raised ``TypeError`` inside the
  user's forward when the recording ended.  The variants here: a scripted submodule, a
  traced submodule and a traced leaf layer, a scripted root, a scripted module in eval under
  ``no_grad``, each compared step by step with the fixed precision its plan gives
  (:func:`test_auto_sweep3.run`: outputs, gradients and parameters bit-identical, nothing of
  auto left), a model copied every step holding a scripted module.

Timings are injected (fake clocks): the tests count recordings and check decisions and
numerics, never the wall clock.
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, _auto, _clean, _decide, _equal, _mlp, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

import ampcore

pytestmark = [
    pytest.mark.usefixtures("auto_state"),  # tests/auto/_auto_testing.py
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.trace_method` is deprecated:DeprecationWarning"),
]

# --- (1) TorchScript inside a model ----------------------------------------------------------


def _example() -> torch.Tensor:
    return torch.randn(8, 32, generator=torch.Generator().manual_seed(7))


def _scripted() -> nn.Module:
    return torch.jit.script(nn.Sequential(nn.Linear(32, 32), nn.ReLU()))


def _traced() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(nn.Sequential(nn.Linear(32, 32), nn.ReLU()), _example())


def _traced_leaf() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(nn.Linear(32, 32), _example())


class Holding(nn.Module):
    """Linear(16, 32) (decided float32 by the tests' rule), the TorchScript module, Linear(32, 4)."""

    def __init__(self, inner: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.s = inner()
        self.c = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.s(self.a(x)))


class Plain(nn.Module):
    """A model scripted whole (the root itself): its layers run inside TorchScript."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.c = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.a(x)))


def _rebuilt(make: Callable[[], nn.Module]) -> Callable[[nn.Module], nn.Module]:
    """The reference, built again from the same seed: ``copy.deepcopy`` of a model holding a
    TorchScript module runs the original's scripted parameters."""

    def clone(model: nn.Module) -> nn.Module:
        torch.manual_seed(0)
        return make()

    return clone


def _script_cases() -> dict[str, Callable[[], nn.Module]]:
    return {
        "scripted-submodule": lambda: Holding(_scripted),
        "traced-submodule": lambda: Holding(_traced),
        "traced-leaf": lambda: Holding(_traced_leaf),
        "scripted-root": lambda: torch.jit.script(Plain()),
    }


@pytest.mark.parametrize("case", list(_script_cases()))
@pytest.mark.parametrize("measured", [True, False], ids=["measured", "given"])
def test_torchscript_in_a_model_matches_the_fixed_precision(
    case: str, measured: bool, measuring: Any, recordings: list[Any]
) -> None:
    """Training steps: outputs, gradients and parameters bit-identical to the fixed
    precision (the layers inside TorchScript are not hooked, in both runs alike), settled
    steps record nothing.  Before: the program's snapshot raised ``TypeError`` (a scripted
    module's ``OrderedModuleDict``)."""
    make = _script_cases()[case]
    x = torch.randn(8, 16)
    run(make, lambda m, i, enter: _train(m, x, enter), 6, recordings, measured=measured, clone=_rebuilt(make))


def test_a_scripted_module_in_eval_under_no_grad(measuring: Any, recordings: list[Any]) -> None:
    x = torch.randn(8, 16)

    def infer(m: nn.Module, i: int, enter: Enter) -> Any:
        m.eval()
        with torch.no_grad(), enter(BF16):
            return m(x + i)

    make = _script_cases()["scripted-submodule"]
    run(make, infer, 4, recordings, measured=True, clone=_rebuilt(make))


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)


@pytest.mark.parametrize("settled", [True, False], ids=["settled-root", "new-root"])
def test_torch_jit_trace_inside_an_auto_region_runs_as_torch_autocast(settled: bool, recordings: list[Any]) -> None:
    """``torch.jit.trace`` inside an auto region (the weight cache off, as torch.autocast
    needs for a trace): auto runs as torch.autocast while tracing (no recording, no
    program, no measuring: a traced call's sizes are tensors, and a trace would bake one
    call's decisions in), the traced module equal to torch.autocast's trace.  Before: the
    shape class of a traced call raised ``AttributeError`` (``bucket`` of a size tensor)."""
    x = torch.randn(8, 16)
    torch.manual_seed(0)
    model = _mlp()  # Linear(16, 32) float32 by the plan, the others low
    reference = copy.deepcopy(model)
    _decide(model, lambda m, i, enter: _train(m, x, enter), 1)
    if settled:
        for _ in range(3):
            _train(model, x, _auto)
        _clean(model)
        assert recordings, "the root was recorded and settled"
    recordings.clear()
    with ampcore.autocast("cpu", level="auto", dtype=BF16, cache_enabled=False):
        traced = torch.jit.trace(model, x, check_trace=False)  # (its check calls the model untraced)
        assert recordings == []
        got = traced(x)  # (a new root: the traced module)
    _clean(model, traced)
    with torch.autocast("cpu", dtype=BF16, cache_enabled=False):
        want_traced = torch.jit.trace(reference, x, check_trace=False)
        want = want_traced(x)
    _equal(got, want, "traced inside the region")
    _equal(traced(x), want_traced(x), "the trace run alone")


def test_a_model_holding_a_scripted_module_copied_every_step(measuring: Any, recordings: list[Any]) -> None:
    """``copy.deepcopy`` of the model each step (a replica, an EMA copy): each copy runs the
    program of the first (``_twins``: its layers' digest reads a scripted module's layers
    too); outputs and the model's gradients (torch's: a copy's backward fills the original's
    scripted ones) equal to the fixed precision's, settled copies record nothing."""
    x = torch.randn(8, 16)

    def copied(m: nn.Module, i: int, enter: Enter) -> Any:
        return _train(copy.deepcopy(m), x, enter)

    make = _script_cases()["scripted-submodule"]
    run(make, copied, 4, recordings, measured=True, clone=_rebuilt(make))


# --- (2) a copy's layers digest costs the comparisons, not the text -------------------------


def _fresh_digest(root: nn.Module) -> str:
    """:func:`_twins.layers` made from nothing kept (as it was before the thirteenth stop)."""
    from ampcore._auto._twins import layer

    text = ";".join(
        f"{name}:{layer(m)}{[p.dtype for p in m._parameters.values() if p is not None]}"
        for name, m in root.named_modules()
    )
    return f"{type(root).__qualname__}#" + hashlib.sha1(text.encode()).hexdigest()


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


class Shown(nn.Module):
    """A module whose ``extra_repr`` shows a private attribute (not a setting)."""

    def __init__(self) -> None:
        super().__init__()
        self._k = 1

    def extra_repr(self) -> str:
        return f"k={self._k}"


def _changes() -> dict[str, Callable[[nn.Module], None]]:
    def held(m: nn.Module) -> None:
        from ampcore._auto import _settings

        _settings._held.setdefault(m.layers[0], set()).add("norm_first")

    def param(m: nn.Module) -> None:
        m.layers[1].linear1.weight = nn.Parameter(torch.zeros(48, 32))

    return {
        "none": lambda m: None,
        "an int setting": lambda m: setattr(m.layers[0].self_attn, "num_heads", 2),
        "a bool setting": lambda m: setattr(m.layers[1], "norm_first", True),
        "a new setting": lambda m: setattr(m.layers[0].linear2, "depth", 3),
        "a setting gone": lambda m: delattr(m, "mask_check"),
        "a list becomes an int": lambda m: setattr(m.layers[0], "cache", 1),
        "a private name added": lambda m: setattr(m.layers[0], "_extra", 1),
        "a float setting": lambda m: setattr(m.layers[0].dropout, "p", 0.5),
        "a parameter's dtype": lambda m: m.layers[0].norm1.bfloat16(),
        "a parameter's shape": param,
        "a layer replaced": lambda m: setattr(m.layers[0], "linear1", nn.Linear(32, 64, bias=False)),
        "a held setting": held,
        "what its extra_repr shows": lambda m: setattr(m.shown, "_k", 2),
    }


@pytest.mark.parametrize("how", ["deepcopy", "replica"])
@pytest.mark.parametrize("change", list(_changes()))
def test_a_copys_layers_digest_is_the_one_made_from_nothing(how: str, change: str) -> None:
    """The digest a copy reuses its source's texts for (``_twins._piece``: kept by class and
    attribute names, reused where the public attributes are the same objects) equals the
    digest made from nothing, after any change to the copy: a kept text is reused only for
    what it was made from."""
    from test_auto_sweep7 import _replicate

    from ampcore._auto import _twins

    source = _encoder()
    source.layers[0].cache = [1, 2]  # a public list: not a setting
    source.shown = Shown()
    _twins.layers(source)  # the texts of the source's modules kept
    twin = copy.deepcopy(source) if how == "deepcopy" else _replicate(source)
    assert _twins.layers(twin) == _fresh_digest(twin) == _twins.layers(source)
    _changes()[change](twin)
    assert _twins.layers(twin) == _fresh_digest(twin)
    assert _twins.layers(source) == _fresh_digest(source)  # (a replica shares the parameters)
    if how == "deepcopy":
        same = change in ("none", "a private name added")
        assert (_twins.layers(twin) == _twins.layers(source)) == same


def test_a_digest_leaves_nothing_in_the_modules() -> None:
    """The texts reused for copies are kept beside the modules (by class and attribute
    names), not in them: ``torch.save`` and ``copy.deepcopy`` see the model as it was."""
    import io

    from ampcore._auto import _twins

    model = _encoder()
    before = {name: dict(vars(m)) for name, m in model.named_modules()}
    digest = _twins.layers(model)
    assert {name: dict(vars(m)) for name, m in model.named_modules()} == before
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert b"ampcore" not in buffer.getvalue()
    buffer.seek(0)
    assert _twins.layers(torch.load(buffer, weights_only=False)) == digest


class Counting(nn.Sequential):
    """A forward that counts its calls (state, not a setting: held once it changed)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        self.calls = getattr(self, "calls", 0) + 1
        return super().forward(x)


def test_a_model_whose_forward_counts_copied_every_step_settles(recordings: list[Any]) -> None:
    torch.manual_seed(0)
    master = Counting(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    master.calls = 0
    x = torch.randn(8, 32)
    for step in range(6):
        if step == 3:
            recordings.clear()
        replica = copy.deepcopy(master)
        with ampcore.autocast("cpu", level="auto"):
            replica(x).float().sum().backward()
        _clean(replica)
    assert recordings == [], f"{len(recordings)} recordings of copies after the first ones"
