"""The debugging tools under bad input (issue 12): misspelled op overloads, models that
change their input in place."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ampcore
import ampcore.debugging as dbg

pytestmark = pytest.mark.filterwarnings("ignore:.*runs emulated.*:ampcore.AmpcoreWarning")


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        (["exp.defualt"], r"unknown overload 'exp.defualt'.*did you mean 'exp.default'"),
        (["add.bogus"], r"unknown overload 'add.bogus'.*add.Tensor"),
        (["aten::exp.defualt"], r"unknown overload"),
        (["EXP"], r"unknown op 'EXP'.*did you mean 'exp'"),
    ],
)
def test_check_numerics_refuses_misspelled_overloads(ops: list[str], expected: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=expected):
        dbg.check_numerics(ops=ops)
    with pytest.raises(ampcore.AmpcoreError, match=expected.replace("ops=", "skip_ops=")):
        dbg.check_numerics(skip_ops=ops)


@pytest.mark.parametrize("ops", [["exp.default"], ["add.Tensor"], ["aten::softmax.int"], ["exp"]])
def test_check_numerics_takes_real_overloads(ops: list[str]) -> None:
    dbg.check_numerics(ops=ops)


def test_check_numerics_with_the_default_overload_checks_it() -> None:
    with pytest.raises(dbg.NumericsError, match="exp"), dbg.check_numerics(ops=["exp.default"]):
        torch.exp(torch.tensor([1000.0]))


class InPlace(nn.Module):
    """An ordinary layer behind an in-place change of the input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.fc(x)


def test_compare_accuracy_gives_each_run_the_callers_input() -> None:
    torch.manual_seed(0)
    model = InPlace().eval()
    x = torch.randn(8, 4)
    original = x.clone()
    report = dbg.compare_accuracy(model, x, device="cpu", dtype=torch.bfloat16)
    assert torch.equal(x, original)  # the caller's input is untouched
    assert max(r.max_rel_error for r in report.rows) < 0.05  # bf16 rounding, not a 2x input


def test_compare_accuracy_clones_nested_inputs() -> None:
    class Net(nn.Module):
        def forward(self, pair: tuple[torch.Tensor, torch.Tensor], scale: dict[str, torch.Tensor]) -> torch.Tensor:
            pair[0].add_(1)
            scale["s"].mul_(3)
            return pair[0] * scale["s"] + pair[1]

    a, b, s = torch.ones(2), torch.ones(2), torch.ones(2)
    report = dbg.compare_accuracy(Net(), ((a, b), {"s": s}), device="cpu", dtype=torch.bfloat16)
    assert torch.equal(a, torch.ones(2)) and torch.equal(s, torch.ones(2))
    assert report.rows[0].max_rel_error == 0.0


def test_disable_operator_stats_checks_print_table_before_stopping() -> None:
    dbg.enable_operator_stats_collection()
    with pytest.raises(ampcore.AmpcoreError, match=r"print_table='no'\): expected True or False"):
        dbg.disable_operator_stats_collection(print_table="no")  # type: ignore[arg-type]
    assert dbg.disable_operator_stats_collection(print_table=False) is not None  # still running
