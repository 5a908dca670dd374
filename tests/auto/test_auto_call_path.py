"""Issue 27 (ninth stop): what the call-by-call path costs per module call.

A ``level="auto"`` region that cannot have programs (nested in another ampcore region, with
custom lists, more roots at one place than it keeps) and a root call that cannot have one (an
argument the guard cannot see, a stream of signatures beyond its table) apply the plan call
by call through :mod:`ampcore._auto._hooks`' two global module hooks.  Counted in Python
function calls made inside those hooks (``sys.setprofile``), never timed.  Before this stop a
planned call ran about 40 of them: ``float32_weights`` walked ``module.parameters()``
(torch's generators, 20 calls), the shape class built its key in a comprehension, the plan
was found through two functions, ``torch.compiler.is_compiling`` was called twice.

The outputs (values and dtypes) stay those of the fixed precision the plan gives
(:func:`test_auto_sweep.fixed_region`), also when a layer's weights change dtype in place
between calls (``module.bfloat16()``: the O1 lists then run it).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep import LOW, _clean, _load, fixed_region
from torch import nn

import ampcore
from ampcore._auto import _hooks, _shapes
from ampcore._auto._shapes import float32_weights, shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

#: Python calls inside the two hooks for one planned module call (pre and post together):
#: ``torch.compiler.is_dynamo_compiling`` in each (2), the planned kind, the weights' dtypes,
#: the checkpoint check, the shape class and the plan (5)
PLANNED = 7
#: and two more where the plan runs it in float32 (autocast off; its input's device type)
FP32 = 2
#: and for a module of another kind (``nn.ReLU``, the ``nn.Sequential`` around them)
UNPLANNED = 3


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 8)
    )


def _plan_mixed(net: nn.Sequential, x: torch.Tensor, fp32: tuple[int, ...] = (0, 2), grad: bool = True) -> None:
    """float32 for the Linear layers ``fp32`` (by their order), low precision for the others
    (both input dtypes)."""
    decisions: dict[str, str] = {}
    h = x
    for i, layer in enumerate(m for m in net if isinstance(m, nn.Linear)):
        for dtype in (torch.float32, LOW):
            with torch.set_grad_enabled(grad):
                decisions[shape_class(layer, (h.to(dtype),), "cpu") or ""] = "fp32" if i in fp32 else "low"
        h = torch.zeros(h.shape[0], layer.out_features)
    _load(decisions)


def _hook_calls(run: Callable[[], Any]) -> tuple[int, int]:
    """(Python calls made inside ``_hooks._pre`` / ``_hooks._post``, calls of the hooks)."""
    hooks = {_hooks._pre.__code__, _hooks._post.__code__}
    depth = inside = entered = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal depth, inside, entered
        if event == "call":
            if depth:
                depth += 1
                inside += 1
            elif frame.f_code in hooks:
                depth, entered = 1, entered + 1
        elif event == "return" and depth:
            depth -= 1

    gc.collect()  # weakref callbacks of earlier tests' garbage (torch's weak dicts) are not the hooks' calls
    gc.disable()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        gc.enable()
    return inside, entered


def _nested(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A region nested in an O1 region: it always applies the plan call by call."""
    with ampcore.autocast("cpu"), ampcore.autocast("cpu", level="auto"):
        out: torch.Tensor = net(x)
    return out


def _linears(net: nn.Module) -> int:
    return sum(isinstance(m, nn.Linear) for m in net.modules())


def test_a_planned_call_applied_call_by_call_costs_a_few_python_calls() -> None:
    net, x = _net(), torch.randn(4, 16)
    _plan_mixed(net, x)
    _nested(net, x)
    inside, entered = _hook_calls(lambda: _nested(net, x))
    modules = len(list(net.modules()))
    assert entered == 2 * modules  # every module call runs both hooks
    planned = _linears(net)
    budget = planned * (PLANNED + FP32) + (modules - planned) * UNPLANNED
    assert inside <= budget, (inside, budget)


