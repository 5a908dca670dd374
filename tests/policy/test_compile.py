"""torch.compile: uncustomised O1 without graph breaks; custom lists correct, never stale."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)
from torch import nn

import ampcore

pytestmark = pytest.mark.slow

BF16, FP32 = torch.bfloat16, torch.float32
X = torch.randn(8, 16)
W = torch.randn(16, 16)


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def _body(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.mm(x, w), x + w[:8]


def _dtypes(out: tuple[torch.Tensor, ...]) -> list[torch.dtype]:
    return [t.dtype for t in out]


def _uncustomised_step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with ampcore.autocast(device="cpu"):
        return _body(x, w)


def _dynamo_cannot_trace_a_class_that_builds_an_autocast() -> str | None:
    """Why this torch's dynamo cannot trace ``C()`` where ``C.__new__`` returns a
    ``torch.autocast`` (what ``ampcore.autocast(...)`` is inside a compiled function), or
    None.  torch 2.8's cannot: its ``isinstance(obj, C)`` check after ``__new__`` has no rule
    for an autocast object.  Checked on a class of its own, not on ampcore's."""

    class Region:
        def __new__(cls) -> torch.autocast:  # type: ignore[misc]
            return torch.autocast("cpu", dtype=BF16)

    def probe(x: torch.Tensor) -> torch.Tensor:
        with Region():
            return x + 1

    try:
        torch.compile(probe, fullgraph=True, backend="eager")(X)
    except torch._dynamo.exc.Unsupported as exc:
        first = str(exc).splitlines()[0]
        return f"torch {torch.__version__}'s dynamo cannot trace a class whose __new__ returns torch.autocast ({first})"
    finally:
        torch._dynamo.reset()
    return None


def test_uncustomised_region_inside_a_compiled_function_has_no_graph_break() -> None:
    reason = _dynamo_cannot_trace_a_class_that_builds_an_autocast()
    if reason is not None:
        pytest.skip(f"{reason}: the region is a graph break there (docs/backends.md)")
    step = _uncustomised_step
    compiled = torch.compile(step, fullgraph=True)  # inductor: raises on any graph break
    assert _dtypes(compiled(X, W)) == _dtypes(step(X, W)) == [BF16, FP32]
    assert torch._dynamo.explain(step)(X, W).graph_break_count == 0


def test_uncustomised_region_inside_a_compiled_function_is_correct_on_every_torch() -> None:
    """Without fullgraph: also where dynamo breaks the graph at the region (torch 2.8), the
    region runs and gives the lists' dtypes."""
    compiled = torch.compile(_uncustomised_step, backend="aot_eager")
    assert _dtypes(compiled(X, W)) == _dtypes(_uncustomised_step(X, W)) == [BF16, FP32]


def test_compiled_model_under_an_uncustomised_region_has_no_graph_break() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4))
    with ampcore.autocast(device="cpu"):
        explanation = torch._dynamo.explain(model)(X)
        out = torch.compile(model, backend="aot_eager")(X)
    assert explanation.graph_break_count == 0
    assert out.dtype == BF16


# (region arguments, expected dtypes of (mm, add))
POLICIES: list[tuple[dict[str, object], list[torch.dtype]]] = [
    ({}, [BF16, FP32]),
    ({"custom_white_list": {"add"}}, [BF16, BF16]),
    ({"custom_black_list": {"mm"}}, [FP32, FP32]),
    ({"level": "O2"}, [BF16, BF16]),
    ({}, [BF16, FP32]),  # back to torch's lists: the first graph again, not the last
]


def test_custom_lists_around_a_compiled_function_are_never_stale() -> None:
    compiled = torch.compile(_body, backend="aot_eager")
    for region, expected in POLICIES:
        with ampcore.autocast(device="cpu", **region):  # type: ignore[arg-type]
            assert _dtypes(compiled(X, W)) == _dtypes(_body(X, W)) == expected, region
    with torch.autocast("cpu", dtype=BF16):
        assert _dtypes(compiled(X, W)) == [BF16, FP32]


def test_custom_region_inside_a_compiled_function_is_correct() -> None:
    def step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        with ampcore.autocast(device="cpu", custom_white_list={"add"}, custom_black_list={"mm"}):
            mm, add = _body(y, w)
        return mm * 2, add * 2

    compiled = torch.compile(step, backend="aot_eager")
    assert _dtypes(compiled(X, W)) == _dtypes(step(X, W)) == [FP32, BF16]
    assert torch._dynamo.explain(step)(X, W).graph_break_count > 0  # documented: region entry/exit


def _grads(model: nn.Module, run: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
    model.zero_grad()
    with ampcore.autocast(device="cpu", custom_white_list={"add", "gelu"}, custom_black_list={"linear"}):
        loss = F.mse_loss(run(X).float(), torch.zeros(8, 4))
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def test_gradients_under_compile_match_eager() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4))
    eager = _grads(model, model)
    compiled = _grads(model, torch.compile(model, backend="aot_eager"))
    for a, b in zip(compiled, eager, strict=False):  # same policy; bf16 rounding may differ in the last bits
        assert a.dtype == b.dtype == FP32
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-3)


def test_the_guard_mode_waits_for_a_compile_not_for_dynamos_import() -> None:
    """Constructing any torch optimizer imports torch._dynamo: a training loop that never
    compiles must not pay the guard mode's 1-2 us per torch call in its policy regions."""
    from torch._dynamo.utils import counters  # noqa: PLC0415

    torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    saved = {key: counter.copy() for key, counter in counters.items()}
    counters.clear()  # as in a process that compiled nothing (earlier tests did)
    try:
        with ampcore.autocast(device="cpu", custom_white_list={"add"}):
            assert not torch._C._is_torch_function_mode_enabled()
            assert (X + X).dtype == BF16
        compiled = torch.compile(_body, backend="eager")
        assert _dtypes(compiled(X, W)) == [FP32, FP32]  # dynamo processes its first frame
        with ampcore.autocast(device="cpu", custom_white_list={"add"}):
            assert torch._C._is_torch_function_mode_enabled()  # from now on: graphs per policy
            assert _dtypes(compiled(X, W)) == [BF16, BF16]
    finally:
        counters.clear()
        counters.update(saved)
