"""Issue 27, fifteenth stop: what a copy's program lookup checks (``ampcore/_auto/_twins.py``).

A copy of a root made every step (``copy.deepcopy`` for an EMA or a teacher, a replica as
``nn.DataParallel`` makes one) takes the program kept for its source.  Its lookup now walks
the copy's module tree once (the digest's walk feeds the adoption and the guard) and looks
at a module's own attributes for layers kept in plain containers, torch's hook dicts only
where one is not empty (``_containers.candidates``).  These tests pin that the guard a copy
gets is the one a fresh snapshot of it makes, and that a copy whose layers, settings,
containers or signature differ never runs the other's program.  Fake clocks only.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import _clean
from test_auto_sweep5 import Clock, _process
from test_auto_sweep7 import _replicate
from torch import nn

import ampcore
from ampcore._auto import _guard, _roots, _store, _twins
from ampcore._auto._containers import candidates
from ampcore._auto._setting_values import Settings

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

X = torch.randn(4, 16)


class Held(nn.Module):
    """Planned layers registered; unplanned ones in a plain list (not registered) and in a
    tuple in a dict; a setting (``self.times``) its forward picks its work from."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(16, 16)
        self.second = nn.Linear(16, 16)
        self.extra = [nn.GELU()]
        self.more = {"pair": (nn.ReLU(), nn.Tanh())}
        self.times = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        for _ in range(self.times):
            x = self.second(x)
        relu, tanh = self.more["pair"]
        return tanh(relu(self.extra[0](x)))


def _held() -> Held:
    torch.manual_seed(0)
    return Held()


_COPIES = {"deepcopy": copy.deepcopy, "replica": _replicate}


def _step(model: nn.Module) -> torch.Tensor:
    with torch.no_grad(), ampcore.autocast("cpu", level="auto"):
        return model(X)


def _settled_copy(how: str, master: nn.Module, change: Any = None) -> tuple[nn.Module, torch.Tensor]:
    """A copy of ``master`` (changed by ``change``) called once, after three copies ran."""
    for _ in range(3):
        _step(_COPIES[how](master))
    twin = _COPIES[how](master)
    if change is not None:
        change(twin)
    return twin, _step(twin)


def _program(root: nn.Module) -> Any:
    found = [p for p in _store._programs.get(root, {}).values() if p is not None]
    assert len(found) == 1, found
    return found[0]


def _same_guard(got: Any, want: Any) -> None:
    """Two snapshots (``_guard.snapshot``) that hold the same objects in the same places."""
    tree, values, weights, plain = got
    assert len(tree) == len(want[0]) and all(map(lambda a, b: a is b, tree, want[0]))
    assert [list(map(id, v)) for v in values] == [list(map(id, v)) for v in want[1]]
    assert [(id(d), n, id(w)) for d, n, w in weights] == [(id(d), n, id(w)) for d, n, w in want[2]]
    ours = [(id(o), n, id(c), list(map(id, v))) for o, n, c, v in plain if type(c) is not Settings]  # (its settings)
    assert ours == [(id(o), n, id(c), list(map(id, v))) for o, n, c, v in want[3]]


