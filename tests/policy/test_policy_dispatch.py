"""Custom op lists at the dispatcher: reach, thread locality, restoration, gradients."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from _policy_testing import DtypeRecorder, no_lingering_kernels  # noqa: F401 (autouse fixture)
from conftest import make_adapter
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import ampcore
from ampcore._op_names import castable_overloads
from ampcore._policy import registration as _dispatch
from ampcore._policy.autocast import _switch_on
from ampcore._policy.executor import compiled_module
from ampcore._policy.lists import Action
from ampcore._policy.registration import OpPolicy, registered_keys, registered_overloads, route, routes
from ampcore._policy.thread_state import thread_state

BF16, FP32 = torch.bfloat16, torch.float32
X = torch.randn(8, 16)
Y = torch.randn(8, 16)
W = torch.randn(16, 16)
X_BF16, Y_BF16 = X.to(torch.bfloat16), Y.to(torch.bfloat16)


# (custom white, custom black, call, expected dtype): fp32 inputs, bf16 on CPU.
CUSTOM_CASES: list[tuple[set[str] | None, set[str] | None, Callable[[], torch.Tensor], torch.dtype]] = [
    ({"add"}, None, lambda: X + Y, BF16),
    ({"elementwise_add"}, None, lambda: torch.add(X, Y, alpha=2), BF16),
    ({"add"}, None, lambda: X + 1.0, BF16),  # add.Tensor with a wrapped scalar
    ({"mul"}, None, lambda: X * Y, BF16),
    ({"relu"}, None, lambda: torch.relu(X), BF16),
    (None, {"mm"}, lambda: torch.mm(X, W), FP32),
    (None, {"linear"}, lambda: F.linear(X, W), FP32),
    (None, {"matmul"}, lambda: X @ W, FP32),
    (None, {"cat"}, lambda: torch.cat([X.to(BF16), Y.to(BF16)]), FP32),
    (None, {"softmax"}, lambda: F.softmax(X.to(BF16), -1), FP32),
    ({"mse_loss"}, None, lambda: F.mse_loss(X, Y), BF16),  # leaves the black list
    ({"add"}, {"mm"}, lambda: torch.mm(X, W) + X, BF16),  # fp32 mm, then a white add
    (None, {"add"}, lambda: torch.mm(X, W) + torch.mm(X, W), FP32),
]


@pytest.mark.parametrize(("white", "black", "call", "expected"), CUSTOM_CASES)
def test_custom_lists_set_the_op_dtype(white, black, call, expected) -> None:  # type: ignore[no-untyped-def]
    plain = call().dtype
    with ampcore.autocast(device="cpu", custom_white_list=white, custom_black_list=black):
        assert call().dtype == expected
    assert call().dtype == plain  # outside the region: as before


def test_native_ops_keep_their_lists_in_a_customised_region() -> None:
    with ampcore.autocast(device="cpu", custom_white_list={"add"}):
        assert torch.mm(X, W).dtype == BF16
        assert F.mse_loss(X.to(BF16), Y.to(BF16)).dtype == FP32
        assert torch.cat([X, Y.to(BF16)]).dtype == FP32
        assert torch.relu(X).dtype == FP32


def _recorded(layer: nn.Module, src: torch.Tensor, **region: object) -> DtypeRecorder:
    with ampcore.autocast(device="cpu", **region):  # type: ignore[arg-type]
        with DtypeRecorder() as recorder:
            layer(src)
    return recorder


def test_black_linear_reaches_every_projection_of_a_transformer_layer() -> None:
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    src = torch.randn(2, 5, 16)
    matmuls = ("addmm", "mm", "bmm", "baddbmm")
    native = _recorded(layer, src).of(*matmuls)
    black = _recorded(layer, src, custom_black_list={"linear"}).of(*matmuls)
    # in-projection, out-projection and both feed-forward linears
    assert len(black) == len(native) >= 4
    assert all(c.inputs and set(c.inputs) == {BF16} for c in native)
    assert all(c.inputs and set(c.inputs) == {FP32} for c in black)


def test_black_linear_reaches_multihead_attention_in_and_out_projections() -> None:
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16)
    with ampcore.autocast(device="cpu", custom_black_list={"linear"}):
        with DtypeRecorder() as recorder:
            out, _ = mha(x, x, x, need_weights=False)
    assert out.dtype == FP32
    projections = recorder.of("addmm", "mm")
    assert len(projections) >= 2 and all(set(c.inputs) == {FP32} for c in projections)


def test_custom_op_inside_sdpa_math_path_is_reached() -> None:
    q = torch.randn(2, 2, 4, 8)
    with sdpa_kernel(SDPBackend.MATH):
        with ampcore.autocast(device="cpu"):
            with DtypeRecorder() as native:
                F.scaled_dot_product_attention(q, q, q)
        with ampcore.autocast(device="cpu", custom_white_list={"bmm"}):
            with DtypeRecorder() as custom:
                F.scaled_dot_product_attention(q, q, q)
    # torch's CPU math path upcasts to float32 internally; a white bmm is reached inside
    assert {c.inputs for c in native.of("bmm")} == {(FP32, FP32)}
    assert {c.inputs for c in custom.of("bmm")} == {(BF16, BF16)}


def test_white_op_inside_a_composite_does_not_break_its_neighbours() -> None:
    q = torch.randn(2, 2, 4, 8)
    with sdpa_kernel(SDPBackend.MATH):
        with ampcore.autocast(device="cpu", custom_white_list={"_safe_softmax"}):
            with DtypeRecorder() as recorder:
                out = F.scaled_dot_product_attention(q, q, q)
    assert {c.outputs for c in recorder.of("_safe_softmax")} == {(BF16,)}
    assert out.shape == q.shape  # the next bmm got reconciled (bf16 x fp32 -> fp32) inputs


def test_policy_is_thread_local_and_plain_torch_autocast_stays_native() -> None:
    inside, done = threading.Event(), threading.Event()
    seen: dict[str, torch.dtype] = {}

    def other() -> None:
        inside.wait(5)
        seen["plain"] = (X + Y).dtype
        with torch.autocast("cpu", dtype=BF16):
            seen["torch add"] = (X + Y).dtype
            seen["torch mm"] = torch.mm(X, W).dtype
            seen["torch mse"] = F.mse_loss(X.to(BF16), Y.to(BF16)).dtype
        with ampcore.autocast(device="cpu"):
            seen["ampcore add"] = (X + Y).dtype
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with ampcore.autocast(device="cpu", custom_white_list={"add"}, custom_black_list={"mm"}):
        inside.set()
        done.wait(5)
        seen["main add"] = (X + Y).dtype
        seen["main mm"] = torch.mm(X, W).dtype
    thread.join()
    assert seen == {
        "plain": FP32,
        "torch add": FP32,
        "torch mm": BF16,
        "torch mse": FP32,
        "ampcore add": FP32,
        "main add": BF16,
        "main mm": FP32,
    }


# ops whose native results must be reproduced exactly by ampcore's kernels in a thread
# without a policy (while another region keeps the kernels registered)
NATIVE_REPRODUCTION: list[Callable[[], torch.Tensor]] = [
    lambda: torch.mm(X, W),
    lambda: F.linear(X, W, torch.randn(16).requires_grad_()),
    lambda: torch.cat([X, Y.to(BF16)]),
    lambda: F.mse_loss(X, Y),
    lambda: torch.prod(X[:2, :4], dim=1),
    lambda: X + Y,
    lambda: torch.stack([X.to(BF16), Y.to(BF16)]),
]


@pytest.mark.parametrize("call", NATIVE_REPRODUCTION)
def test_kernels_reproduce_torch_where_no_policy_is_active(call: Callable[[], torch.Tensor]) -> None:
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=BF16):
        expected = call()
    region = ampcore.autocast(device="cpu", custom_white_list={"relu"}, level="O1")
    with region:  # switches the kernels' shadow key on in this thread
        assert routes()["cpu"].key in registered_keys()
        thread_state().replace_policies({})  # this thread now behaves like one with no policy
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=BF16):
            got = call()
        thread_state().set_policy("cpu", region._spec.policy)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_state_restored_after_an_exception() -> None:
    with pytest.raises(ValueError, match="boom"):
        with ampcore.autocast(device="cpu", custom_white_list={"add"}):
            with ampcore.autocast(device="cpu", custom_black_list={"mm"}):
                raise ValueError("boom")
    assert thread_state().policies == {} and thread_state().stack == []
    assert not torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", dtype=BF16):
        assert (X + Y).dtype == FP32


NESTING = [
    # (outer lists, inner lists, op, expected dtype inside the inner region)
    ({"custom_white_list": {"add"}}, {"custom_black_list": {"mm"}}, lambda: X + Y, BF16),
    ({"custom_white_list": {"add"}}, {"custom_black_list": {"mm"}}, lambda: torch.mm(X, W), FP32),
    ({"custom_white_list": {"add"}}, {"custom_black_list": {"add"}}, lambda: X + Y, FP32),
    ({"custom_black_list": {"mm"}}, {"custom_white_list": {"mm"}}, lambda: torch.mm(X, W), BF16),
    ({"custom_white_list": {"add"}}, {}, lambda: X + Y, BF16),  # an uncustomised inner region inherits
    ({"custom_white_list": {"add"}}, {"enabled": False}, lambda: X + Y, FP32),
]


@pytest.mark.parametrize(("outer", "inner", "call", "expected"), NESTING)
def test_nested_regions_merge_custom_lists(outer, inner, call, expected) -> None:  # type: ignore[no-untyped-def]
    with ampcore.autocast(device="cpu", **outer):
        before = call().dtype
        with ampcore.autocast(device="cpu", **inner):
            assert call().dtype == expected
        assert call().dtype == before


def test_per_module_policy_with_a_decorated_forward() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        @ampcore.autocast(device="cpu", custom_black_list={"linear"})
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    model = nn.Sequential(nn.Linear(16, 16), Block(), nn.Linear(16, 16))
    with ampcore.autocast(device="cpu"):
        with DtypeRecorder() as recorder:
            model(X)
    assert [c.inputs[0] for c in recorder.of("addmm")] == [BF16, FP32, BF16]


def _train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **region: object) -> list[torch.Tensor]:
    model.zero_grad()
    with ampcore.autocast(device="cpu", **region):  # type: ignore[arg-type]
        loss = F.mse_loss(model(x).float(), y)
    loss.backward()
    return [p.grad for p in model.parameters()]  # type: ignore[misc]


@pytest.mark.parametrize(
    "region",
    [{"custom_white_list": {"add", "relu"}}, {"custom_black_list": {"linear"}}, {"custom_white_list": {"layer_norm"}}],
)
def test_gradients_match_fp32_within_bf16_tolerance(region: dict[str, object]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 4))
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    reference = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    grads = _train_step(model, x, y, **region)
    for got, want in zip(grads, reference, strict=False):
        assert got.dtype == FP32
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)


def test_weights_are_cast_once_per_region_unless_the_cache_is_off() -> None:
    layer = nn.Linear(16, 16, bias=False)

    def casts(**region: object) -> int:
        with ampcore.autocast(device="cpu", custom_white_list={"add"}, **region):  # type: ignore[arg-type]
            with DtypeRecorder() as recorder:
                layer(X)
                layer(X)
        return sum(1 for c in recorder.of("_to_copy") if c.inputs == (FP32,) and c.outputs == (BF16,))

    assert casts() == 3  # the input twice, the weight once
    assert casts(cache_enabled=False) == 4
    assert thread_state().cast_cache == {}


def _has_kernel(overload: str) -> bool:
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{overload}", "AutocastIPU"))


def test_kernels_are_registered_once_only_for_what_a_policy_changes_and_never_removed() -> None:
    with ampcore.autocast(device="cpu", custom_white_list={"add"}):
        pass
    first = registered_overloads("AutocastIPU")
    assert "add.Tensor" in first
    seen = first
    for level, white in (("O1", {"add"}), ("OD", None), ("O2", {"relu"}), ("O1", {"softmax"})):
        with ampcore.autocast(device="cpu", level=level, custom_white_list=white):
            now = registered_overloads("AutocastIPU")
            assert seen <= now <= set(castable_overloads())  # only ever added to
            seen = now
        assert registered_overloads("AutocastIPU") == seen  # nothing removed on exit
    with ampcore.autocast(device="cpu", level="O1", custom_white_list={"add"}):
        assert registered_overloads("AutocastIPU") == seen  # a policy seen before: nothing new
    assert all(_has_kernel(o) for o in seen)
    with torch.autocast("cpu", dtype=BF16):  # plain torch.autocast never meets them
        assert (X + Y).dtype == FP32 and torch.mm(X, W).dtype == BF16


def test_a_kernel_another_policy_registered_changes_no_result() -> None:
    """An op that passes through under one policy gives the same result after another
    policy gave it a kernel: the kernel's THROUGH is the dispatcher's own path."""
    bf16 = torch.randn(4, 4).to(BF16)
    call = lambda: (torch.atan2(X[:4, :4], bf16), torch.logsumexp(bf16 * 3, 0), torch.nan_to_num(bf16))  # noqa: E731
    with ampcore.autocast(device="cpu", level="O1", custom_black_list={"softmax"}):
        before = call()
    with ampcore.autocast(device="cpu", level="OD"):  # registers kernels for most of them
        pass
    with ampcore.autocast(device="cpu", level="O1", custom_black_list={"softmax"}):
        after = call()
    for got, expected in zip(after, before, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_adapter_adjustments_take_effect_at_o1(register) -> None:  # type: ignore[no-untyped-def]
    adjust = lambda dtype: {"black": ["mm"], "white": ["elementwise_add"]}  # noqa: E731
    register(make_adapter("adjusted", ampcore_op_list_adjustments=adjust), name="adjusted")
    with ampcore.autocast(device="adjusted"):
        assert torch.mm(X, W).dtype == FP32
        assert (X + Y).dtype == BF16
    with ampcore.autocast(device="cpu"):
        assert torch.mm(X, W).dtype == BF16
        assert (X + Y).dtype == FP32


def test_banned_op_raises_unless_listed_and_fp32_with_dtype_policy() -> None:
    # CPU has no banned op; its black list runs binary_cross_entropy in float32
    p = torch.rand(4)
    with ampcore.autocast(device="cpu", custom_white_list={"add"}):
        assert F.binary_cross_entropy(p.to(BF16), p.to(BF16)).dtype == FP32
    with ampcore.autocast(device="cpu", custom_black_list={"sum"}):
        assert X.to(BF16).sum().dtype == FP32
        assert X.to(BF16).sum(dtype=torch.float64).dtype == torch.float64


# Policies that only other device types' tables use, exercised on CPU tensors through a
# hand-made policy: (overload, action, call, expected dtype)
OTHER_POLICIES = [
    ("softmax.int", "fp32_set_opt_dtype", lambda: torch.softmax(X.to(BF16), -1), FP32),
    ("softmax.int", "fp32_set_opt_dtype", lambda: torch.softmax(X.to(BF16), -1, dtype=torch.float64), torch.float64),
    ("norm.Scalar", "fp32_append_dtype", lambda: torch.ops.aten.norm.Scalar(X.to(BF16), 2), FP32),
    ("norm.ScalarOpt_dim", "fp32_append_dtype", lambda: torch.ops.aten.norm.ScalarOpt_dim(X.to(BF16), 2, [1]), FP32),
    ("addcmul", "promote", lambda: torch.addcmul(X, X.to(BF16), X.to(BF16)), FP32),
    ("addcmul", "promote", lambda: torch.addcmul(*[X.to(BF16)] * 3), BF16),
]


@contextlib.contextmanager
def _hand_made_policy(actions: dict[str, str]) -> Iterator[None]:
    """Run under torch.autocast with a policy of only ``actions`` (overload -> action)."""
    policy = OpPolicy(ampcore.oplists("cpu"), BF16, actions, "follow", False)
    key = route("cpu", lambda dtype: None).key
    with torch.autocast("cpu", dtype=BF16):
        shadow = _switch_on(key)
        thread_state().set_policy("cpu", policy)
        try:
            yield
        finally:
            thread_state().replace_policies({})
            torch._C._dispatch_tls_set_dispatch_key_included(shadow[0], shadow[1])
            torch._C._dispatch_tls_set_dispatch_key_excluded(shadow[0], shadow[2])


@pytest.mark.parametrize(("overload", "action", "call", "expected"), OTHER_POLICIES)
def test_every_native_policy_kind_runs(
    overload: str, action: str, call: Callable[[], torch.Tensor], expected: torch.dtype
) -> None:
    with _hand_made_policy({overload: action}):
        assert call().dtype == expected


def test_banned_action_raises_torchs_message() -> None:
    with _hand_made_policy({"binary_cross_entropy": "banned"}):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.rand(3), torch.rand(3))


@pytest.mark.usefixtures("no_emulation_warning")
def test_torch_autocast_nested_in_a_customised_region_keeps_the_lists_with_its_dtype() -> None:
    with ampcore.autocast(device="cpu", custom_white_list={"add"}):
        with torch.autocast("cpu", dtype=torch.float16):
            assert (X + Y).dtype == torch.float16
            assert torch.mm(X, W).dtype == torch.float16
        assert (X + Y).dtype == BF16


def test_two_threads_with_different_lists_at_once() -> None:
    barrier = threading.Barrier(2)
    seen: dict[str, tuple[torch.dtype, torch.dtype]] = {}

    def work(name: str, **lists: set[str]) -> None:
        with ampcore.autocast(device="cpu", **lists):  # type: ignore[arg-type]
            barrier.wait(5)  # both regions active together
            for _ in range(20):
                seen[name] = ((X + Y).dtype, torch.mm(X, W).dtype)
            barrier.wait(5)

    threads = [
        threading.Thread(target=work, args=("white add",), kwargs={"custom_white_list": {"add"}}),
        threading.Thread(target=work, args=("black mm",), kwargs={"custom_black_list": {"mm"}}),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"white add": (BF16, BF16), "black mm": (FP32, FP32)}


def test_a_list_naming_an_op_a_fused_kernel_swallows_warns_once() -> None:
    q = torch.randn(2, 4, 8, 16)
    with ampcore.autocast(device="cpu", custom_black_list={"softmax"}):
        with pytest.warns(ampcore.FusedKernelWarning, match="sdpa_kernel") as caught:
            F.scaled_dot_product_attention(q, q, q)
        assert caught[0].filename == __file__  # the user's call, not a frame of ampcore's kernel
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            F.scaled_dot_product_attention(q, q, q)  # once per policy
    with ampcore.autocast(device="cpu", custom_black_list={"softmax"}), sdpa_kernel(SDPBackend.MATH):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the math path: the list applies, no warning
            with DtypeRecorder() as recorder:
                F.scaled_dot_product_attention(q.to(BF16), q.to(BF16), q.to(BF16))
        assert {c.outputs for c in recorder.of("_safe_softmax", "_softmax", "softmax")} == {(FP32,)}
    with ampcore.autocast(device="cpu", custom_white_list={"relu"}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a list naming nothing inside attention: silent
            F.scaled_dot_product_attention(q, q, q)


Region = Callable[[], contextlib.AbstractContextManager[object]]


def _entries_and_result(region: Region, call: Callable[[], torch.Tensor]) -> tuple[int, torch.Tensor]:
    """How often ``call`` enters a policy kernel in ``region`` (after a first call), and its
    result: Python kernels counted through their key table, compiled ones by the extension."""
    compiled = compiled_module()
    with region():
        call()
        table = _dispatch._registry.tables[_dispatch.routes()["cpu"].key]
        saved = table.state
        table.state = (saved[0], _CountingRoutes(saved[1]))
        _CountingRoutes.entries = 0
        before = compiled.entries() if compiled is not None else 0
        try:
            result = call()
        finally:
            table.state = saved
        after = compiled.entries() if compiled is not None else 0
    return _CountingRoutes.entries + after - before, result


class _CountingRoutes(dict):  # type: ignore[type-arg]
    """A key table's remembered routes, counting how often a policy kernel is entered (each
    entry looks its key set up once)."""

    entries = 0

    def get(self, *args):  # type: ignore[no-untyped-def]
        type(self).entries += 1
        return super().get(*args)


@pytest.mark.parametrize(
    ("call", "torch_runs_it"),
    [
        (lambda: torch.mm(X, W), True),  # white, unchanged by the region: torch's C++ kernel
        (lambda: torch.ops.aten.mse_loss(X_BF16, Y_BF16), True),  # black, unchanged
        (lambda: X - Y, False),  # on no list: passed below autocast
        (lambda: X_BF16.mean((0,)), True),  # on no list; its bf16 kernel's own upcasts stay inside it
        (lambda: X * Y, False),  # the customised op: cast by ampcore
    ],
)
def test_a_customised_region_enters_ampcores_kernel_once_per_op_call(
    call: Callable[[], torch.Tensor], torch_runs_it: bool
) -> None:
    """An op whose policy the region leaves as torch's is handed to torch's own autocast
    kernel, which must not send the op it calls back through ampcore's kernel (twice the
    Python cost, and the op's internals would see the region's policy where torch's do not)."""
    with ampcore.autocast(device="cpu", custom_white_list={"mul"}):
        expected = call()
    entries, result = _entries_and_result(lambda: ampcore.autocast(device="cpu", custom_white_list={"mul"}), call)
    assert entries == 1
    torch.testing.assert_close(result, expected, rtol=0, atol=0)
    if torch_runs_it:
        with torch.autocast("cpu", dtype=BF16):
            torch.testing.assert_close(result, call(), rtol=0, atol=0)


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_batch_norm_at_a_level_enters_no_kernel_with_or_without_custom_lists(training: bool) -> None:
    """torch's batch-norm wrappers hold only ops levels never cast: under O2, with or without
    custom lists naming none of them, no kernel of ampcore's is entered (issue 26: none of them
    has one; before, one entry, and three with a custom list), with torch's result and
    statistics."""
    x = torch.randn(4, 3, 5, 5).to(BF16)

    def run(region: Region) -> tuple[int, torch.Tensor, torch.Tensor]:
        norm = nn.BatchNorm2d(3).train(training)
        norm.running_mean.fill_(0.5)
        entries, out = _entries_and_result(region, lambda: norm(x))
        return entries, out, norm.running_mean.clone()

    sealed, out, stats = run(lambda: ampcore.autocast(device="cpu", level="O2"))
    reached, out_reached, stats_reached = run(
        lambda: ampcore.autocast(device="cpu", level="O2", custom_white_list={"mul"})
    )
    with torch.autocast("cpu", dtype=BF16):
        norm = nn.BatchNorm2d(3).train(training)
        norm.running_mean.fill_(0.5)
        norm(x)
        expected = norm(x)
    assert sealed == 0 and reached == 0
    assert out.dtype == BF16
    for got in (out, out_reached):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for got in (stats, stats_reached):
        torch.testing.assert_close(got, norm.running_mean, rtol=0, atol=0)  # moved twice in training


