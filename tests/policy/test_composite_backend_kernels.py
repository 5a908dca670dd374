"""A CompositeImplicitAutograd op with a backend kernel of its own does not decompose there,
so its inner ops never see a policy: levels must cast it as a kernel.

Found in ``python3 tasks.py compat`` (torch 2.8 + IPEX 2.8 imported): IPEX registers CPU
kernels for ``layer_norm`` and ``group_norm``, and O2 ran ``layer_norm`` of float32 inputs
in float32 (OD: a bfloat16 input in bfloat16), because ampcore took both for composites whose
inner ops (``native_layer_norm``) get the policy.  torch itself has such ops:
``native_channel_shuffle`` has a CPU kernel."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch
from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)

import ampcore
from ampcore._op_names import generated_overloads, is_composite

BF16, FP32 = torch.bfloat16, torch.float32


def test_a_composite_with_a_cpu_kernel_of_torchs_own_is_cast_by_levels() -> None:
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::native_channel_shuffle", "CPU")
    assert not is_composite("native_channel_shuffle") and "native_channel_shuffle" in generated_overloads()
    x = torch.randn(2, 4, 3, 3)
    with ampcore.autocast(device="cpu", level="O2"):
        assert torch.native_channel_shuffle(x, 2).dtype == BF16  # float32 before the fix
    with ampcore.autocast(device="cpu", level="OD"):
        assert torch.native_channel_shuffle(x.to(BF16), 2).dtype == FP32  # bfloat16 before the fix


#: In a process of its own (the kernel is registered in the process-global dispatcher): a CPU
#: kernel for ``layer_norm`` that computes the op itself, below autocast, as IPEX's does.
SCRIPT = textwrap.dedent(
    """
    import json

    import torch

    from ampcore._policy.key_tables import all_autocast_keys

    def layer_norm_cpu(x, shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
        with torch._C._ExcludeDispatchKeyGuard(all_autocast_keys()):
            return torch.ops.aten.native_layer_norm(x, shape, weight, bias, eps)[0]

    library = torch.library.Library("aten", "IMPL")
    library.impl("layer_norm", layer_norm_cpu, "CPU")

    import ampcore

    norm = torch.nn.LayerNorm(8)
    x = torch.randn(4, 8, requires_grad=True)
    result = {}
    for level, given in (("O2", x), ("OD", x.to(torch.bfloat16)), ("O1", x.to(torch.bfloat16))):
        with ampcore.autocast(device="cpu", level=level):
            out = norm(given)
        out.float().sum().backward()
        result[level] = [str(out.dtype), x.grad is not None and bool(torch.isfinite(x.grad).all())]
        x.grad = None
    print(json.dumps(result))
    """
)


def test_levels_cast_a_composite_that_an_extension_gave_a_cpu_kernel() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    # O2 runs it low, OD in float32 (it is on no list), O1 as its inputs: gradients flow
    assert result == {"O2": ["torch.bfloat16", True], "OD": ["torch.float32", True], "O1": ["torch.bfloat16", True]}
