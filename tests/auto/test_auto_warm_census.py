"""Issue 27, fifteenth stop: a later process (warm cache) runs the step the first one settled on.

On a quiet machine ``heldout-clip@AVX512_CORE`` measured auto 1.09 x float32 warm and 0.97
cold, with the same float32 program in both processes.  The suspect was a per-program fact
the settled path needs that does not survive the cache (the float32 state of the ops between
roots, ``Program.throughout``), so that the similarity of the towers ran in bfloat16
(emulated, 2.5 x float32 without bf16 instructions) in the warm process only.  It does not:
every aten op of a settled step, with its input dtypes, is the same in the process that
measured and in a later one that read the cache, and is the fixed choice's step (float32's,
or torch.autocast's where the whole-call check chose the O1 lists: ``heldout-gat``'s "runs as
low" is torch.autocast's step).  These tests pin that per op, for programs decided by the
classes, by the whole-call check, and read back from the cache.

Fake clocks and given decisions only: no wall-clock threshold.
"""

from __future__ import annotations

import collections
import gc
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_root_check import budget  # noqa: F401 (an autouse fixture: the budget unspent)
from test_auto_uniform_check import _new_process
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampcore
from ampcore._auto import Costs, _hooks
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py
_LOW, _FP32 = Costs(2.0, 1.0, 0.1), Costs(1.0, 2.0, 0.1)  # (fp32 ms, low ms, cast ms): low wins / float32 wins
_MIXED = (_LOW, _FP32, _FP32)  # the image tower's first layer low: a mixed program, the text tower float32
X, IDS = torch.randn(8, 24), torch.randint(0, 64, (8, 6))


class Pair(nn.Module):
    """heldout-clip in small: an image tower and a text tower called as two roots, the pair
    never called; normalized, a learned scale, the logits computed between and after roots."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.image = nn.Sequential(nn.Linear(24, 32), nn.GELU(), nn.Linear(32, 16))
        self.text = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 16))
        self.scale = nn.Parameter(torch.tensor(2.0))

    def step(self, enter: Callable[[], Any]) -> torch.Tensor:
        with enter():
            a = F.normalize(self.image(X), dim=-1)
            t = F.normalize(self.text(IDS).mean(1), dim=-1)
            logits = self.scale.exp() * a @ t.t()
            loss = F.cross_entropy(logits, torch.arange(8))
        loss.backward()
        self.zero_grad(set_to_none=True)
        return logits


class Census(TorchDispatchMode):
    """Every aten op of a step (forward and backward) with its tensors' dtypes, counted."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        dtypes = ",".join(str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor))
        self.ops[f"{func}({dtypes})"] += 1
        return func(*args, **(kwargs or {}))


class Clock:
    """Whole-call figures per candidate: ``root-<name>`` -> ms (a little jitter)."""

    def __init__(self, **ms: float) -> None:
        self.labels: list[str] = []
        self.figures = {f"root-{k}": itertools.cycle([v, v * 1.01, v * 0.99]) for k, v in ms.items()}

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(label)
        return next(self.figures[label])


def _decide(pair: Pair, costs: Costs | tuple[Costs, ...]) -> None:
    """The classes of the towers' three layers decided by ``costs`` (one for all, or one each)."""
    plan = ampcore.auto_plan("cpu")
    each = costs if isinstance(costs, tuple) else (costs,) * 3
    layers = ((pair.image[0], X), (pair.image[2], torch.zeros(8, 32)), (pair.text[1], torch.zeros(8, 6, 16)))
    for dtype in (torch.float32, torch.bfloat16):
        for (module, x), given in zip(layers, each, strict=True):
            plan.set(shape_class(module, (x.to(dtype),), "cpu") or "", given, source="given")


def _census(pair: Pair, enter: Callable[[], Any]) -> tuple[collections.Counter[str], torch.dtype]:
    census = Census()
    with census:
        logits = pair.step(enter)
    return census.ops, logits.dtype


def _process(monkeypatch: pytest.MonkeyPatch, pair: Pair, clock: Clock, costs: Any) -> Any:
    """Three steps in one process (recorded, checked, settled): the settled step's census."""
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    monkeypatch.setattr(_hooks._process, "clocks", {})
    _decide(pair, costs)
    region = ampcore.autocast("cpu", level="auto")
    for _ in range(3):
        pair.step(lambda: region)
    return _census(pair, lambda: region)


