"""Operator statistics: exact per-op counts by output dtype on known models."""

from __future__ import annotations

import io
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ampcore
import ampcore.debugging as dbg

pytestmark = pytest.mark.usefixtures("no_emulation_warning")


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))


def _row(bf16: int = 0, fp32: int = 0, fp16: int = 0, other: int = 0) -> dict[str, int]:
    return {"fp32": fp32, "fp16": fp16, "bf16": bf16, "other": other}


def test_linear_relu_linear_under_bf16_autocast_counts_exactly() -> None:
    net, x = _mlp(), torch.randn(2, 4)
    with dbg.collect_operator_stats() as stats, torch.no_grad():
        with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
            out = net(x)
    assert out.dtype == torch.bfloat16
    # Casts: the input, then weight and bias of each Linear (the second Linear's input is
    # already bfloat16).  Each Linear is t + addmm.
    assert stats.counts == {
        "_to_copy": _row(bf16=5),
        "t": _row(bf16=2),
        "addmm": _row(bf16=2),
        "relu": _row(bf16=1),
    }
    assert stats.total() == stats.total("bf16") == 10


def test_the_same_model_in_float32_counts_fp32_only() -> None:
    net, x = _mlp(), torch.randn(2, 4)
    with dbg.collect_operator_stats() as stats, torch.no_grad():
        net(x)
    assert stats.counts == {"t": _row(fp32=2), "addmm": _row(fp32=2), "relu": _row(fp32=1)}


def test_fp32_list_ops_and_integer_outputs_land_in_their_buckets() -> None:
    lin, x, target = nn.Linear(4, 3), torch.randn(2, 4), torch.zeros(2, 3)
    with dbg.collect_operator_stats() as stats, torch.no_grad():
        with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
            y = lin(x)
            loss = F.mse_loss(y, target)  # on the CPU fp32 list: y is cast back up
            index = y.argmax(-1)
    assert (y.dtype, loss.dtype, index.dtype) == (torch.bfloat16, torch.float32, torch.int64)
    assert stats.counts["_to_copy"] == _row(bf16=3, fp32=1)
    assert stats.counts["mse_loss"] == _row(fp32=1)
    assert stats.counts["argmax"] == _row(other=1)


def test_float16_counts() -> None:
    net, x = _mlp(), torch.randn(2, 4)
    with dbg.collect_operator_stats() as stats, torch.no_grad():
        with ampcore.autocast(device="cpu", dtype=torch.float16):
            net(x)
    assert stats.counts["addmm"] == _row(fp16=2)
    assert stats.total("bf16") == stats.total("fp32") == 0


def test_backward_ops_are_counted() -> None:
    net, x = _mlp(), torch.randn(2, 4)
    with dbg.collect_operator_stats() as stats:
        with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
            loss = net(x).float().sum()
        loss.backward()
    assert stats.counts["threshold_backward"] == _row(bf16=1)
    assert stats.counts["mm"]["bf16"] >= 3  # weight and input gradients of the Linears


def test_sees_the_ops_inside_multihead_attention(attention: tuple[nn.Module, torch.Tensor]) -> None:
    net, x = attention  # train mode with grad: MultiheadAttention takes its composite path
    with dbg.collect_operator_stats() as stats:
        with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
            net(x)
    for op in ("addmm", "bmm", "_softmax"):
        assert op in stats.counts, sorted(stats.counts)
    assert stats.counts["bmm"]["bf16"] == 2  # q @ k^T and attention @ v


def test_table_lists_every_op_with_its_counts_and_a_total() -> None:
    net, x = _mlp(), torch.randn(2, 4)
    with dbg.collect_operator_stats() as stats, torch.no_grad():
        with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
            net(x)
    lines = stats.table().splitlines()
    assert lines[0].split("|")[1:] == ["   FP32 calls ", "   FP16 calls ", "   BF16 calls ", "  other calls"]
    rows = {line.split("|")[0].strip(): [int(c) for c in line.split("|")[1:]] for line in lines[2:]}
    assert rows == {
        "_to_copy": [0, 0, 5, 0],
        "addmm": [0, 0, 2, 0],
        "relu": [0, 0, 1, 0],
        "t": [0, 0, 2, 0],
        "total": [0, 0, 10, 0],
    }
    assert list(rows) == ["_to_copy", "addmm", "relu", "t", "total"]
    buffer = io.StringIO()
    stats.print(file=buffer)
    assert buffer.getvalue() == stats.table() + "\n"


def test_enable_and_disable_print_and_return_the_stats(capsys: pytest.CaptureFixture[str]) -> None:
    a = torch.ones(2, 2)
    dbg.enable_operator_stats_collection()
    try:
        torch.mm(a, a)
    finally:
        stats = dbg.disable_operator_stats_collection()
    assert stats.counts == {"mm": _row(fp32=1)}
    assert capsys.readouterr().out == stats.table() + "\n"
    torch.mm(a, a)  # no longer counted
    assert stats.total() == 1


def test_disable_without_enable_raises() -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"disable_operator_stats_collection\(\): no collection"):
        dbg.disable_operator_stats_collection()


def test_ops_of_other_threads_are_not_counted() -> None:
    a = torch.ones(2, 2)
    worker = threading.Thread(target=lambda: torch.mm(a, a))
    with dbg.collect_operator_stats() as stats:
        worker.start()
        worker.join()
        a + 1
    assert set(stats.counts) == {"add"}


def test_the_numerics_checker_inside_does_not_inflate_the_counts() -> None:
    net, x = _mlp(), torch.randn(2, 4)
    with dbg.collect_operator_stats() as plain, torch.no_grad():
        net(x)
    with dbg.collect_operator_stats() as outer, dbg.check_numerics(), torch.no_grad():
        net(x)
    assert outer.counts == plain.counts
