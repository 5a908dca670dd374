"""Op names under bad input (issue 12): categories of unknown ops, overloads in custom
lists, names in the wrong case."""

from __future__ import annotations

import pytest
import torch

import ampcore
from ampcore._op_names import canonical_op

pytestmark = pytest.mark.filterwarnings("ignore:.*runs emulated.*:ampcore.AmpcoreWarning")


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("linaer", r"OpLists.category\('linaer'\): unknown op.*did you mean 'linear'"),
        ("ADD", r"did you mean 'add'"),
        ("add.bogus", r"unknown overload 'add.bogus'.*add.Tensor"),
        (5, r"OpLists.category\(5\): expected an op name"),
    ],
)
def test_category_of_an_unknown_op_raises(op: object, expected: str) -> None:
    lists = ampcore.oplists("cpu")
    with pytest.raises(ampcore.AmpcoreError, match=expected):
        lists.category(op)  # type: ignore[arg-type]


def test_category_of_known_names_aliases_and_overloads() -> None:
    lists = ampcore.oplists("cpu", custom_white_list={"add"})
    assert lists.category("mm") == "white"
    assert lists.category("aten::mm") == "white"
    assert lists.category("elementwise_add") == "white"  # a Paddle alias
    assert lists.category("add.Tensor") == "white"
    assert lists.category("mse_loss") == "black"
    assert lists.category("relu") == lists.unlisted
    assert lists.category("add_") == lists.unlisted  # in-place: never cast, but a real op


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("add.bogus", r"unknown overload 'add.bogus' of op 'add'; its castable overloads: 'add.Scalar', 'add.Tensor'"),
        ("add.out", r"'add.out' cannot be given a precision"),
        ("ADD", r"unknown op 'ADD'; did you mean 'add'"),
        ("Linear", r"did you mean 'linear'"),
    ],
)
def test_custom_list_names_are_checked_to_the_overload(name: str, expected: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=expected):
        ampcore.autocast("cpu", custom_white_list={name})
    assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(ampcore.AmpcoreError, match=expected):
        ampcore.oplists("cpu", custom_black_list=[name])


def test_a_real_overload_in_a_custom_list_names_its_op() -> None:
    assert canonical_op("add.Tensor") == "add"
    assert canonical_op("aten::softmax.int") == "softmax"
    assert canonical_op("mm.default") == "mm"


@pytest.mark.parametrize("name", ["bf16", "bfloat16", "torch.bfloat16"])
def test_oplists_takes_dtype_names_like_autocast(name: str) -> None:
    assert ampcore.oplists("cpu", dtype=name).dtype == torch.bfloat16
    with pytest.raises(ampcore.AmpcoreError, match=r"oplists\(dtype='fp8'\): unknown dtype name"):
        ampcore.oplists("cpu", dtype="fp8")
