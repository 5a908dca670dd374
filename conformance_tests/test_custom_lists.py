"""Custom white/black lists: they change the op, reach inside composite modules, and stay
inside their region (nesting, threads, exceptions)."""

from __future__ import annotations

import threading

import pytest
import torch

import ampcore
from ampcore_conformance._checks import OpRecorder, output_dtype, region, require_argument, require_white
from ampcore_conformance._context import SuiteContext
from ampcore_conformance._lists import category
from ampcore_conformance._op_samples import OpSample


@pytest.fixture(autouse=True)
def _custom_lists_exist(amp_backend: ampcore.Backend) -> None:
    feature = "custom op lists (ampcore.autocast(custom_white_list=...))"
    require_argument(region, "custom_white_list", feature, backend=amp_backend, dtype=None, custom_white_list=())


def _unlisted(context: SuiteContext, dtype: torch.dtype) -> str:
    lists = context.lists(dtype)
    for op in ("add", "mul", "tanh"):
        if category(lists, op) == "other":
            return op
    pytest.fail(f"add, mul and tanh are all on lists of the backend for {dtype}; the suite needs one unlisted op")


def _call(op: str, x: torch.Tensor) -> torch.Tensor:
    return getattr(torch, op)(x, x) if op in ("add", "mul") else torch.tanh(x)


@pytest.fixture
def probe(amp_white_ops: list[OpSample]) -> OpSample:
    """A white-list op whose output dtype shows which lists are in effect."""
    return amp_white_ops[0]


def test_custom_white_list_lowers_an_unlisted_op(
    amp_context: SuiteContext,
    amp_backend: ampcore.Backend,
    amp_device: torch.device,
    amp_dtype: torch.dtype,
    probe: OpSample,
) -> None:
    op = _unlisted(amp_context, amp_dtype)
    x = torch.randn(4, 4, device=amp_device)
    with region(amp_backend, amp_dtype):
        plain = _call(op, x).dtype
    with region(amp_backend, amp_dtype, custom_white_list={op}):
        custom = _call(op, x).dtype
        still_low = output_dtype(probe, amp_device)
    expected = (torch.float32, amp_dtype, amp_dtype)
    assert (plain, custom, still_low) == expected, f"{op} without and with custom_white_list, then {probe.name}"


def test_custom_black_list_keeps_a_white_op_fp32(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype, amp_white_ops: list[OpSample]
) -> None:
    if len(amp_white_ops) < 2:
        pytest.skip("the backend's white list has one op the suite can call; the check needs two")
    black, other = amp_white_ops[:2]
    with region(amp_backend, amp_dtype, custom_black_list={black.name}):
        got = output_dtype(black, amp_device), output_dtype(other, amp_device)
    assert got == (torch.float32, amp_dtype), (
        f"custom_black_list={{{black.name!r}}}: {black.name}, {other.name} returned {got}"
    )


def _attention(device: torch.device) -> tuple[torch.nn.MultiheadAttention, torch.Tensor]:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).to(device)
    return mha, torch.randn(2, 5, 16, device=device)


def test_custom_black_list_reaches_inside_multihead_attention(
    amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    """``nn.MultiheadAttention`` calls bmm/baddbmm internally: a black list must reach them."""
    require_white(amp_context, amp_dtype, ["linear", "bmm", "baddbmm"])
    mha, x = _attention(amp_device)
    runs: dict[str, OpRecorder] = {}
    for key, kwargs in (("plain", {}), ("custom", {"custom_black_list": {"bmm", "baddbmm"}})):
        with region(amp_backend, amp_dtype, **kwargs), OpRecorder() as recorder:
            mha(x, x, x, need_weights=True)
        runs[key] = recorder
    products = {"bmm", "baddbmm"} & runs["plain"].ops()
    assert products, f"nn.MultiheadAttention called none of bmm/baddbmm (saw {sorted(runs['plain'].ops())})"
    plain = set().union(*(runs["plain"].input_dtypes(op) for op in products))
    custom = set().union(*(runs["custom"].input_dtypes(op) for op in products))
    assert plain == {amp_dtype}, f"without custom lists the attention products ran in {plain}"
    assert custom == {torch.float32}, f"with custom_black_list={{'bmm', 'baddbmm'}} they ran in {custom}"
    assert amp_dtype in runs["custom"].input_dtypes("addmm") | runs["custom"].input_dtypes("mm"), (
        "projections left white"
    )


def test_custom_white_list_reaches_inside_transformer_layer(
    amp_context: SuiteContext, amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype
) -> None:
    """The residual ``add`` inside ``nn.TransformerEncoderLayer`` follows a custom white list."""
    if category(amp_context.lists(amp_dtype), "add") != "other":
        pytest.skip(f"add is already on a list of the backend for {amp_dtype}")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).to(amp_device)
    x = torch.randn(2, 5, 16, device=amp_device)
    with region(amp_backend, amp_dtype, custom_white_list={"add"}), OpRecorder() as recorder:
        layer(x)
    adds = [dtypes for name, dtypes in recorder.calls if name == "add" and dtypes]
    assert adds and all(set(d) == {amp_dtype} for d in adds), f"add inputs inside the layer: {adds}"


def test_custom_lists_stay_in_their_region(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype, probe: OpSample
) -> None:
    op, seen = probe.name, []
    with region(amp_backend, amp_dtype, custom_black_list={op}):
        seen.append(output_dtype(probe, amp_device))
        with region(amp_backend, amp_dtype, custom_white_list={op}):
            seen.append(output_dtype(probe, amp_device))
        seen.append(output_dtype(probe, amp_device))
        with pytest.raises(KeyError):
            with region(amp_backend, amp_dtype, custom_white_list={op}):
                raise KeyError("boom")
        seen.append(output_dtype(probe, amp_device))
    with region(amp_backend, amp_dtype):
        seen.append(output_dtype(probe, amp_device))
    assert seen == [torch.float32, amp_dtype, torch.float32, torch.float32, amp_dtype]


def test_custom_lists_are_thread_local(
    amp_backend: ampcore.Backend, amp_device: torch.device, amp_dtype: torch.dtype, probe: OpSample
) -> None:
    op = probe.name
    barrier = threading.Barrier(2, timeout=60)
    seen: dict[str, torch.dtype] = {}

    def worker() -> None:
        with region(amp_backend, amp_dtype, custom_black_list={op}):
            barrier.wait()
            seen["thread"] = output_dtype(probe, amp_device)
            barrier.wait()

    thread = threading.Thread(target=worker)
    thread.start()
    with region(amp_backend, amp_dtype):
        barrier.wait()
        seen["main"] = output_dtype(probe, amp_device)
        barrier.wait()
    thread.join(60)
    assert seen == {"thread": torch.float32, "main": amp_dtype}


def test_invalid_custom_lists_are_rejected(
    amp_backend: ampcore.Backend, amp_dtype: torch.dtype, probe: OpSample
) -> None:
    op = probe.name
    with pytest.raises(ampcore.AmpcoreError, match="both"):
        region(amp_backend, amp_dtype, custom_white_list={op}, custom_black_list={op})
    with pytest.raises(ampcore.AmpcoreError, match="not_an_op"):
        region(amp_backend, amp_dtype, custom_white_list={"not_an_op"})
