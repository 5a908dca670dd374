"""Levels OD and O2: every sample op behaves as its list at that level says.

OD runs only white-list ops in the low dtype and everything else in float32; O2 runs
everything in the low dtype except the black list (docs/levels.md).
"""

from __future__ import annotations

import pytest
import torch

import ampcore
from ampcore_conformance._checks import check_op, make_mlp, region, require_white
from ampcore_conformance._context import SuiteContext
from ampcore_conformance._manifest import Tolerances
from ampcore_conformance._op_samples import OpSample


def _lists(context: SuiteContext, backend: ampcore.Backend, dtype: torch.dtype, level: str) -> ampcore.OpLists:
    try:
        region(backend, dtype, level=level)
    except ampcore.AmpcoreError as exc:
        if "not available yet" in str(exc):
            pytest.skip(f"feature missing in ampcore {ampcore.__version__}: level {level} ({exc})")
        raise
    return context.lists(dtype, level)


@pytest.mark.parametrize("level", ["OD", "O2"])
@pytest.mark.ampcore_ops("all")
def test_level_ops(
    amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype,
    amp_op: OpSample, amp_tolerances: Tolerances, level: str,
) -> None:  # fmt: skip
    lists = _lists(amp_context, amp_backend, amp_dtype, level)
    check_op(amp_op, lists, amp_backend, amp_device, amp_dtype, amp_tolerances.op_eps)


@pytest.mark.parametrize("level", ["OD", "O1", "O2"])
def test_level_model_output(
    amp_context: SuiteContext,
    amp_backend: ampcore.Backend,
    amp_device: torch.device,
    amp_dtype: torch.dtype,
    level: str,
) -> None:
    """A Linear-Tanh-Linear model: the tanh between the two linears runs as the level says."""
    _lists(amp_context, amp_backend, amp_dtype, level)
    require_white(amp_context, amp_dtype, ["linear"], level)
    model = make_mlp(amp_device, depth=1)
    seen: list[torch.dtype] = []
    model[1].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    with region(amp_backend, amp_dtype, level=level):
        out = model(torch.randn(8, 16, device=amp_device))
    expected_tanh = {"OD": torch.float32, "O1": amp_dtype, "O2": amp_dtype}[level]
    assert (seen, out.dtype) == ([expected_tanh], amp_dtype), f"tanh ran in {seen}, the output is {out.dtype}"
