"""The numerics checker: the planted float16 overflow, report mode, fp16 range, op filters."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

import ampcore
import ampcore.debugging as dbg

from .conftest import FP16_EXP_LIMIT, PlantedNet

pytestmark = pytest.mark.usefixtures("no_emulation_warning")


def _fp16(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with ampcore.autocast(device="cpu", dtype=torch.float16):
        return net(x)


def _global_hooks() -> int:
    return len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)


def test_the_planted_overflow_is_named_with_op_module_and_inputs(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    with pytest.raises(dbg.NumericsError) as caught, dbg.check_numerics():
        _fp16(net, x)
    error = caught.value
    assert isinstance(error, ampcore.AmpcoreError)
    assert error.op == "exp"
    assert error.module_path == "PlantedNet.blocks.2"
    finding = error.finding
    assert (finding.kind, finding.module_type, finding.autograd_node) == ("nan_inf", "Planted", None)
    assert finding.input_dtypes == ("float16",)
    assert finding.inputs_finite
    (exp_input,) = error.inputs
    assert exp_input.max is not None and exp_input.max > FP16_EXP_LIMIT
    assert finding.outputs[0].dtype == "float16" and finding.outputs[0].posinf > 0
    message = str(error)
    for part in ("aten::exp.default", "PlantedNet.blocks.2 (Planted)", "input 0: float16[16, 8]", "65504"):
        assert part in message


def test_the_float32_run_of_the_same_model_passes(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    with dbg.check_numerics() as checker:
        net(x)
    assert checker.findings == []


def test_raise_mode_stops_at_the_first_op(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    with pytest.raises(dbg.NumericsError), dbg.check_numerics() as checker:
        _fp16(net, x)
    assert [f.op for f in checker.findings] == ["exp"]


def test_report_mode_records_every_finding_and_warns_once(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    with pytest.warns(dbg.NumericsWarning, match=r"aten::exp\.default produced non-finite values") as caught:
        with dbg.check_numerics(raise_on_error=False) as checker:
            out = _fp16(net, x)
    assert len([w for w in caught if issubclass(w.category, dbg.NumericsWarning)]) == 1
    assert not torch.isfinite(out).all()  # the region ran to the end
    ops = [f.op for f in checker.findings]
    assert ops[0] == "exp" and checker.findings[0].inputs_finite
    assert "addmm" in ops[1:]  # the last Linear consumes the infs
    assert not any(f.inputs_finite for f in checker.findings[1:])


def test_check_fp16_range_flags_float32_values_beyond_65504() -> None:
    big = torch.full((3,), 30000.0)
    with pytest.raises(dbg.NumericsError) as caught, dbg.check_numerics(check_fp16_range=True):
        big * 3  # 90000: finite in float32, inf in float16
    finding = caught.value.finding
    assert (finding.kind, finding.op, finding.outputs[0].max) == ("fp16_range", "mul", 90000.0)
    assert "float16" in str(caught.value)
    with dbg.check_numerics() as checker:  # off by default
        big * 3
    assert checker.findings == []
    with dbg.check_numerics(check_fp16_range=True) as checker:
        big * 2  # 60000 fits
    assert checker.findings == []


def test_ops_and_skip_ops_select_what_is_checked(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    with dbg.check_numerics(ops={"relu", "t"}) as only:
        _fp16(net, x)
    assert only.findings == []
    with pytest.raises(dbg.NumericsError) as caught, dbg.check_numerics(skip_ops={"aten::exp"}):
        _fp16(net, x)
    finding = caught.value.finding
    assert (finding.op, finding.module_path) == ("addmm", "PlantedNet.blocks.3")
    assert not finding.inputs_finite
    assert "the problem starts earlier" in str(caught.value)


def test_overload_names_select_one_overload() -> None:
    inf = torch.tensor([float("inf")])
    with dbg.check_numerics(ops={"add.Scalar"}) as checker:
        inf + 1  # dispatches add.Tensor (the 1 becomes a wrapped scalar tensor)
    assert checker.findings == []
    with pytest.raises(dbg.NumericsError, match=r"aten::add\.Tensor"), dbg.check_numerics(ops={"add.Tensor"}):
        inf + 1


def test_unknown_op_names_raise_with_a_hint() -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"check_numerics\(skip_ops=\.\.\.\): unknown op 'exq'.*'exp'"):
        dbg.check_numerics(skip_ops={"exq"})
    with pytest.raises(ampcore.AmpcoreError, match=r"in both"):
        dbg.check_numerics(ops={"exp"}, skip_ops={"exp"})
    with pytest.raises(ampcore.AmpcoreError, match=r"expected a collection of op names"):
        dbg.check_numerics(ops="exp")
    with pytest.raises(ampcore.AmpcoreError, match=r"raise_on_error=1"):
        dbg.check_numerics(raise_on_error=1)  # type: ignore[arg-type]


def test_sees_ops_inside_multihead_attention(attention: tuple[nn.Module, torch.Tensor]) -> None:
    net, x = attention
    with pytest.raises(dbg.NumericsError) as caught, dbg.check_numerics():
        _fp16(net, x * 1000)  # q @ k^T exceeds 65504 in float16
    assert caught.value.op == "bmm"
    assert caught.value.module_path == "AttentionNet.attn"
    assert caught.value.finding.input_dtypes == ("float16", "float16")


def test_backward_findings_name_the_autograd_node() -> None:
    w = torch.full((4,), 10.0, requires_grad=True)
    y = w.half().exp()  # 22026: fits float16
    with pytest.raises(dbg.NumericsError) as caught, dbg.check_numerics():
        y.backward(torch.full_like(y, 1000))  # the gradient 2.2e7 does not
    finding = caught.value.finding
    assert (finding.autograd_node, finding.op, finding.module_path) == ("ExpBackward0", "mul", "")
    assert "in backward (autograd node ExpBackward0)" in str(caught.value)


def test_hooks_and_mode_are_removed_on_exit_also_after_errors(planted: tuple[PlantedNet, torch.Tensor]) -> None:
    net, x = planted
    before = _global_hooks()
    with pytest.raises(dbg.NumericsError), dbg.check_numerics():
        _fp16(net, x)
    assert _global_hooks() == before
    inf = torch.tensor([float("inf")])
    inf + 1  # no checker active any more: no error
    with dbg.check_numerics(raise_on_error=False) as checker, warnings.catch_warnings():
        warnings.simplefilter("ignore", dbg.NumericsWarning)
        net(x)
    assert _global_hooks() == before and checker.findings == []


def test_a_checker_is_not_reentrant() -> None:
    checker = dbg.check_numerics()
    with checker, pytest.raises(ampcore.AmpcoreError, match="already active"):
        checker.__enter__()


def test_ops_of_other_threads_are_not_checked() -> None:
    inf = torch.tensor([float("inf")])
    errors: list[BaseException] = []

    def work() -> None:
        try:
            inf + 1
        except BaseException as error:  # noqa: BLE001 - recorded for the assertion
            errors.append(error)

    worker = threading.Thread(target=work)
    with dbg.check_numerics() as checker:
        worker.start()
        worker.join()
    assert errors == [] and checker.findings == []


def test_module_paths_name_unregistered_modules_by_class() -> None:
    class Builds(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.Softplus(threshold=10_000)(x)  # not a registered submodule

    net = nn.Sequential(nn.Identity(), Builds())
    with pytest.raises(dbg.NumericsError) as caught, dbg.check_numerics():
        net(torch.full((2,), 1000.0))  # log1p(exp(1000)) overflows float32
    assert caught.value.op == "softplus"
    assert caught.value.module_path == "Sequential.1.<Softplus>"
    assert "in module Sequential.1.<Softplus>\n" in str(caught.value)


@torch.library.custom_op("ampcore_debugging_test::blow_up", mutates_args=())
def _blow_up(x: torch.Tensor) -> torch.Tensor:
    return x * float("inf")


def test_ops_outside_aten_keep_their_namespace() -> None:
    with pytest.raises(dbg.NumericsError, match=r"ampcore_debugging_test::blow_up\.default produced") as caught:
        with dbg.check_numerics(ops={"ampcore_debugging_test::blow_up"}):
            _blow_up(torch.ones(2))
    assert caught.value.op == "ampcore_debugging_test::blow_up"
    with dbg.collect_operator_stats() as stats:
        _blow_up(torch.ones(2))
    assert stats.counts["ampcore_debugging_test::blow_up"]["fp32"] == 1