@pytest.mark.parametrize("how", list(_COPIES))
@pytest.mark.parametrize("hooked", [False, True])
def test_a_copys_guard_is_the_one_a_fresh_snapshot_of_it_makes(
    how: str, hooked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard a copy gets from its one walk (the digest's) holds what a walk of its own
    finds: the tree's dicts, the planned layers' weights, the plain containers (also a layer
    kept in a list whose module has a hook: torch's hook dicts, looked at only where one is
    not empty)."""
    master = _held()
    if hooked:
        master.extra[0].register_forward_hook(lambda *a: None)
        master.register_forward_hook(lambda *a: None)
    _process(monkeypatch, Clock(), nn.Identity(), n=0)
    made = _recorded(monkeypatch)
    twin, _ = _settled_copy(how, master)
    _clean(twin)
    assert twin not in made  # adopted, not recorded
    program = _program(twin)
    planned = [r() for r in (*program.planned, *program.unseen)]
    fresh = _guard.snapshot(twin, planned)  # type: ignore[arg-type]
    _same_guard((program.tree, program.tree_values, program.weights, program.plain), fresh)
    assert len(fresh[3]) >= 2  # the list and the dict (and the tuple in it) guarded


#: change -> whether a copy changed so before its first call still takes the kept program
#: (the digest covers the registered tree and settings; a plain container's modules are no
#: planned layer of a kept program: the guard made for the copy itself holds them)
_CHANGES = {
    "a layer in the plain list replaced": (lambda m: m.extra.__setitem__(0, nn.SiLU()), True),
    "the plain list given another layer": (lambda m: m.extra.append(nn.SiLU()), True),
    "a setting": (lambda m: setattr(m, "times", 2), False),
    "a registered layer replaced by another": (lambda m: setattr(m, "second", nn.Linear(16, 16, bias=False)), False),
    "a weight's dtype": (lambda m: m.second.bfloat16(), False),
}


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[nn.Module]:
    made: list[nn.Module] = []
    real = _roots._record
    monkeypatch.setattr(_roots, "_record", lambda module, *a, **k: made.append(module) or real(module, *a, **k))
    return made


@pytest.mark.parametrize("how", list(_COPIES))
@pytest.mark.parametrize("change", list(_CHANGES))
def test_a_copy_changed_never_runs_the_program_of_other_layers(
    how: str, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy changed before its first call takes the kept program only where the change is
    none of its layers', settings' or weights'; one changed after its adoption records at
    its next call (its guard sees the change)."""
    _process(monkeypatch, Clock(), nn.Identity(), n=0)
    made = _recorded(monkeypatch)
    alter, adopts = _CHANGES[change]
    before, _ = _settled_copy(how, _held(), alter)
    assert (before in made) is not adopts
    made.clear()
    after, _ = _settled_copy(how, _held())
    assert made == []  # adopted
    alter(after)
    _step(after)
    _clean(before, after)
    assert made == [after]


@pytest.mark.parametrize("how", list(_COPIES))
def test_a_copy_called_with_another_signature_records(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _process(monkeypatch, Clock(), nn.Identity(), n=0)
    master = _held()
    for _ in range(3):
        _step(_COPIES[how](master))
    twin = _COPIES[how](master)
    made = _recorded(monkeypatch)
    with torch.no_grad(), ampcore.autocast("cpu", level="auto"):
        twin(torch.randn(5, 16))
    _clean(twin)
    assert made == [twin]


def test_a_copys_walk_is_not_held_after_its_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk the digest hands to the adoption (the copy's modules) is dropped with the
    call, also where the call went another way."""
    _process(monkeypatch, Clock(), nn.Identity(), n=0)
    master = _held()
    twin, _ = _settled_copy("deepcopy", master)
    _clean(twin)
    assert getattr(_twins._digest, "last", None) is None


@pytest.mark.parametrize(
    "value",
    [[nn.ReLU()], (nn.ReLU(),), {"a": nn.ReLU()}, [[nn.ReLU()]], [], 3, "x", torch.ones(2), [1, 2], None],
    ids=["list", "tuple", "dict", "nested", "empty", "int", "str", "tensor", "numbers", "none"],
)
@pytest.mark.parametrize("hooked", [False, True])
def test_candidates_are_every_non_empty_container_attribute(value: Any, hooked: bool) -> None:
    """What the guard looks into: as a look at every attribute but the registered ones finds."""
    module = nn.Linear(2, 2)
    module.kept = value
    if hooked:
        module.register_forward_pre_hook(lambda *a: None)
    assert candidates(module) == _every(module)
    module.__dict__.pop("kept")
    module.other = value  # (another layout of the class)
    assert candidates(module) == _every(module)
    module.__dict__.pop("other")
    assert candidates(module) == _every(module)


def _every(module: nn.Module) -> list[tuple[str, Any]]:
    registered = ("_modules", "_parameters", "_buffers")
    return [(k, v) for k, v in vars(module).items() if isinstance(v, (list, tuple, dict)) and k not in registered and v]


def test_the_whole_call_check_keeps_one_copy_of_the_calls_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of a mixed program runs three candidates; each run puts back what the
    forward changed in place, from one copy of the call's tensors (before: a copy per
    candidate).  The caller's tensor is changed once, by the real call, as in a step
    without auto."""
    from test_auto_sweep9 import InPlace  # (x.mul_(2.0).clamp_(-1.5, 1.5) first)

    from ampcore._auto import _verify
    from ampcore._auto._shapes import shape_class

    torch.manual_seed(0)
    model = InPlace()
    x = torch.randn(4, 16)
    clock = Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0, fp32=(shape_class(model.a, (x,), "cpu"),))  # type: ignore[arg-type]
    kept: list[Any] = []
    real = _verify.Inputs
    monkeypatch.setattr(_verify, "Inputs", lambda *a: kept.append(real(*a)) or kept[-1])
    want = x.mul(2.0).clamp(-1.5, 1.5)
    for _ in range(4):  # recorded (its program mixed: a float32, b low), checked as a whole, settled
        given = x.clone()
        with ampcore.autocast("cpu", level="auto"):
            model(given)
        torch.testing.assert_close(given, want, rtol=0, atol=0)
    _clean(model)
    assert {"root-plan", "root-low", "root-fp32"} <= set(clock.labels)  # (before: the check raised, unrepeatable)
    assert len(kept) == 1
