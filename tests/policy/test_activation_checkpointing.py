"""Issue 15, item 1: activation checkpointing recomputes under the region's policy.

torch.utils.checkpoint re-enters torch.autocast with the saved flags during backward; the
recomputation must also see ampcore's custom lists and level, bit for bit."""

from __future__ import annotations

import functools

import pytest
import torch
from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

import ampcore

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
            policy = functools.partial(
                create_selective_checkpoint_contexts, [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]
            )
            y = checkpoint(net, x, use_reentrant=False, context_fn=policy)
    (y.float() * torch.arange(8.0)).sum().backward()
    return [x.grad, *(p.grad for p in net.parameters())]  # type: ignore[list-item]


@functools.cache
def _selective_checkpointing_loses_layer_norm_grads() -> str | None:
    """Why selective checkpointing of ``nn.LayerNorm`` loses its input's gradient in this
    process with neither autocast nor ampcore involved, or None when it does not.  It does
    with IPEX 2.8 imported: IPEX registers a CPU kernel for ``aten::layer_norm`` (torch: a
    CompositeImplicitAutograd op, no kernel of its own), so the op has no autograd kernel and
    runs through torch's autograd fallback, whose output under the selective-checkpointing
    dispatch mode gives no gradient to its inputs (docs/backends.md, IPEX)."""
    x = torch.randn(2, 4, requires_grad=True)
    policy = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.mm.default])
    checkpoint(torch.nn.LayerNorm(4), x, use_reentrant=False, context_fn=policy).sum().backward()
    if x.grad is not None:
        return None
    dump = torch._C._dispatch_dump("aten::layer_norm").splitlines()
    kernel = next((line for line in dump if line.startswith("CPU:")), "")
    return (
        "plain torch (no autocast, no ampcore) loses nn.LayerNorm's input gradient under selective checkpointing "
        f"here: aten::layer_norm has a CPU kernel and no autograd kernel ({kernel.partition(' :: ')[0] or 'none'}; "
        "IPEX 2.8 registers it)"
    )


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant", "selective"])
@pytest.mark.parametrize("region", sorted(REGIONS))
def test_checkpointed_grads_equal_plain_ones(region: str, mode: str) -> None:
    reason = _selective_checkpointing_loses_layer_norm_grads() if mode == "selective" else None
    if reason:
        pytest.skip(reason)
    plain = _grads(REGIONS[region], "plain")
    checkpointed = _grads(REGIONS[region], mode)
    for want, got in zip(plain, checkpointed, strict=False):
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


# -- issue 28, row 16: a reentrant recomputation's inputs stay out of the weight-cast cache


class _ResidualBlock(torch.nn.Module):
    """A CNN block whose input feeds both the main conv and the shortcut conv."""

    def __init__(self) -> None:
        super().__init__()
        self.main = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.shortcut = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.main(x)) + self.shortcut(x)


def _stem_grads(region: dict[str, object], mode: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    stem, block = torch.nn.Parameter(torch.rand(1, 8, 1, 1) + 0.5), _ResidualBlock()  # a float32 stem
    torch.manual_seed(1)
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    with ampcore.autocast(device="cpu", **region):  # type: ignore[arg-type]
        h = x * stem  # the block's float32 input: computed, not a leaf
        y = block(h) if mode == "plain" else checkpoint(block, h, use_reentrant=mode == "reentrant")
    (y.float() ** 2).sum().backward()
    return [stem.grad, x.grad]  # type: ignore[list-item]


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
@pytest.mark.parametrize("region", ["OD", "O1", "black-linear"])
def test_a_block_input_used_twice_is_cast_per_use_in_the_recomputation(region: str, mode: str) -> None:
    # reentrant recomputation detaches the input into a leaf that requires grad: the cast
    # cache took it for a weight, both convs shared one bf16 cast and the stem's gradients
    # were summed in bf16 (up to 2.4e-4 off)
    plain = _stem_grads(REGIONS[region], "plain")
    for want, got in zip(plain, _stem_grads(REGIONS[region], mode), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_several_checkpointed_steps_under_custom_lists_equal_plain_ones() -> None:
    # docs/integrations.md used to list this as a known limit: the recomputation's casts
    # of the weights outlived it and the next step's forward reused them
    def losses(checkpointed: bool) -> list[float]:
        net = _net()
        opt = torch.optim.SGD(net.parameters(), lr=0.5)
        torch.manual_seed(1)
        x = torch.randn(4, 8, requires_grad=True)
        out = []
        for _ in range(4):
            with ampcore.autocast(device="cpu", custom_white_list={"gelu", "add"}):
                y = checkpoint(net, x, use_reentrant=True) if checkpointed else net(x)
                loss = (y.float() * torch.arange(8.0)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    assert losses(True) == losses(False)
