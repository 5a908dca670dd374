"""Issue 27, ninth held-out sweep of ``level="auto"``: a root called both inside and outside
``torch.utils.checkpoint`` (split out of ``test_auto_sweep9.py``).  No wall clock."""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16
from torch import nn

import ampcore

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("first", ["inside", "outside"])
def test_a_root_called_inside_and_outside_a_checkpoint_runs_each_as_there(first: str, reentrant: bool) -> None:
    """A planned call inside ``torch.utils.checkpoint`` follows the autocast state (its
    recompute does); outside, the plan.  A root called in both places (or a twin of the same
    layers: ``checkpoint_sequential`` checkpoints some blocks and not the last) replayed the
    program recorded in the other place: outside a checkpoint a float32 layer ran low, and
    inside one a program's float32 switch made the recompute's dtypes differ
    (``CheckpointError`` out of the user's backward).  (Reentrant: the checkpoint's forward
    runs without grad, a signature of its own already.)"""
    from test_auto_sweep3 import load

    from ampcore._auto._shapes import shape_class

    torch.manual_seed(0)
    root, x = nn.Sequential(nn.Linear(16, 16), nn.GELU()), torch.randn(8, 16)
    with torch.enable_grad():
        load(BF16, {shape_class(root[0], (x.to(d).requires_grad_(),), "cpu"): "fp32" for d in (torch.float32, BF16)})
    inside = [first == "inside"] * 3 + [first != "inside"] * 3
    for checkpointed in inside:
        xi = x.clone().requires_grad_(True)
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            out = torch.utils.checkpoint.checkpoint(root, xi, use_reentrant=reentrant) if checkpointed else root(xi)
        out.float().sum().backward()  # (a CheckpointError where the recompute's dtypes differ)
        assert out.dtype == (BF16 if checkpointed else torch.float32), (first, checkpointed)