def test_a_root_call_applied_call_by_call_unrecorded_costs_the_same_per_module() -> None:
    """The path of ``seqlen-long``'s lengths beyond the table and of arguments the guard
    cannot see: a recording without its dispatch mode notes nothing per planned call."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = _net()

        def forward(self, x: torch.Tensor, config: object) -> torch.Tensor:
            out: torch.Tensor = self.body(x)
            return out

    net, x, config = Net(), torch.randn(4, 16), object()
    _plan_mixed(net.body, x)

    def step() -> torch.Tensor:
        with ampcore.autocast("cpu", level="auto"):
            out: torch.Tensor = net(x, config)
        return out

    for _ in range(3):
        step()
    inside, entered = _hook_calls(step)
    modules = len(list(net.modules()))
    planned = _linears(net)
    # the root's own pre-hook call and its end (the recording's close and the hooks' release)
    budget = planned * (PLANNED + FP32) + (modules - planned) * UNPLANNED + 8
    assert entered >= 2 * modules - 1 and inside <= budget, (inside, entered, budget)
    _clean(net)


@pytest.mark.parametrize("grad", [True, False])
def test_call_by_call_outputs_are_the_fixed_precisions(grad: bool) -> None:
    net, x = _net(), torch.randn(4, 16)
    _plan_mixed(net, x, grad=grad)
    with torch.set_grad_enabled(grad):
        with fixed_region():
            want = net(x)
        for _ in range(3):
            got = _nested(net, x)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    _clean(net)


def test_a_layer_whose_weights_change_dtype_in_place_goes_to_the_o1_lists() -> None:
    """``module.bfloat16()`` keeps the Parameter objects (their data changes): a layer seen
    with float32 weights before must be seen with its new dtype at its next call."""
    net, x = _net(), torch.randn(4, 16)
    _plan_mixed(net, x, fp32=(0,))
    first = net[0]
    _nested(net, x)
    weight = first.weight
    first.bfloat16()
    assert first.weight is weight and not float32_weights(first)
    with torch.autocast("cpu", dtype=LOW):
        want = net(x)  # the first layer cannot run in float32: the O1 lists run it, and the others
    got = _nested(net, x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    first.float()
    assert float32_weights(first)


def test_float32_weights_of_a_leaf_and_of_a_module_with_children() -> None:
    lin = nn.Linear(2, 2, bias=False)
    assert float32_weights(lin)
    lin.register_parameter("extra", None)  # a None parameter is skipped, as parameters() does
    lin.register_buffer("steps", torch.zeros(1, dtype=torch.int64))  # buffers play no part
    assert float32_weights(lin)
    lin.scale = nn.Parameter(torch.ones(1, dtype=torch.float16))
    assert not float32_weights(lin)
    lin.scale = nn.Parameter(torch.ones(1, dtype=torch.int32), requires_grad=False)  # not floating
    assert float32_weights(lin)
    attention = nn.MultiheadAttention(8, 2)
    assert float32_weights(attention)
    attention.out_proj.bfloat16()  # a child's weights count
    assert not float32_weights(attention)


def test_the_shape_class_of_one_tensor_is_that_of_the_general_key() -> None:
    """One floating tensor (the common call) takes a shorter key; every other form the
    general one; both give the class :func:`_shapes._shape_class` gives."""
    lin = nn.Linear(8, 4)
    cases: list[tuple[Any, ...]] = [
        (torch.zeros(5, 8),),
        (torch.zeros(5, 8, dtype=LOW),),
        (torch.zeros(5, 8, dtype=torch.int64),),  # no floating input: not planned
        (torch.zeros(3, 5, 8), torch.zeros(2)),
        (torch.zeros(5, 8), 3),
        (nn.Parameter(torch.zeros(5, 8)),),
    ]
    describe = f"Linear({lin.extra_repr()})"
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for args in cases:
                for _ in range(2):  # the second from the memo
                    assert shape_class(lin, args, "cpu") == _shapes._shape_class(describe, args, "cpu")
                assert shape_class(lin, args, "meta") is None  # no input on that device type
