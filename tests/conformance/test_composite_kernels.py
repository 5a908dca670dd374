"""Issue 28, row 15: a composite op whose autocast key has a kernel of its own (IPEX
registers an AutocastCPU kernel for ``group_norm``) is checked like any kernel, not skipped
as "CompositeImplicitAutograd: runs as its inner ops".  Measured in a process of its own:
the kernel is registered in the process-global dispatcher."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ampcore_conformance._checks import decomposes_under_autocast

SCRIPT = textwrap.dedent(
    """
    import json

    import pytest
    import torch

    import ampcore
    from ampcore_conformance._checks import check_unlisted, decomposes_under_autocast
    from ampcore_conformance._op_samples import SAMPLES

    def outcome():
        lists = ampcore.oplists("cpu", dtype=torch.bfloat16)
        listed = lists.white | lists.black | lists.promote
        try:
            check_unlisted(
                SAMPLES["group_norm"], ampcore.get_backend("cpu"), torch.device("cpu"), torch.bfloat16, listed
            )
        except pytest.skip.Exception as exc:
            return "skipped: " + str(exc)
        except AssertionError as exc:
            return "failed: " + str(exc)
        return "passed"

    result = {"before": decomposes_under_autocast("group_norm", "cpu"), "before_check": outcome()}
    own = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def group_norm_in_bf16(x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
        # what IPEX's kernel does: run the op in bfloat16 for float32 inputs
        low = [t if t is None else t.to(torch.bfloat16) for t in (x, weight, bias)]
        with torch._C._ExcludeDispatchKeyGuard(own):
            return torch.ops.aten.group_norm(low[0], num_groups, low[1], low[2], eps, cudnn_enabled)

    library = torch.library.Library("aten", "IMPL")
    library.impl("group_norm", group_norm_in_bf16, "AutocastCPU")
    result.update(after=decomposes_under_autocast("group_norm", "cpu"), after_check=outcome())
    print(json.dumps(result))
    """
)


def test_an_unregistered_composite_decomposes_and_a_kernel_is_not_composite() -> None:
    # instance_norm: no kernel of its own for the CPU, in torch or IPEX 2.8 (group_norm, used
    # before, has IPEX's AutocastCPU and CPU kernels once IPEX is imported)
    assert decomposes_under_autocast("instance_norm", "cpu")
    assert not decomposes_under_autocast("mm", "cpu")  # not composite
    assert not decomposes_under_autocast("cross_entropy_loss", "cpu")  # composite, with an AutocastCPU kernel
    # composite, with torch's own CPU kernel: it never decomposes on the CPU, and does elsewhere
    assert not decomposes_under_autocast("native_channel_shuffle", "cpu")
    assert decomposes_under_autocast("native_channel_shuffle", "cuda")


def test_a_composite_with_its_own_autocast_kernel_is_checked_like_any_kernel() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["before"] is True and result["after"] is False
    assert result["before_check"] == "passed", result  # torch's group_norm follows its inputs
    # the kernel's dtype change is reported, not hidden behind "runs as its inner ops"
    assert result["after_check"].startswith("failed: "), result
    assert "group_norm is on none of the backend's lists" in result["after_check"]


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_the_check_reads_the_devices_own_autocast_key(device_type: str) -> None:
    # cross_entropy_loss has an AutocastCPU kernel and no AutocastCUDA one
    assert decomposes_under_autocast("cross_entropy_loss", device_type) == (device_type == "cuda")
