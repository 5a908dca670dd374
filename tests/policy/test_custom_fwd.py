"""ampcore.custom_fwd / custom_bwd: device from the region, backward under the forward's policy."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)

import ampcore

BF16, FP32 = torch.bfloat16, torch.float32


def _function(cast_inputs: torch.dtype | None, seen: dict[str, Any], **device: Any) -> type[torch.autograd.Function]:
    """A custom function recording the dtypes its forward and backward ops ran in."""

    class MatmulAdd(torch.autograd.Function):
        @staticmethod
        @ampcore.custom_fwd(cast_inputs=cast_inputs, **device)
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, w)
            out = torch.mm(x, w)
            seen["forward mm"] = out.dtype
            seen["forward add"] = (x + x).dtype
            return out

        @staticmethod
        @ampcore.custom_bwd
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, w = ctx.saved_tensors
            seen["backward mm"] = torch.mm(grad.float(), w.float().t()).dtype
            seen["backward add"] = (grad.float() + grad.float()).dtype
            return torch.mm(grad.to(x.dtype), w.t().to(x.dtype)), torch.mm(x.t().to(grad.dtype), grad).to(w.dtype)

    return MatmulAdd


X = torch.randn(4, 4, requires_grad=True)
W = torch.randn(4, 4, requires_grad=True)


# (region arguments, cast_inputs, expected dtypes seen)
CASES = [
    (
        {"custom_white_list": {"add"}},
        None,
        {"forward mm": BF16, "forward add": BF16, "backward mm": BF16, "backward add": BF16},
    ),
    ({}, None, {"forward mm": BF16, "forward add": FP32, "backward mm": BF16, "backward add": FP32}),
    ({}, FP32, {"forward mm": FP32, "forward add": FP32, "backward mm": FP32, "backward add": FP32}),
    (
        {"custom_black_list": {"mm"}},
        None,
        {"forward mm": FP32, "forward add": FP32, "backward mm": FP32, "backward add": FP32},
    ),
]


@pytest.mark.parametrize(("region", "cast_inputs", "expected"), CASES)
def test_forward_and_backward_follow_the_region(
    region: dict[str, Any], cast_inputs: Any, expected: dict[str, Any]
) -> None:
    seen: dict[str, Any] = {}
    fn = _function(cast_inputs, seen)
    with ampcore.autocast(device="cpu", **region):
        out = fn.apply(X, W)
    out.float().sum().backward()  # outside the region: custom_bwd re-enters it
    assert seen == expected
    assert X.grad is not None and X.grad.dtype == FP32 and W.grad is not None and W.grad.dtype == FP32
    X.grad = W.grad = None


def test_outside_any_region_it_is_a_no_op() -> None:
    seen: dict[str, Any] = {}
    out = _function(FP32, seen).apply(X, W)
    out.sum().backward()
    assert set(seen.values()) == {FP32}
    X.grad = W.grad = None


def test_explicit_device_and_plain_torch_autocast_forward() -> None:
    seen: dict[str, Any] = {}
    fn = _function(None, seen, device="cpu")
    with torch.autocast("cpu", dtype=BF16):
        out = fn.apply(X, W)
    out.float().sum().backward()
    assert seen == {"forward mm": BF16, "forward add": FP32, "backward mm": BF16, "backward add": FP32}
    X.grad = W.grad = None


def test_same_results_as_torch_amp_decorators() -> None:
    def make(fwd_deco: Any, bwd_deco: Any) -> type[torch.autograd.Function]:
        class Scale(torch.autograd.Function):
            @staticmethod
            @fwd_deco
            def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
                return torch.mm(x, x) * 3

            @staticmethod
            @bwd_deco
            def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
                return grad * 3

        return Scale

    ours = make(ampcore.custom_fwd(cast_inputs=FP32), ampcore.custom_bwd)
    theirs = make(torch.amp.custom_fwd(device_type="cpu", cast_inputs=FP32), torch.amp.custom_bwd(device_type="cpu"))
    x = torch.randn(3, 3)
    with ampcore.autocast(device="cpu"):
        a = ours.apply(x)
    with torch.autocast("cpu", dtype=BF16):
        b = theirs.apply(x)
    assert a.dtype == b.dtype == FP32
    torch.testing.assert_close(a, b)
