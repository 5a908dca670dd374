"""The accuracy comparison: the planted layer ranks first, healthy models stay small."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import ampcore
import ampcore.debugging as dbg

from .conftest import AttentionNet, PlantedNet

pytestmark = pytest.mark.usefixtures("no_emulation_warning")


def test_the_planted_layer_ranks_first(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    report = dbg.compare_accuracy(net, x, level="O1", device="cpu", dtype=torch.float16)
    first = report.rows[0]
    assert first.module_path == "PlantedNet.blocks.2"
    assert math.isinf(first.max_rel_error)
    assert (first.ref_dtype, first.amp_dtype, first.op) == ("float32", "float16", None)
    assert report.first_bad is first
    # Everything before the overflow is accurate to float16's precision.
    healthy = {r.module_path: r.max_rel_error for r in report.rows if not math.isinf(r.max_rel_error)}
    assert set(healthy) == {"PlantedNet.blocks.0", "PlantedNet.blocks.1", "PlantedNet.blocks.2.proj"}
    assert max(healthy.values()) < 1e-2
    errors = [r.max_rel_error for r in report.rows]
    assert errors == sorted(errors, reverse=True)
    table = report.table()
    assert "PlantedNet.blocks.2 " in table.splitlines()[2] and "<- first over threshold" in table.splitlines()[2]


def test_in_order_lists_inner_modules_before_outer(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    report = dbg.compare_accuracy(net, x, dtype=torch.float16)
    assert [r.module_path for r in report.in_order] == [
        "PlantedNet.blocks.0",
        "PlantedNet.blocks.1",
        "PlantedNet.blocks.2.proj",
        "PlantedNet.blocks.2",
        "PlantedNet.blocks.3",
        "PlantedNet.blocks",
        "PlantedNet",
    ]


def test_per_op_rows_name_the_exp(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    report = dbg.compare_accuracy(net, x, dtype=torch.float16, per_op=True)
    assert report.rows[0].name == "PlantedNet.blocks.2/exp#0"
    assert report.first_bad is report.rows[0]
    ops = {r.name for r in report.rows if r.op is not None}
    assert ops == {
        "PlantedNet.blocks.0/addmm#0",
        "PlantedNet.blocks.1/relu#0",
        "PlantedNet.blocks.2.proj/addmm#0",
        "PlantedNet.blocks.2/exp#0",
        "PlantedNet.blocks.3/addmm#0",
    }  # views (t) and autocast's casts (_to_copy) are left out
    assert report.unmatched == ()


def test_bfloat16_does_not_overflow_but_exp_still_amplifies_rounding(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    report = dbg.compare_accuracy(net, x, dtype=torch.bfloat16)
    assert all(math.isfinite(r.max_rel_error) and r.amp_dtype == "bfloat16" for r in report.rows)
    # exp turns bfloat16's absolute input error (~40 * 2**-9) into a relative output error.
    assert report.rows[0].module_path == "PlantedNet.blocks.2"
    assert 0.01 < report.rows[0].max_rel_error < 0.5
    assert report.rows[-1].max_rel_error < 0.01


def test_relative_error_is_normwise_in_the_max_norm() -> None:
    lin = nn.Linear(8, 8).eval()
    x = torch.randn(4, 8)
    report = dbg.compare_accuracy(lin, x, dtype=torch.bfloat16)
    (row,) = report.rows
    with torch.no_grad():
        ref = lin(x)
        with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
            amp = lin(x).float()
    expected = float((amp - ref).abs().max() / ref.abs().max())
    assert row.max_rel_error == pytest.approx(expected, rel=1e-6)
    assert row.max_abs_error == pytest.approx(float((amp - ref).abs().max()), rel=1e-6)


class _DispatchesMoreUnderAutocast(nn.Module):
    """Under autocast one more ``mm`` of another shape runs first, as torch 2.8 runs a bfloat16
    ``Linear`` on a 3-D input as a ``bmm`` where float32 folds it into an ``mm``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            torch.mm(x.t(), x)
        return torch.mm(x, self.weight).exp()


