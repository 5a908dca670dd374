"""Region lifecycle under misuse (issue 12): bad arguments, doubled or out-of-order exits,
asyncio tasks, copies and pickles. Every failure is an AmpcoreError and leaves the thread's
autocast state as it was."""

from __future__ import annotations

import asyncio
import copy
import io
import pickle
import threading

import pytest
import torch
from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)

import ampcore
from ampcore._policy.thread_state import thread_state

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
X = torch.randn(4, 4)


def assert_clean() -> None:
    assert not torch.is_autocast_enabled("cpu")
    assert thread_state().stack == [] and thread_state().policies == {}
    assert (X + X).dtype == FP32 and torch.mm(X, X).dtype == FP32


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"dtype": FP16, "cache_enabled": "yes"}, "cache_enabled"),
        ({"cache_enabled": 1}, "cache_enabled"),
        ({"enabled": "no"}, "enabled"),
        ({"custom_whitelist": {"add"}}, "custom_white_list"),
        ({"levle": "O2"}, "level"),
        ({"device_type": "cpu", "device": "cpu"}, "device"),
        ({"enable": False, "enabled": False}, "enabled"),
    ],
)
def test_bad_arguments_raise_and_change_nothing(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=named):
        ampcore.autocast(**kwargs)  # type: ignore[arg-type]
    assert_clean()


def test_torch_and_paddle_keyword_names_are_accepted() -> None:
    with ampcore.autocast(device_type="cpu"):
        assert torch.mm(X, X).dtype == BF16
    with ampcore.autocast(device="cpu", enable=False):
        assert torch.mm(X, X).dtype == FP32
    assert_clean()


def test_a_second_exit_raises_and_keeps_the_outer_region() -> None:
    outer = ampcore.autocast(device="cpu", custom_white_list={"add"})
    inner = ampcore.autocast(device="cpu", level="OD")
    with outer:
        with inner:
            pass
        with pytest.raises(ampcore.AmpcoreError, match="not the innermost"):
            inner.__exit__(None, None, None)
        assert (X + X).dtype == BF16  # the outer region is untouched
    with pytest.raises(ampcore.AmpcoreError, match="exited twice"):
        outer.__exit__(None, None, None)
    assert_clean()


def test_out_of_order_exit_raises() -> None:
    first, second = ampcore.autocast(device="cpu"), ampcore.autocast(device="cpu", level="OD")
    first.__enter__()
    second.__enter__()
    with pytest.raises(ampcore.AmpcoreError, match="innermost"):
        first.__exit__(None, None, None)
    second.__exit__(None, None, None)
    first.__exit__(None, None, None)
    assert_clean()


def test_the_same_object_nests_and_serves_threads() -> None:
    region = ampcore.autocast(device="cpu", custom_white_list={"add"})
    seen: list[torch.dtype] = []

    def work() -> None:
        with region:
            seen.append((X + X).dtype)

    with region:
        with region:
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
            assert (X + X).dtype == BF16
    assert seen == [BF16]
    assert_clean()


def test_a_generator_closed_in_another_thread_raises_there() -> None:
    def gen():  # type: ignore[no-untyped-def]
        with ampcore.autocast(device="cpu", level="OD"):
            yield 1

    g = gen()
    next(g)
    errors: list[BaseException] = []

    def close() -> None:
        try:
            g.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=close)
    thread.start()
    thread.join()
    assert errors and isinstance(errors[0], ampcore.AmpcoreError)
    assert "another thread" in str(errors[0])
    # this thread's region is still entered: exit it where it was entered
    region = thread_state().stack[-1].owner
    region.__exit__(None, None, None)  # type: ignore[attr-defined]
    assert_clean()


@pytest.mark.parametrize("planned", [False, True], ids=["first-entry", "planned"])
def test_asyncio_tasks_cannot_share_a_thread_region(planned: bool) -> None:
    """Also for regions entered before, which enter from a plan (issue 26 item 3)."""
    for _ in range(3 if planned else 0):
        with ampcore.autocast(device="cpu", custom_white_list={"add"}), ampcore.autocast(device="cpu", level="OD"):
            pass
    results: dict[str, object] = {}

    async def a() -> None:
        with ampcore.autocast(device="cpu", custom_white_list={"add"}):
            await asyncio.sleep(0.01)
            results["a"] = (X + X).dtype

    async def b() -> None:
        await asyncio.sleep(0.001)  # a is inside its region now
        try:
            with ampcore.autocast(device="cpu", level="OD"):
                results["b"] = "entered"
        except ampcore.AmpcoreError as exc:
            results["b"] = exc
        results["b add"] = (X + X).dtype  # b's ops, while a's region is active in the thread

    async def main() -> None:
        await asyncio.gather(a(), b())

    asyncio.run(main())
    assert isinstance(results["b"], ampcore.AmpcoreError) and "asyncio task" in str(results["b"])
    assert results["a"] == BF16
    assert_clean()


def test_regions_copy_and_pickle_like_torch_autocast() -> None:
    region = ampcore.autocast(device="cpu", dtype=BF16, level="OD", custom_black_list={"mm"}, cache_enabled=False)
    for clone in (copy.copy(region), copy.deepcopy(region), pickle.loads(pickle.dumps(region))):
        assert repr(clone) == repr(region) and clone.cache_enabled is False
        with clone:
            assert torch.mm(X, X).dtype == FP32
    module = torch.nn.Linear(2, 2)
    module.region = ampcore.autocast(device="cpu")  # type: ignore[assignment]
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert repr(loaded.region) == repr(module.region)
    assert repr(copy.deepcopy(ampcore.autocast(device="cpu", level="O0"))).endswith("enabled=False)")
    assert_clean()


def test_active_region_reports_the_innermost_region() -> None:
    assert ampcore.active_region() is None
    with ampcore.autocast(device="cpu", custom_white_list={"add"}):
        with ampcore.autocast(device="cpu", level="OD", custom_black_list={"mm"}):
            info = ampcore.active_region("cpu")
            assert info is not None
            assert (info.backend, info.device_type, info.level, info.dtype) == ("cpu", "cpu", "OD", BF16)
            assert info.custom_white_list == {"add"} and info.custom_black_list == {"mm"}
        assert ampcore.active_region().level == "O1"  # type: ignore[union-attr]
    assert ampcore.active_region() is None
    with pytest.raises(ampcore.AmpcoreError, match="unknown backend"):
        ampcore.active_region("tpu9")
