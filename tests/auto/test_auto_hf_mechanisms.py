"""Issue 27, sixteenth stop: the bug classes the Hugging Face cases (``test_auto_hf.py``) found,
each on a hand-written model (no ``transformers``), run with :func:`test_auto_sweep3.run`
(under auto equal to the fixed precision the plan gives; settled, no recording).

* A block checkpointed from some step on (``gradient_checkpointing_enable()`` mid-run in
  ``transformers`` 5: it wraps the layers' ``forward`` in ``torch.utils.checkpoint`` and sets
  attributes the recording never saw).  The program recorded before it switched a layer
  decided float32 inside the checkpoint, whose recompute in backward runs with the
  checkpoint's autocast state and no hook: ``CheckpointError`` (``use_reentrant=False``: the
  saved tensors' dtypes differ) or gradients of another computation (``use_reentrant=True``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, _clean, _train, counting, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from torch import nn

import ampcore

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

#: how the blocks run now (a global: no setting of the model's says it)
CHECKPOINT: dict[str, Any] = {"on": False, "reentrant": False}


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    return counting(monkeypatch)


class Block(nn.Module):
    """A residual MLP block (``Linear(16, 32)`` float32 by the cases' rule, ``Linear(32, 16)``
    low), run through ``torch.utils.checkpoint`` while :data:`CHECKPOINT` says so."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x))).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if CHECKPOINT["on"] and torch.is_grad_enabled():
            out = torch.utils.checkpoint.checkpoint(self._body, x, use_reentrant=CHECKPOINT["reentrant"])
            return out  # type: ignore[no-any-return]
        return self._body(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.blocks, self.head = nn.Linear(16, 16), nn.ModuleList(Block() for _ in range(2)), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)  # type: ignore[no-any-return]


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("when", [(1,), (1, 2, 3), (0, 2)], ids=["once", "from-step-1", "alternating"])
def test_a_block_checkpointed_from_some_step_on(reentrant: bool, when: tuple[int, ...], recordings: list[Any]) -> None:
    """Before: the step the checkpoint appeared raised ``CheckpointError`` in backward
    (non-reentrant) or gave other gradients than the fixed precision (reentrant).  Now a
    switched call found inside a checkpoint follows its autocast state (as a recorded one
    does) and the root records again at its next call."""
    x = torch.randn(8, 16)
    CHECKPOINT["reentrant"] = reentrant

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        CHECKPOINT["on"] = i in when
        xi = x.clone().requires_grad_(reentrant)  # (a reentrant checkpoint needs an input that requires grad)
        out = _train(model, xi, enter)
        return out, *(p.grad for p in model.parameters())

    try:
        run(Net, step, 4, recordings)
    finally:
        CHECKPOINT["on"] = False


def test_a_block_checkpointed_in_an_eval_step_without_grad(recordings: list[Any]) -> None:
    """Without grad the blocks run plainly (no backward, nothing recomputed): the program
    recorded in training serves, and settled steps record nothing."""
    x = torch.randn(8, 16)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        CHECKPOINT["on"] = True
        if i % 2:
            with torch.no_grad(), enter(BF16):
                return model(x)
        return _train(model, x, enter)

    try:
        run(Net, step, 4, recordings)
    finally:
        CHECKPOINT["on"] = False


@pytest.mark.parametrize("when", [(1,), (0, 2)], ids=["once", "alternating"])
def test_a_block_checkpointed_from_some_step_on_measured(
    when: tuple[int, ...], recordings: list[Any], measuring: Any
) -> None:
    """The same with the whole-call check run (the fake clock: the mixed program wins)."""
    x = torch.randn(8, 16)

    def step(model: nn.Module, i: int, enter: Enter) -> Any:
        CHECKPOINT["on"] = i in when
        return _train(model, x, enter), *(p.grad for p in model.parameters())

    try:
        run(Net, step, 4, recordings, measured=True)
    finally:
        CHECKPOINT["on"] = False


@pytest.mark.parametrize("verdict", ["fp32", "low"])
@pytest.mark.parametrize("when", [(2,), (1, 3, 5)], ids=["once", "alternating"])
def test_a_block_checkpointed_under_a_fixed_verdict(
    verdict: str, when: tuple[int, ...], recordings: list[Any], measuring: Any
) -> None:
    """A whole-call verdict of float32 (autocast off for the whole root, the checkpoint too)
    or of the O1 lists: each step after the check equals that fixed choice (a copy of the
    weights run under it), in backward too, and the settled steps record nothing.  Where a
    checkpoint first appears under a float32 verdict recorded without one, its calls run in
    its autocast state for that call (the recompute cannot be switched) and the root records
    again at its next call, run as recording calls run (before: ``CheckpointError`` in
    backward)."""
    measuring.ms[f"root-{verdict}"] = 0.25
    x = torch.randn(8, 16)
    torch.manual_seed(0)
    model, reference = Net(), Net()
    names = [n for n, _ in model.named_parameters()]
    fixed_region = (
        (lambda: torch.autocast("cpu", enabled=False))
        if verdict == "fp32"
        else (lambda: torch.autocast("cpu", dtype=BF16))
    )
    try:
        for i in range(8):
            if i == 6:
                recordings.clear()
            CHECKPOINT["on"] = i in when
            reference.load_state_dict(model.state_dict())
            got = _train(model, x, lambda d: ampcore.autocast("cpu", level="auto", dtype=d))
            _clean(model)
            want = _train(reference, x, lambda d: fixed_region())
            if i >= 2:  # (the check ran at step 1)
                # the checkpoint's first step under a float32 verdict (its calls in its autocast state)
                # and the recording after it (the plan call by call, as every recording call)
                tol = 2e-2 if verdict == "fp32" and when == (2,) and i in (2, 3) else 0.0
                assert tol or got.dtype == want.dtype, i
                torch.testing.assert_close(got, want, rtol=tol, atol=tol, check_dtype=not tol, msg=f"step {i}")
                for n, p, q in zip(names, model.parameters(), reference.parameters(), strict=True):
                    torch.testing.assert_close(p.grad, q.grad, rtol=tol, atol=tol, msg=f"step {i} {n}")
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)
    finally:
        CHECKPOINT["on"] = False
    assert recordings == []
