"""GradScaler under torch.distributed: 2 processes on gloo, DDP, an overflow on one rank only."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import ampcore

WORLD = 2
OVERFLOW_STEP = 1


def _train(rank: int, sync_found_inf: bool) -> dict[str, object]:
    """Four DDP steps; after the backward of step 1, only rank 1 finds an inf in a gradient
    (as when a device's own overflow flag fires on one rank: DDP already averaged)."""
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampcore.GradScaler(
        "cpu", dtype=torch.float16, init_scale=256.0, growth_interval=2, sync_found_inf=sync_found_inf
    )
    data = torch.Generator().manual_seed(rank)
    skipped, scales = [], []
    for step in range(4):
        opt.zero_grad()
        loss = model(torch.randn(16, 8, generator=data)).pow(2).mean()
        scaler.scale(loss).backward()
        if step == OVERFLOW_STEP and rank == 1:
            model.module.weight.grad[0, 0] = math.inf
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        skipped.append(all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)))
        scales.append(scaler.get_scale())
    return {"skipped": skipped, "scales": scales, "params": [p.detach().clone() for p in model.parameters()]}


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results = {"synced": _train(rank, True), "alone": _train(rank, False)}
    finally:
        dist.destroy_process_group()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")


@pytest.mark.slow
def test_every_rank_skips_the_step_that_overflowed_on_one_rank(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    synced = [r["synced"] for r in ranks]
    expected_skips = [step == OVERFLOW_STEP for step in range(4)]
    assert synced[0]["skipped"] == synced[1]["skipped"] == expected_skips
    assert synced[0]["scales"] == synced[1]["scales"] == [256.0, 128.0, 128.0, 256.0]
    assert all(torch.equal(a, b) for a, b in zip(synced[0]["params"], synced[1]["params"], strict=True))
    # Without the all-reduce the ranks disagree: rank 0 steps, rank 1 skips, weights diverge.
    alone = [r["alone"] for r in ranks]
    assert alone[0]["skipped"] == [False] * 4 and alone[1]["skipped"] == expected_skips
    assert alone[0]["scales"] != alone[1]["scales"]
