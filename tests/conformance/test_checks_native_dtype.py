"""The conformance checks compare with what the device returns without autocast (issue 24).

The suite's "unlisted ops follow their inputs" check must expect what the device itself
does.  Two ways a correct backend returns another dtype than its inputs': a kernel that
widens by itself (stand-in: ``sum`` with ``dtype=float32``), and a kernel that calls listed
ops inside it, which autocast casts like any call: on CUDA, ``trace`` is
``diagonal().sum()`` and ``sum`` is float32 under autocast, so ``trace`` of float16 returns
float32 under ``torch.autocast`` and ampcore alike (the second GPU run, torch 2.11, failed
``test_unlisted_ops_follow_inputs[float16-trace]`` on that).  Stand-in: an op whose host
kernel calls ``mm``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore_conformance._checks import check_runs_low, check_unlisted, native_dtype, ops_inside
from ampcore_conformance._op_samples import Arg, OpSample

CPU = torch.device("cpu")
#: Like CUDA's ``trace``: a float32 result for bfloat16 input, with or without autocast.
WIDENING_SUM = OpSample("sum", lambda x: torch.sum(x, dtype=torch.float32), (Arg((4, 4)),))
NEG = OpSample("neg", torch.neg, (Arg((4, 4)),))


_LIB = torch.library.Library("ampcore_conftest", "DEF")  # a test op
_LIB.define("nested_mm(Tensor x) -> Tensor")
_LIB.impl("nested_mm", lambda x: torch.mm(x, x), "CPU")
#: Like CUDA's ``trace``: on no list itself, its kernel calls a listed op (``mm``, white).
NESTED_MM = OpSample("nested_mm", torch.ops.ampcore_conftest.nested_mm, (Arg((4, 4)),))


def test_ops_inside_sees_the_calls_a_kernel_makes() -> None:
    assert "mm" in ops_inside(NESTED_MM, CPU)
    assert "mm" not in ops_inside(NEG, CPU)


def test_an_unlisted_op_whose_kernel_calls_a_listed_op_is_not_failed() -> None:
    """The nested mm runs in bfloat16 under autocast; the check says why and skips."""
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what torch itself does
        assert NESTED_MM.run(NESTED_MM.inputs(torch.float32, CPU), CPU).dtype == torch.bfloat16
    with pytest.raises(pytest.skip.Exception, match=r"kernel on this device calls listed ops \['mm'\]"):
        check_unlisted(NESTED_MM, ampcore.get_backend("cpu"), CPU, torch.bfloat16, frozenset({"mm"}), "O1")
    with pytest.raises(AssertionError, match="nested_mm is on none of the backend's lists"):  # mm not listed
        check_unlisted(NESTED_MM, ampcore.get_backend("cpu"), CPU, torch.bfloat16, frozenset(), "O1")


def test_native_dtype_is_what_the_kernel_returns() -> None:
    assert native_dtype(WIDENING_SUM, CPU, torch.bfloat16) == torch.float32
    assert native_dtype(NEG, CPU, torch.bfloat16) == torch.bfloat16


@pytest.mark.parametrize("level", ["O1", "OD", "O2"])
def test_an_unlisted_op_that_widens_by_itself_passes(level: str) -> None:
    check_unlisted(WIDENING_SUM, ampcore.get_backend("cpu"), CPU, torch.bfloat16, frozenset(), level)


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_an_unlisted_op_that_follows_its_inputs_passes(level: str) -> None:
    check_unlisted(NEG, ampcore.get_backend("cpu"), CPU, torch.bfloat16, frozenset(), level)


def test_a_backend_that_casts_an_unlisted_op_still_fails(register) -> None:  # type: ignore[no-untyped-def]
    """The comparison is with the device's own result, not a pass for anything: a backend
    that runs neg in float32 while claiming it is on no list is caught."""
    adapter = make_adapter("castsneg", ampcore_op_list_adjustments=lambda dtype: {"black": ["neg"]})
    backend = register(adapter, name="castsneg")
    with pytest.raises(
        AssertionError, match="neg is on none of the backend's lists, so at O1 it runs in torch.bfloat16"
    ):
        check_unlisted(NEG, backend, CPU, torch.bfloat16, frozenset(), "O1")


def test_a_white_op_is_compared_with_its_low_precision_kernel(register) -> None:  # type: ignore[no-untyped-def]
    adapter = make_adapter("widewhite", ampcore_op_list_adjustments=lambda dtype: {"white": ["sum"]})
    backend = register(adapter, name="widewhite")
    check_runs_low(WIDENING_SUM, backend, CPU, torch.bfloat16, eps_tol=64)
    with pytest.raises(AssertionError, match="on the white list, so it must run in torch.bfloat16"):
        check_runs_low(NEG, backend, CPU, torch.bfloat16, eps_tol=64)  # neg is not white: stays fp32
