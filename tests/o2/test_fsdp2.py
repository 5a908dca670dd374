"""FSDP2 (``fully_shard``): ampcore.autocast trains sharded models exactly as the raw loop;
decorate refuses FSDP2 in both orders.  2 processes on gloo (127.0.0.1, a free port)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ampcore

fsdp = pytest.importorskip("torch.distributed.fsdp", reason="torch.distributed.fsdp (FSDP2) is not available")
pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available"),
    pytest.mark.skipif(not hasattr(fsdp, "fully_shard"), reason="this torch has no FSDP2 fully_shard"),
]

WORLD = 2
STEPS = 4
REGION: dict[str, Any] = {"device": "cpu", "level": "OD", "custom_white_list": {"gelu"}}


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with ampcore.autocast(**REGION):
        return nn.functional.mse_loss(model(x).float(), y)


def _sharded_run(rank: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    fully_shard(model[0])
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        loss = loss_of(model, *batch(step, rank))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    params = [p.full_tensor().detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]
    return {"losses": losses, "params": params}


def _reduced_gradient(rank: int) -> float:
    """What plain torch's FSDP2 makes of the gradients 1.0 (rank 0) and 2.0 (rank 1): their
    mean, 1.5 (torch 2.13), or their sum, 3.0 (torch 2.8 on gloo)."""
    from torch.distributed.fsdp import fully_shard

    probe = nn.Linear(1, 2, bias=False)
    fully_shard(probe)
    probe(torch.full((1, 1), float(rank + 1))).sum().backward()
    return float(probe.weight.grad.full_tensor()[0, 0])  # type: ignore[union-attr]


def _mixed_precision_policy_run(rank: int) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = make_model()
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.full_tensor().detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]
    x, y = batch(0, rank)
    with ampcore.autocast(device="cpu", level="O2"):
        out = model(x)
    nn.functional.mse_loss(out.float(), y).backward()
    opt.step()
    after = [p.full_tensor() for p in model.parameters()]  # type: ignore[attr-defined]
    return {
        "out_dtype": out.dtype,
        "param_dtype": model[0].weight.dtype,
        "moved": [not torch.equal(a, b) for a, b in zip(before, after, strict=False)],
    }


def _refusals() -> dict[str, str]:
    from torch.distributed.fsdp import fully_shard

    errors: dict[str, str] = {}
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ampcore.decorate(model, opt, device="cpu")
    fully_shard(model)
    try:
        model(torch.randn(2, 8))
    except ampcore.AmpcoreError as exc:
        errors["decorate_then_shard"] = str(exc)
    holder = nn.Sequential(make_model())  # fully_shard on a module that holds the decorated model
    ampcore.decorate(holder[0], device="cpu")
    fully_shard(holder)
    try:
        holder(torch.randn(2, 8))
    except ampcore.AmpcoreError as exc:
        errors["decorate_then_shard_parent"] = str(exc)
    sharded = make_model()
    fully_shard(sharded)
    try:
        ampcore.decorate(sharded, torch.optim.SGD(sharded.parameters(), lr=0.1), device="cpu")
    except ampcore.AmpcoreError as exc:
        errors["shard_then_decorate"] = str(exc)
    return errors


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    result: dict[str, Any] = {}
    try:
        result["reduced_gradient"] = _reduced_gradient(rank)
        result["sharded"] = _sharded_run(rank)
        result["policy"] = _mixed_precision_policy_run(rank)
        result["errors"] = _refusals()
    finally:
        torch.save(result, Path(out) / f"rank{rank}.pt")
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("fsdp2")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]


@pytest.mark.slow
def test_autocast_with_fully_shard_matches_the_raw_loop_over_both_ranks(results: list[dict[str, Any]]) -> None:
    """The raw loop: one process, each rank's batch in turn, gradients reduced as this torch's
    FSDP2 does without ampcore: averaged (bit for bit), or summed (torch 2.8 on gloo; the
    same up to rounding)."""
    factor = results[0]["reduced_gradient"] / 1.5  # 1: FSDP2 averages; 2: it sums
    assert factor in (1.0, WORLD), results[0]["reduced_gradient"]
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        for rank in range(WORLD):
            loss = loss_of(model, *batch(step, rank))
            (loss * factor / WORLD).backward()
            got = results[rank]["sharded"]["losses"][step]
            if factor == 1.0:
                assert torch.equal(got, loss.detach()), (step, rank)
            else:
                torch.testing.assert_close(got, loss.detach(), rtol=1e-5, atol=0, msg=f"step {step} rank {rank}")
        opt.step()
        opt.zero_grad()
    for rank in range(WORLD):
        for got, want in zip(results[rank]["sharded"]["params"], model.parameters(), strict=False):
            torch.testing.assert_close(got, want.detach())


@pytest.mark.slow
def test_fully_shard_mixed_precision_policy_with_autocast_o2_trains(results: list[dict[str, Any]]) -> None:
    policy = results[0]["policy"]
    assert policy["out_dtype"] == torch.bfloat16
    assert all(policy["moved"])


@pytest.mark.slow
def test_decorate_then_fully_shard_raises_at_the_first_forward(results: list[dict[str, Any]]) -> None:
    for key in ("decorate_then_shard", "decorate_then_shard_parent"):
        message = results[0]["errors"].get(key, "")
        assert "replaced after ampcore.decorate(level='O2'), as FSDP2's fully_shard does" in message, key
        assert "MixedPrecisionPolicy(param_dtype=torch.bfloat16" in message and "ampcore.autocast" in message


@pytest.mark.slow
def test_fully_shard_then_decorate_is_refused(results: list[dict[str, Any]]) -> None:
    message = results[0]["errors"].get("shard_then_decorate", "")
    assert "already sharded by FSDP2's fully_shard" in message and "MixedPrecisionPolicy" in message
