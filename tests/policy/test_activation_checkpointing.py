"""Issue 15, item 1: activation checkpointing recomputes under the region's policy.

torch.utils.checkpoint re-enters torch.autocast with the saved flags during backward; the
recomputation must also see ampcore's custom lists and level, bit for bit."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

import ampcore

from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)

REGIONS = {
    "black-linear": dict(custom_black_list={"linear"}),
    "white-gelu": dict(custom_white_list={"gelu", "add"}),
    "OD": dict(level="OD"),
    "O2": dict(level="O2"),
    "O1": dict(),
}


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 8), torch.nn.Softmax(-1)
    )


def _grads(region: dict[str, object], mode: str) -> list[torch.Tensor]:
    net = _net()
    torch.manual_seed(1)
    x = torch.randn(4, 8, requires_grad=True)
    with ampcore.autocast(device="cpu", **region):  # type: ignore[arg-type]
        if mode == "plain":
            y = net(x)
        elif mode == "non-reentrant":
            y = checkpoint(net, x, use_reentrant=False)
        elif mode == "reentrant":
            y = checkpoint(net, x, use_reentrant=True)
        else:  # selective activation checkpointing: save the matrix products' outputs
            policy = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.mm.default, torch.ops.aten.addmm.default])
            y = checkpoint(net, x, use_reentrant=False, context_fn=policy)
    (y.float() * torch.arange(8.0)).sum().backward()
    return [x.grad, *(p.grad for p in net.parameters())]  # type: ignore[list-item]


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant", "selective"])
@pytest.mark.parametrize("region", sorted(REGIONS))
def test_checkpointed_grads_equal_plain_ones(region: str, mode: str) -> None:
    plain = _grads(REGIONS[region], "plain")
    checkpointed = _grads(REGIONS[region], mode)
    for want, got in zip(plain, checkpointed):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_issue_reproduction_non_reentrant_custom_black_linear() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    with ampcore.autocast(device="cpu", custom_black_list={"linear"}):
        y = checkpoint(net, x, use_reentrant=False)
    y.float().sum().backward()  # CheckpointError before the fix
    assert x.grad is not None


def test_checkpoint_outside_regions_is_untouched() -> None:
    net = _net()
    x = torch.randn(4, 8, requires_grad=True)
    y = checkpoint(net, x, use_reentrant=False)
    y.sum().backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = checkpoint(net, x, use_reentrant=True)
        want = net(x)
    assert z.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(z, want, rtol=0, atol=0)
