"""Issue 27, twelfth held-out sweep: arguments the guard could not describe before (the call
then applied the plan call by call, every call: the global hooks on every module call).

* a ``set`` of layer names to skip, a dict keyed by tuples (``("enc", 0)``), ``...``: by
  value;
* an activation function passed as an argument (``F.gelu``, ``torch.tanh``): by identity (a
  function defined at a module's level or a builtin is the same object every call; a lambda
  or a closure made anew every call is still not held: it would be a new signature each
  call).

Held, they settle (no recording once seen), pick their own programs when they pick a path,
and match the fixed precision step by step.  No wall clock.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

import ampcore
from ampcore._auto import _guard, _store
from ampcore._auto._program import Program

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class Configured(nn.Module):
    """Four blocks; the call names the blocks to skip (a set), the activation (a function),
    per-block scales keyed by ``("block", i)`` and an index (``...`` or a slice)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.out = nn.Linear(32, 4)

    def forward(
        self,
        x: torch.Tensor,
        skip: set[str] | None = None,
        act: Any = F.relu,
        scales: dict[tuple[str, int], float] | None = None,
        rows: Any = ...,
    ) -> torch.Tensor:
        h = act(self.inp(x[rows]))
        for i, block in enumerate(self.blocks):
            if skip and f"block{i}" in skip:
                continue
            h = h + act(block(h)) * (scales or {}).get(("block", i), 1.0)
        return self.out(h)


_ACTS = (F.gelu, torch.tanh, F.silu, F.gelu, torch.tanh, F.silu)
_SKIPS = ({"block1"}, {"block1", "block3"}, set(), {"block1"}, {"block1", "block3"}, set())


def _kwargs(i: int) -> dict[str, Any]:
    return {"skip": _SKIPS[i % 6], "act": _ACTS[i % 6], "scales": {("block", 0): 0.5, ("block", 2): 2.0}, "rows": ...}


def test_sets_functions_tuple_keys_and_ellipsis_are_guarded_and_settle(measuring: Any, recordings: list[Any]) -> None:
    """Before, each of these made ``signature`` None: every call applied the plan call by
    call (and a set that skips blocks could not have a program of its own)."""
    torch.manual_seed(0)
    model, x = Configured(), torch.randn(8, 16)
    assert _guard.signature((x,), _kwargs(0), model) is not None
    for i in range(12):
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            model(x, **_kwargs(i)).float().sum().backward()
    recordings.clear()
    for i in range(12, 24):
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            model(x, **_kwargs(i)).float().sum().backward()
    assert recordings == [], f"{len(recordings)} recordings in 12 settled calls"
    plan = ampcore.auto_plan("cpu", BF16)
    programs = [_store.program_for(model, _guard.signature((x,), _kwargs(i), model), plan) for i in range(3)]
    assert all(isinstance(p, Program) for p in programs) and len({id(p) for p in programs}) == 3  # (each its own)


def test_a_lambda_made_every_call_is_still_not_held() -> None:
    """A new function object every call would be a new signature every call (recorded every
    call): not held, the call applies the plan call by call as before."""
    x = torch.randn(2, 16)
    assert _guard.signature((x,), {"act": lambda t: t * 2}) is None
    assert _guard.signature((x,), {"skip": {torch.zeros(1)}}) is None  # (a set of tensors: by value is no guard)
    assert _guard.signature((x,), {"scales": {(("a",),): 1}}) is None  # (nested tuple keys)


@pytest.mark.parametrize("measured", [True, False], ids=["measured", "given"])
def test_arguments_that_pick_a_path_match_the_fixed_precision(
    measured: bool, request: Any, recordings: list[Any]
) -> None:
    if measured:
        request.getfixturevalue("measuring")
    x = torch.randn(8, 16)

    def step(m: nn.Module, i: int, enter: Enter) -> Any:
        return _train(m, x, enter, **_kwargs(i))

    run(Configured, step, 6, recordings, (BF16,), measured=measured)


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