def test_an_op_only_the_amp_run_dispatches_is_unmatched_and_the_rest_still_pair() -> None:
    torch.manual_seed(0)
    report = dbg.compare_accuracy(_DispatchesMoreUnderAutocast(), torch.randn(4, 8) / 4, device="cpu", per_op=True)
    assert report.unmatched == ("_DispatchesMoreUnderAutocast/mm#0",)  # its own index in the AMP run
    rows = {r.name: r for r in report.rows}
    assert set(rows) == {
        "_DispatchesMoreUnderAutocast",
        "_DispatchesMoreUnderAutocast/mm#0",
        "_DispatchesMoreUnderAutocast/exp#0",
    }
    assert rows["_DispatchesMoreUnderAutocast/mm#0"].note == ""  # paired with the float32 mm of its shape
    assert report.first_bad is None and all(r.max_rel_error < 0.05 for r in report.rows)


def test_multihead_attention_inner_ops_get_rows(attention: tuple[AttentionNet, torch.Tensor]) -> None:
    net, x = attention  # train mode (dropout 0): the composite attention path, not the fused one
    with pytest.warns(ampcore.AmpcoreWarning, match=r"train mode"):
        report = dbg.compare_accuracy(net, x, dtype=torch.bfloat16, per_op=True)
    inner = {r.op for r in report.rows if r.module_path == "AttentionNet.attn" and r.op is not None}
    assert {"bmm", "_softmax", "addmm"} <= inner
    assert report.first_bad is None


def test_a_separate_amp_model_is_matched_by_module_path(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    same = dbg.compare_accuracy(net, x, dtype=torch.float16, amp_model=copy.deepcopy(net))
    alone = dbg.compare_accuracy(net, x, dtype=torch.float16)
    assert [(r.name, r.max_rel_error) for r in same.rows] == [(r.name, r.max_rel_error) for r in alone.rows]
    changed = copy.deepcopy(net)
    with torch.no_grad():
        changed.blocks[2].proj.weight.mul_(0.5)
    report = dbg.compare_accuracy(net, x, dtype=torch.float16, amp_model=changed)
    assert report.first_bad is not None
    assert report.first_bad.module_path == "PlantedNet.blocks.2.proj"  # where the two models part
    assert report.first_bad.max_rel_error == pytest.approx(0.5, abs=0.01)


def test_invalid_calls_raise() -> None:
    lin = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    with pytest.raises(ampcore.AmpcoreError, match=r"compare_accuracy\(level='O0'\)"):
        dbg.compare_accuracy(lin, x, level="O0")
    with pytest.raises(ampcore.AmpcoreError, match=r"level='O7'"):
        dbg.compare_accuracy(lin, x, level="O7")
    with pytest.raises(ampcore.AmpcoreError, match=r"model=function"):
        dbg.compare_accuracy(lambda t: t, x)  # type: ignore[arg-type]
    with pytest.raises(ampcore.AmpcoreError, match=r"threshold=-1"):
        dbg.compare_accuracy(lin, x, threshold=-1)


def test_the_device_comes_from_the_inputs_and_the_mode_is_not_changed() -> None:
    lin = nn.Linear(2, 2).train()
    with pytest.warns(ampcore.AmpcoreWarning, match=r"call model\.eval\(\) first"):
        report = dbg.compare_accuracy(lin, torch.ones(1, 2))
    assert lin.training
    assert (report.device, report.dtype, report.level) == ("cpu", "bfloat16", "O1")


def test_inputs_can_be_positional_or_keyword() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return self.lin(a) + b

    net = Two().eval()
    a, b = torch.ones(1, 2), torch.zeros(1, 2)
    by_position = dbg.compare_accuracy(net, (a, b))
    by_name = dbg.compare_accuracy(net, {"a": a, "b": b})
    assert [r.name for r in by_position.rows] == [r.name for r in by_name.rows]
    assert {r.name for r in by_name.rows} == {"Two", "Two.lin"}
