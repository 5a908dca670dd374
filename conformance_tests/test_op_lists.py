"""Per-op expectations derived from the backend's own op lists (see ``_lists.py``).

Each op the suite can call (``_op_samples.py``) is checked against the list it is on for
the dtype, at level O1; the required sets hold whatever the lists say.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

import ampcore
from ampcore_conformance._checks import (
    check_runs_fp32,
    check_runs_low,
    check_runs_widest,
    check_unlisted,
)
from ampcore_conformance._context import SuiteContext
from ampcore_conformance._lists import category, overlaps, unknown_op_names
from ampcore_conformance._manifest import Tolerances
from ampcore_conformance._native import disagreements
from ampcore_conformance._op_samples import OpSample


def test_op_lists_are_valid(amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_dtype: torch.dtype) -> None:
    try:
        lists = amp_context.lists(amp_dtype)
    except Exception as exc:
        pytest.fail(f"the op lists of {amp_backend.name!r} for {amp_dtype} cannot be built: {exc}", pytrace=False)
    assert not overlaps(lists), f"ops on more than one list: {overlaps(lists)}"
    adjusted = {op for ops in amp_backend.op_list_adjustments(amp_dtype).values() for op in ops}
    unknown = unknown_op_names(lists.white | lists.black | lists.promote | adjusted)
    assert not unknown, f"the lists name ops that do not exist: {unknown}"
    assert lists.white, f"the white list for {amp_dtype} is empty: nothing would run in {amp_dtype}"


@pytest.mark.ampcore_ops("white")
def test_white_ops_run_low(
    amp_backend: ampcore.Backend,
    amp_device: torch.device,
    amp_dtype: torch.dtype,
    amp_op: OpSample,
    amp_tolerances: Tolerances,
) -> None:
    check_runs_low(amp_op, amp_backend, amp_device, amp_dtype, amp_tolerances.op_eps)


@pytest.mark.ampcore_ops("black")
def test_black_ops_run_fp32(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype, amp_op: OpSample
) -> None:
    check_runs_fp32(amp_op, amp_backend, amp_device, amp_dtype)


@pytest.mark.ampcore_ops("promote")
def test_promote_ops_run_widest(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype, amp_op: OpSample
) -> None:
    check_runs_widest(amp_op, amp_backend, amp_device, amp_dtype)


@pytest.mark.ampcore_ops("other")
def test_unlisted_ops_follow_inputs(
    amp_context: SuiteContext,
    amp_backend: ampcore.Backend,
    amp_device: torch.device,
    amp_dtype: torch.dtype,
    amp_op: OpSample,
) -> None:
    lists = amp_context.lists(amp_dtype)
    check_unlisted(amp_op, amp_backend, amp_device, amp_dtype, lists.white | lists.black | lists.promote)


@pytest.mark.ampcore_ops("required_white")
def test_required_white_ops(
    amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype,
    amp_op: OpSample, amp_tolerances: Tolerances,
) -> None:  # fmt: skip
    """Matrix products and convolutions must be white: they are why mixed precision pays."""
    where = category(amp_context.lists(amp_dtype), amp_op.name)
    assert where == "white", (
        f"{amp_op.name} is on the {where} list of {amp_backend.name!r} for {amp_dtype}; it must be white"
    )
    check_runs_low(amp_op, amp_backend, amp_device, amp_dtype, amp_tolerances.op_eps)


@pytest.mark.ampcore_ops("required_black")
def test_required_black_ops(
    amp_context: SuiteContext,
    amp_backend: ampcore.Backend,
    amp_device: torch.device,
    amp_dtype: torch.dtype,
    amp_op: OpSample,
) -> None:
    """Losses must stay float32: in low precision they overflow (fp16) or lose the signal."""
    where = category(amp_context.lists(amp_dtype), amp_op.name)
    assert where == "black", (
        f"{amp_op.name} is on the {where} list of {amp_backend.name!r} for {amp_dtype}; it must be black"
    )
    check_runs_fp32(amp_op, amp_backend, amp_device, amp_dtype)


def _loading(backend: ampcore.Backend) -> dict[str, str]:
    """This environment, with the plugin under test loaded (never on the block list)."""
    env = dict(os.environ)
    blocked = [
        name
        for name in env.get("AMPCORE_BLOCK_PLUGINS", "").split(",")
        if name.strip() not in (backend.plugin_name, backend.distribution)
    ]
    env["AMPCORE_BLOCK_PLUGINS"] = ",".join(blocked)
    return env


def _native_kernels(backend: ampcore.Backend, dtype: torch.dtype) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "ampcore_conformance._native", backend.name, str(dtype).removeprefix("torch.")],
        capture_output=True, text=True, timeout=900, check=False, env=_loading(backend),
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"measuring the device's own autocast kernels failed:\n{done.stderr[-3000:]}", pytrace=False)
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_device_autocast_kernels_match_the_lists(amp_backend: ampcore.Backend, amp_dtype: torch.dtype) -> None:
    """The autocast kernels the device registers itself do what the backend's lists say.

    Measured with plain ``torch.autocast`` in a fresh process (nothing of ampcore on the
    device's autocast key).  Every kernel the device has must match the lists (the adapter
    declares its differences from torch's table with ``ampcore_op_list_adjustments``); and
    where the adapter declares none, ampcore leaves uncustomised O1 to the device, so every
    listed op needs a kernel.  A device with no autocast kernels passes: ampcore provides
    its autocast with exactly these lists.
    """
    found = _native_kernels(amp_backend, amp_dtype)
    if not found["native"]:
        pytest.skip(
            f"{amp_backend.device_type!r} registers no autocast kernels: ampcore provides its autocast from the lists"
        )
    wrong = disagreements(found, amp_dtype)
    assert not wrong, (
        f"the device's own autocast kernels disagree with backend {amp_backend.name!r}'s lists for {amp_dtype}:\n  "
        + "\n  ".join(wrong)
        + "\nregister the kernels the lists name, or declare the differences with ampcore_op_list_adjustments"
    )
