"""custom_fwd's arguments checked when decorating (issue 12)."""

from __future__ import annotations

import pytest
import torch

import ampcore


def _square(cast_inputs: object) -> type[torch.autograd.Function]:
    class Square(torch.autograd.Function):
        @staticmethod
        @ampcore.custom_fwd(cast_inputs=cast_inputs)  # type: ignore[arg-type]
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return torch.mm(x, x)

        @staticmethod
        @ampcore.custom_bwd
        def backward(ctx, grad):  # type: ignore[no-untyped-def]
            return grad

    return Square


@pytest.mark.parametrize("name", ["float32", "fp32", "torch.float32", " Float32 "])
def test_cast_inputs_takes_dtype_names(name: str) -> None:
    square = _square(name)
    with ampcore.autocast(device="cpu"):
        assert square.apply(torch.randn(3, 3)).dtype == torch.float32


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (torch.int8, r"custom_fwd\(cast_inputs=torch.int8\): not a floating dtype"),
        ("int8", r"custom_fwd\(cast_inputs='int8'\): unknown dtype name"),
        ("flaot32", r"did you mean 'float32'"),
        (32, r"custom_fwd\(cast_inputs=32\): expected a torch.dtype or a dtype name"),
    ],
)
def test_cast_inputs_refuses_what_is_not_a_floating_dtype_when_decorating(value: object, expected: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=expected):
        _square(value)


@pytest.mark.parametrize("device", [5, "cpu:x", ""])
def test_device_is_checked_when_decorating(device: object) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"custom_fwd\(device="):
        ampcore.custom_fwd(lambda ctx, x: x, device=device)  # type: ignore[arg-type]
    with pytest.raises(ampcore.AmpcoreError, match=r"custom_bwd\(device="):
        ampcore.custom_bwd(lambda ctx, x: x, device=device)  # type: ignore[arg-type]


def test_decorating_something_not_callable_is_refused() -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"custom_fwd\(fwd=5\): expected the forward"):
        ampcore.custom_fwd(5)  # type: ignore[call-overload]