@pytest.mark.parametrize(
    ("costs", "figures", "fixed", "sources"),
    [
        (_FP32, {"plan": 10.0, "low": 25.0}, "fp32", {"measured"}),  # heldout-clip@AVX512_CORE
        (_FP32, {"plan": 10.0, "low": 8.0}, "low", {"measured"}),  # float32 classes, the O1 lists win as a whole
        (_LOW, {"plan": 10.0, "fp32": 12.0}, "low", {"measured"}),  # torch.autocast's program, kept
        (_LOW, {"plan": 10.0, "fp32": 7.0}, "fp32", {"measured"}),  # low classes, float32 wins as a whole
        (_MIXED, {"plan": 10.0, "low": 12.0, "fp32": 7.0}, "fp32", {"measured"}),  # a mixed image tower
    ],
    ids=["fp32-kept", "fp32-runs-as-low", "low-kept", "low-runs-as-fp32", "mixed-runs-as-fp32"],
)
def test_a_later_process_runs_the_same_ops_as_the_one_that_measured(
    monkeypatch: pytest.MonkeyPatch, costs: Any, figures: dict[str, float], fixed: str, sources: set[str]
) -> None:
    pair = Pair()
    cold = _process(monkeypatch, pair, Clock(**figures), costs)
    assert {c.source for c in ampcore.auto_plan("cpu").roots.values()} <= sources
    assert {c.verdict for c in ampcore.auto_plan("cpu").roots.values()} <= {fixed, "plan"}
    _new_process()  # the cache only
    silent = Clock()  # a figure asked for raises: the verdicts come from the cache
    warm = _process(monkeypatch, pair, silent, costs)
    assert silent.labels == [] and {c.source for c in ampcore.auto_plan("cpu").roots.values()} == {"cache"}
    ref = _census(pair, lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=fixed == "low"))
    assert warm[1] == cold[1] == ref[1] == (torch.bfloat16 if fixed == "low" else torch.float32)
    assert warm[0] == cold[0] == ref[0]  # op by op, with its dtypes: the fixed choice's step


def _kept() -> tuple[int, int]:
    """Live tensors (objects the garbage collector tracks) and their storages' bytes."""
    gc.collect()
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return len(tensors), sum(t.untyped_storage().nbytes() for t in tensors)


def _graph(pair: Pair, enter: Callable[[], Any]) -> int:
    """The number of autograd nodes of a step's loss (forward as Pair.step)."""
    with enter():
        a = F.normalize(pair.image(X), dim=-1)
        t = F.normalize(pair.text(IDS).mean(1), dim=-1)
        loss = F.cross_entropy(pair.scale.exp() * a @ t.t(), torch.arange(8))
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    return len(seen)


@pytest.mark.parametrize("fixed", ["fp32", "low"])
def test_a_settled_step_keeps_nothing_alive_and_builds_the_fixed_choices_graph(
    monkeypatch: pytest.MonkeyPatch, fixed: str
) -> None:
    """Issue 27, sixteenth stop: beyond its ops (above), a settled step holds nothing more than
    the fixed choice's step: no tensor left alive across steps (a check's kept inputs, casts,
    recorded outputs: kept memory changes the allocator's reuse), the same autograd nodes (no
    hook wrapping outputs).  The steady gap of auto over float32 on heldout-clip without bf16
    instructions was the benchmark's order of modes (docs/performance.md, sixteenth stop)."""
    pair, figures = Pair(), {"plan": 10.0, "low": 25.0} if fixed == "fp32" else {"plan": 10.0, "fp32": 12.0}
    _process(monkeypatch, pair, Clock(**figures), _FP32 if fixed == "fp32" else _LOW)
    region = ampcore.autocast("cpu", level="auto")
    ref = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=fixed == "low")  # noqa: E731
    pair.step(ref)
    before = _kept()
    pair.step(lambda: region)
    assert _kept() == before  # the settled step left nothing behind
    pair.step(ref)
    assert _kept() == before
    assert _graph(pair, lambda: region) == _graph(pair, ref)
