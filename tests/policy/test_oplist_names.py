"""Op names: canonical ATen names, Paddle aliases, overloads, validation errors."""

from __future__ import annotations

import pytest

from ampcore import AmpcoreError
from ampcore._op_names import (
    NO_CAST_OPS,
    PADDLE_ALIASES,
    all_aten_names,
    canonical_op,
    canonical_ops,
    functional_overloads,
    generated_overloads,
    is_composite,
)

CANONICAL = [
    # (given, canonical)
    ("add", "add"),
    ("aten::add", "add"),
    ("add.Tensor", "add"),
    ("elementwise_add", "add"),
    ("elementwise_mul", "mul"),
    ("matmul_v2", "matmul"),
    ("matmul", "matmul"),
    ("reduce_sum", "sum"),
    ("reduce_mean", "mean"),
    ("lookup_table_v2", "embedding"),
    ("lookup_table", "embedding"),
    ("softmax_with_cross_entropy", "cross_entropy_loss"),
    ("sigmoid_cross_entropy_with_logits", "binary_cross_entropy_with_logits"),
    ("layer_norm", "layer_norm"),
    ("conv2d", "conv2d"),
    ("mul", "mul"),  # ATen's elementwise mul wins over Paddle's legacy matrix-product 'mul'
    ("sum", "sum"),
]

ERRORS = [
    # (given, words the message must contain)
    ("linaer", ["unknown op 'linaer'", "'linear'"]),
    ("elementwise_addd", ["unknown op", "'elementwise_add'"]),
    ("add_", ["no functional overload", "list 'add' instead"]),
    ("transpose", ["no functional overload"]),
    ("", ["non-empty strings"]),
    (3, ["non-empty strings"]),
]


@pytest.mark.parametrize(("given", "expected"), CANONICAL)
def test_canonical_names(given: str, expected: str) -> None:
    assert canonical_op(given) == expected


@pytest.mark.parametrize(("given", "words"), ERRORS)
def test_invalid_names_raise_with_hints(given: object, words: list[str]) -> None:
    with pytest.raises(AmpcoreError) as info:
        canonical_op(given, "ampcore.autocast", "custom_black_list")
    message = str(info.value)
    assert message.startswith("ampcore.autocast(custom_black_list=...)")
    for word in words:
        assert word in message


def test_every_alias_targets_a_castable_aten_op_and_shadows_none() -> None:
    names = all_aten_names()
    for alias, target in PADDLE_ALIASES.items():
        assert alias not in names, f"alias {alias!r} is an ATen name: ATen would win, the alias is dead"
        assert functional_overloads(target), f"alias {alias!r} -> {target!r} has no castable overload"


OVERLOADS = [
    # (op, must contain, must not contain)
    ("add", {"add.Tensor", "add.Scalar"}, {"add.out", "add_.Tensor"}),
    ("mm", {"mm"}, {"mm.out"}),
    ("softmax", {"softmax.int"}, {"softmax.int_out"}),
]


@pytest.mark.parametrize(("op", "present", "absent"), OVERLOADS)
def test_functional_overloads(op: str, present: set[str], absent: set[str]) -> None:
    overloads = set(functional_overloads(op))
    assert present <= overloads
    assert not absent & overloads


def test_generated_set_skips_no_cast_views_and_inplace() -> None:
    generated = set(generated_overloads())
    assert {"add.Tensor", "relu", "mm", "index_copy"} <= generated
    assert "softmax.int" in generated  # composite, but takes dtype=: kept to honour it
    for name in ("einsum", "nll_loss_nd", "layer_norm"):  # composites fall through to their ops
        # unless a backend has a kernel of its own for it (IPEX 2.8's for layer_norm on the CPU)
        assert (name in generated) == (not is_composite(name))
    for name in ("clone", "_to_copy", "isnan", "transpose_copy.int", "_foreach_add.List", "add_.Tensor", "view"):
        assert name not in generated
    assert all(o.partition(".")[0] not in NO_CAST_OPS for o in generated)


def test_canonical_ops_accepts_sets_lists_strings_and_none() -> None:
    assert canonical_ops(None) == frozenset()
    assert canonical_ops("elementwise_add") == frozenset({"add"})
    assert canonical_ops(["add", "elementwise_add", "mm"]) == frozenset({"add", "mm"})
    with pytest.raises(AmpcoreError, match="expected a set or list of op names"):
        canonical_ops(3)  # type: ignore[arg-type]
