"""The conformance checks compare with what the device returns without autocast (issue 24).

On CUDA, ``trace`` of float16 input returns float32 even without autocast; the suite's
"unlisted ops follow their inputs" check asserted float16 and failed on a correct backend.
Stand-ins here: ops whose own kernel returns float32 for low-precision input.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore_conformance._checks import check_runs_low, check_unlisted, native_dtype
from ampcore_conformance._op_samples import Arg, OpSample

CPU = torch.device("cpu")
#: Like CUDA's ``trace``: a float32 result for bfloat16 input, with or without autocast.
WIDENING_SUM = OpSample("sum", lambda x: torch.sum(x, dtype=torch.float32), (Arg((4, 4)),))
NEG = OpSample("neg", torch.neg, (Arg((4, 4)),))


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
