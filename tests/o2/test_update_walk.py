"""The walk of O2's own master-weight updates on backends that ask for chunks: chunks or
whole tensors, whichever times faster, following the machine's load (issue 31)."""

from __future__ import annotations

from ampcore._o2.update_walk import CHUNK_ALIGN, FIRST_PROBE, LAST_PROBE, UpdateWalk

CHUNK = 1 << 18


def drive(walk: UpdateWalk, cost: dict[int | None, float], steps: int) -> list[int | None]:
    """Run ``steps`` updates whose walks take ``cost[walk]`` seconds; the walks used."""
    used: list[int | None] = []
    for _ in range(steps):
        chunk = walk.next_chunk()
        walk.record(chunk, cost[chunk])
        used.append(chunk)
    return used


def test_both_walks_are_timed_first_and_the_faster_is_used() -> None:
    walk = UpdateWalk(CHUNK)
    used = drive(walk, {CHUNK: 1.0, None: 1.5}, 3 + FIRST_PROBE)
    assert used[:3] == [CHUNK, CHUNK, None]  # untimed first step, then one of each
    assert used[3:] == [CHUNK] * FIRST_PROBE and walk.current == CHUNK


def test_contention_moves_the_update_to_whole_tensors_and_back() -> None:
    """On a quiet CPU chunks win; with a busy sibling process their thousands of parallel
    regions lose to whole tensors: the walk follows within one re-timing interval."""
    walk = UpdateWalk(CHUNK)
    drive(walk, {CHUNK: 1.0, None: 1.4}, 40)  # quiet
    assert walk.current == CHUNK
    used = drive(walk, {CHUNK: 4.0, None: 1.2}, LAST_PROBE + 2)  # busy
    assert walk.current is None and used[-FIRST_PROBE:].count(CHUNK) <= 1
    drive(walk, {CHUNK: 1.0, None: 1.4}, LAST_PROBE + 2)  # quiet again
    assert walk.current == CHUNK


def test_re_timing_backs_off_while_the_choice_holds() -> None:
    walk = UpdateWalk(CHUNK)
    used = drive(walk, {CHUNK: 1.0, None: 3.0}, 2000)
    probes = used[3:].count(None)
    assert 0 < probes <= 2000 // LAST_PROBE + 4  # intervals 16, 32, ... 256: a few percent at most


def test_whole_tensor_backends_and_fixed_walks_are_never_timed() -> None:
    def clock() -> float:
        raise AssertionError("timed")

    for walk in (UpdateWalk(None, True, clock), UpdateWalk(CHUNK, False, clock)):
        assert not walk.adaptive
        assert [walk.run(lambda chunk: chunk) for _ in range(5)] == [walk.chunk] * 5


def test_the_cpu_adapter_times_its_chunks_against_whole_tensors() -> None:
    import torch

    import ampcore
    from ampcore._o2.master import master_weights_of

    model = torch.nn.Linear(4, 4)
    model, opt = ampcore.decorate(model, torch.optim.SGD(model.parameters(), lr=0.1), device="cpu")
    weights = master_weights_of(opt)
    assert weights is not None and weights.walk.adaptive
    assert weights.walk.chunk == ampcore.get_backend("cpu").master_update_chunk_elements


def test_alike_walks_go_whole_untimed_and_leave_the_measurements_alone() -> None:
    def clock() -> float:
        raise AssertionError("timed")

    walk = UpdateWalk(CHUNK, True, clock)
    assert [walk.run(lambda chunk: chunk, alike=True) for _ in range(5)] == [None] * 5
    assert walk.next_chunk() == CHUNK  # a later update that can differ starts the timing afresh


def test_walks_differ_where_a_chunk_splits_a_tensor_or_batches_a_group() -> None:
    import torch

    from ampcore._o2.update_walk import walks_differ

    def groups(*sizes: int) -> list[dict[str, object]]:
        return [{"params": [torch.empty(size) for size in sizes]}]

    assert not walks_differ(groups(CHUNK, CHUNK), None, batched=True)  # whole tensors only
    assert walks_differ(groups(CHUNK + 1), CHUNK, batched=False)  # a tensor in chunks
    assert not walks_differ(groups(CHUNK, CHUNK), CHUNK, batched=False)  # SGD: small ones go together either way
    assert walks_differ(groups(CHUNK, 1), CHUNK, batched=True)  # Adam: a chunk's worth per call
    assert not walks_differ(groups(CHUNK // 2, CHUNK // 2) * 2, CHUNK, batched=True)
    # GradScaler's deferred unscaling widens a quarter of all elements at a time, at most a
    # chunk on the chunked walk: more than four chunks' worth makes the walks differ
    assert not walks_differ(groups(CHUNK // 2, CHUNK // 2) * 4, CHUNK, batched=True, slices=4)
    assert walks_differ(groups(CHUNK // 2, CHUNK // 2) * 5, CHUNK, batched=False, slices=4)


def test_a_chunk_is_a_multiple_of_the_alignment() -> None:
    """torch's CPU fused kernels round a vector body and a scalar tail differently: a chunk
    boundary inside a 64-byte unit or a vector gave other bits than the whole tensor."""
    assert UpdateWalk(7).chunk == CHUNK_ALIGN == 64
    assert UpdateWalk(100).chunk == 128
    assert UpdateWalk(1 << 18).chunk == 1 << 18
    assert UpdateWalk(None).chunk is None
