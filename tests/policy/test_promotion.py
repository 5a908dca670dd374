"""The ops the inner policy leaves to their own type promotion (issue 26: they need no kernel)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ampcore._policy.decisions import _op
from ampcore._policy.promotion import TYPE_PROMOTING_POINTWISE, promotes_natively

BF16, FP32 = torch.bfloat16, torch.float32


def _arguments(overload: str, dtypes: tuple[torch.dtype, torch.dtype]) -> list[Any]:
    """Positional arguments for ``overload``: tensors alternating ``dtypes``, the rest 1."""
    values: list[Any] = []
    for argument in _op(overload)._schema.arguments:
        if argument.kwarg_only:
            break
        if "Tensor" in str(argument.type):  # also an optional one (clamp's min and max)
            values.append(torch.rand(4, 4, dtype=dtypes[len(values) % 2]) + 0.5)
        elif argument.has_default_value():
            break
        else:
            values.append(1)
    return values


@pytest.mark.parametrize("overload", sorted(TYPE_PROMOTING_POINTWISE))
def test_listed_ops_promote_mixed_floating_inputs_themselves(overload: str) -> None:
    """Drift guard: on the installed torch each listed op returns the wider dtype for mixed
    bfloat16/float32 inputs in either order, as autocast's promote step would make it."""
    for dtypes in ((BF16, FP32), (FP32, BF16)):
        result = _op(overload)(*_arguments(overload, dtypes))
        assert result.dtype in (FP32, torch.bool), (overload, dtypes, result.dtype)


@pytest.mark.parametrize(
    ("overload", "expected"),
    [
        ("relu", True),  # one tensor: nothing to reconcile
        ("add.Tensor", True),
        ("mm", False),  # refuses mixed inputs
        ("cat", False),  # a tensor list
        ("lerp.Tensor", False),  # refuses mixed inputs
        ("index_copy", False),  # on torch's promote list
    ],
)
def test_promotes_natively(overload: str, expected: bool) -> None:
    assert promotes_natively(overload, _op(overload)._schema) is expected