def test_batch_norm_descends_where_the_policys_own_lists_name_an_op_inside() -> None:
    """A policy without custom lists may still list a batch-norm kernel (a backend's lists,
    applied by a resident kernel): then the wrappers must let the call reach it."""
    from types import SimpleNamespace

    from ampcore._policy.kernels import OverloadSpec, Plan, decided_step  # noqa: PLC0415 - internal

    spec = OverloadSpec.of("batch_norm")
    resident = SimpleNamespace(native={}, provider=lambda dtype: None, own=frozenset())  # no THROUGH
    plain = SimpleNamespace(actions={"mm": Action.LOW}, reach=False, default=Action.LOW)
    listing = SimpleNamespace(actions={"native_batch_norm": Action.FP32}, reach=False, default=Action.LOW)
    custom = SimpleNamespace(actions={}, reach=True, default=Action.LOW)
    assert decided_step(spec, plain, resident) is Action.FOLLOW  # type: ignore[arg-type]
    assert decided_step(spec, listing, resident) is Plan.DESCEND  # type: ignore[arg-type]
    assert decided_step(spec, custom, resident) is Plan.DESCEND  # type: ignore[arg-type]
    assert decided_step(OverloadSpec.of("dropout"), plain, resident) is Plan.DESCEND  # type: ignore[arg-type]


def test_plans_hand_only_unchanged_native_policies_to_torchs_kernels() -> None:
    from ampcore._policy.kernels import OverloadSpec, Plan, plan  # noqa: PLC0415 - internal

    with ampcore.autocast(device="cpu", custom_white_list={"mul"}, custom_black_list={"mm"}):
        policy = thread_state().policies["cpu"]
    (client,) = (c for table in _dispatch._registry.tables.values() for c in table.clients if c.device_type == "cpu")
    planned = lambda overload: plan(OverloadSpec.of(overload), policy, client)  # noqa: E731
    assert planned("bmm") is Plan.PASS  # white in torch's list and in the region's
    assert planned("mse_loss") is Plan.PASS  # black in both
    assert planned("mm") is Action.FP32  # the region black-lists it: ampcore casts
    assert planned("mul.Tensor") is Action.LOW  # the region white-lists it
    assert planned("linear") is Action.LOW  # a composite the region must decompose (reach)
    assert planned("sub.Tensor") is Action.FOLLOW  # on no list at O1
