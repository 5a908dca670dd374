"""Levels OD and O2 (op side): what every op runs in, gradients, nesting with O1."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from _policy_testing import DtypeRecorder, no_lingering_kernels  # noqa: F401 (autouse fixture)
from torch import nn

import ampcore
from ampcore._op_names import NO_CAST_OPS, castable_overloads
from ampcore._policy.registration import Route, registered_keys, routes

BF16, FP32 = torch.bfloat16, torch.float32
X = torch.randn(8, 16)
W = torch.randn(16, 16)
LOW = X.to(BF16)


# (op, call, dtype under OD, dtype under O2), bfloat16 on CPU
LEVEL_CASES: list[tuple[str, Callable[[], torch.Tensor], torch.dtype, torch.dtype]] = [
    ("mm", lambda: torch.mm(X, W), BF16, BF16),
    ("linear", lambda: F.linear(X, W), BF16, BF16),
    ("relu of low", lambda: torch.relu(LOW), FP32, BF16),
    ("relu of fp32", lambda: torch.relu(X), FP32, BF16),
    ("add", lambda: X + LOW, FP32, BF16),
    ("add scalar", lambda: LOW + 1.0, FP32, BF16),
    ("gelu", lambda: F.gelu(LOW), FP32, BF16),
    ("softmax", lambda: F.softmax(LOW, -1), FP32, BF16),
    ("layer_norm", lambda: F.layer_norm(LOW, (16,)), FP32, BF16),
    ("cat (promote)", lambda: torch.cat([X, LOW]), FP32, BF16),
    ("mse_loss (black)", lambda: F.mse_loss(LOW, LOW), FP32, FP32),
    ("sum with dtype", lambda: LOW.sum(dtype=torch.float64), torch.float64, torch.float64),
    ("softmax with dtype (composite)", lambda: F.softmax(LOW, -1, dtype=FP32), FP32, FP32),
    ("nll_loss inside nll_loss_nd", lambda: F.nll_loss(LOW, torch.zeros(8, dtype=torch.long)), FP32, FP32),
    ("cross_entropy (black)", lambda: F.cross_entropy(LOW, torch.zeros(8, dtype=torch.long)), FP32, FP32),
    ("einsum: its bmm is white", lambda: torch.einsum("ij,jk->ik", X, W), BF16, BF16),
    ("explicit cast", lambda: X.to(BF16), BF16, BF16),
    ("view keeps its base", lambda: LOW.view(-1), BF16, BF16),
    ("in-place keeps its tensor", lambda: X.clone().mul_(2), FP32, FP32),
    ("float64 untouched", lambda: torch.relu(X.double()), torch.float64, torch.float64),
    ("integers untouched", lambda: torch.arange(4) + 1, torch.int64, torch.int64),
]


@pytest.mark.parametrize(("name", "call", "od", "o2"), LEVEL_CASES, ids=[c[0] for c in LEVEL_CASES])
def test_level_output_dtypes(name: str, call: Callable[[], torch.Tensor], od: torch.dtype, o2: torch.dtype) -> None:
    with ampcore.autocast(device="cpu", level="OD"):
        assert call().dtype == od
    with ampcore.autocast(device="cpu", level="O2"):
        assert call().dtype == o2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _recorded_step(level: str) -> tuple[DtypeRecorder, torch.Tensor, torch.Tensor]:
    model = _model()
    with ampcore.autocast(device="cpu", level=level):
        with DtypeRecorder() as recorder:
            out = model(X)
            loss = F.mse_loss(out, torch.zeros_like(out))
    return recorder, out, loss


def test_od_only_white_list_ops_produce_low_precision() -> None:
    lists = ampcore.oplists("cpu", level="OD")
    recorder, _, _ = _recorded_step("OD")
    low = {c.op.partition(".")[0] for c in recorder.calls if BF16 in c.outputs}
    views = {"t", "view", "transpose", "expand", "_unsafe_view"}
    assert low - views - NO_CAST_OPS <= lists.white
    assert {"addmm"} <= low  # the matmuls did run in bfloat16


def test_o2_runs_everything_low_except_the_black_list() -> None:
    lists = ampcore.oplists("cpu", level="O2")
    recorder, out, loss = _recorded_step("O2")
    assert out.dtype == BF16 and loss.dtype == FP32
    fp32 = {c.op.partition(".")[0] for c in recorder.calls if c.inputs and FP32 in c.inputs}
    assert fp32 <= lists.black | NO_CAST_OPS


@pytest.mark.parametrize("level", ["OD", "O2"])
def test_gradients_match_fp32_within_bf16_tolerance(level: str) -> None:
    model = _model()
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    F.mse_loss(model(x), y).backward()
    reference = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()
    with ampcore.autocast(device="cpu", level=level):
        loss = F.mse_loss(model(x).float(), y)
    loss.backward()
    for param, want in zip(model.parameters(), reference, strict=False):
        assert param.grad is not None and param.grad.dtype == FP32
        torch.testing.assert_close(param.grad, want, rtol=5e-2, atol=5e-2)


def test_custom_lists_apply_on_top_of_a_level() -> None:
    with ampcore.autocast(device="cpu", level="OD", custom_white_list={"gelu"}):
        assert F.gelu(X).dtype == BF16
        assert torch.relu(LOW).dtype == FP32
    with ampcore.autocast(device="cpu", level="O2", custom_black_list={"gelu"}):
        assert F.gelu(LOW).dtype == FP32
        assert torch.relu(X).dtype == BF16


def test_o1_nested_in_od_is_native_and_od_comes_back() -> None:
    with ampcore.autocast(device="cpu", level="OD"):
        assert torch.relu(LOW).dtype == FP32
        with ampcore.autocast(device="cpu", level="O1"):
            assert torch.relu(LOW).dtype == BF16  # follows its input, as in torch.autocast
            assert torch.mm(X, W).dtype == BF16
        assert torch.relu(LOW).dtype == FP32


def test_levels_use_the_shadow_route_and_o0_switches_nothing_on() -> None:
    with ampcore.autocast(device="cpu", level="O2"):
        assert routes()["cpu"] == Route("cpu", "AutocastIPU", resident=False)
        assert 0 < registered_keys()["AutocastIPU"] < len(castable_overloads())  # the ops O2 changes
        assert torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.AutocastIPU)
    assert not torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.AutocastIPU)
    with ampcore.autocast(device="cpu", level="O0", custom_white_list={"add"}):
        assert not torch.is_autocast_enabled("cpu")
        assert not torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.AutocastIPU)
        assert (X + X).dtype == FP32


def test_od_in_one_thread_leaves_torch_autocast_native_in_another() -> None:
    import threading

    inside, done = threading.Event(), threading.Event()
    seen: dict[str, torch.dtype] = {}

    def other() -> None:
        inside.wait(5)
        with torch.autocast("cpu", dtype=BF16):
            seen["relu of low"] = torch.relu(LOW).dtype
            seen["scalar add"] = (LOW + 1.0).dtype
            seen["einsum"] = torch.einsum("ij,jk->ik", X, W).dtype  # composite: its bmm is cast
            seen["cat"] = torch.cat([X, LOW]).dtype
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with ampcore.autocast(device="cpu", level="OD"):
        inside.set()
        done.wait(5)
        assert torch.relu(LOW).dtype == FP32
    thread.join()
    with torch.autocast("cpu", dtype=BF16):
        native = {
            "relu of low": torch.relu(LOW).dtype,
            "scalar add": (LOW + 1.0).dtype,
            "einsum": torch.einsum("ij,jk->ik", X, W).dtype,
            "cat": torch.cat([X, LOW]).dtype,
        }
    assert seen == native == {"relu of low": BF16, "scalar add": BF16, "einsum": BF16, "cat": FP32}


@pytest.mark.parametrize("level", ["OD", "O2"])
def test_batch_norm_running_statistics_still_update(level: str) -> None:
    """Batch-norm kernels update running statistics in place without saying so in their
    schema: a cast would update a copy. Under OD and O2 the statistics must move as in fp32."""
    torch.manual_seed(0)
    conv, bn = torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3)
    reference = torch.nn.BatchNorm2d(3)
    x = torch.randn(8, 3, 5, 5) + 3
    with ampcore.autocast(device="cpu", level=level):
        bn(conv(x))
    reference(conv(x))
    assert bn.running_mean.dtype == torch.float32
    assert not torch.equal(bn.running_mean, torch.zeros(3))
    torch.testing.assert_close(bn.running_mean, reference.running_mean, atol=0.05, rtol=0.05)
    torch.testing.assert_close(bn.running_var, reference.running_var, atol=0.05, rtol=0.05)
