"""decorate, then DistributedDataParallel: 2 processes on gloo (127.0.0.1, a free port)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ampcore

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

WORLD = 2
STEPS = 5
#: ``decorate(master_grad=True)`` needs ``Tensor.grad_dtype`` (torch 2.13; 2.8 lacks it)
HAS_GRAD_DTYPE = hasattr(torch.Tensor, "grad_dtype")


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)


def train(model: nn.Module, opt: torch.optim.Optimizer, rank: int | None) -> None:
    """``rank=None``: one process on both ranks' data (the full batch)."""
    scaler = ampcore.GradScaler("cpu")
    for step in range(STEPS):
        parts = [batch(step, r) for r in (range(WORLD) if rank is None else [rank])]
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        opt.zero_grad()
        with ampcore.autocast(device="cpu", level="O2"):
            loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    result: dict[str, object] = {}
    try:
        # each rank starts from its own weights: DDP broadcasts rank 0's, and the masters follow
        model = make_model(seed=rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model, opt = ampcore.decorate(model, opt, device="cpu")
        ddp = nn.parallel.DistributedDataParallel(model)
        train(ddp, opt, rank)
        result["masters"] = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
        result["params"] = [p.detach().clone() for p in model.parameters()]
        result["dtypes"] = [p.dtype for p in model.parameters()]
        try:
            ampcore.decorate(nn.parallel.DistributedDataParallel(make_model(0)), device="cpu")
        except ampcore.AmpcoreError as exc:
            result["wrapped_error"] = str(exc)
        if HAS_GRAD_DTYPE:  # master_grad=True needs it (older torch: refused, test_master_weights.py)
            master_grad_model = make_model(0)
            sgd = torch.optim.SGD(master_grad_model.parameters(), lr=0.1)
            ampcore.decorate(master_grad_model, sgd, device="cpu", master_grad=True)
            try:
                nn.parallel.DistributedDataParallel(master_grad_model)(torch.randn(2, 8))
            except ampcore.AmpcoreError as exc:
                result["master_grad_error"] = str(exc)
    finally:
        torch.save(result, Path(out) / f"rank{rank}.pt")
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]


@pytest.mark.slow
def test_ranks_stay_identical_and_match_one_process_on_the_full_batch(results: list[dict[str, object]]) -> None:
    first, second = results
    assert first["dtypes"] == [torch.bfloat16] * 6  # LayerNorm too: bf16 keeps it low precision
    for key in ("masters", "params"):
        assert all(torch.equal(a, b) for a, b in zip(first[key], second[key], strict=False)), key  # type: ignore[call-overload]
    # one process, rank 0's weights as DDP broadcast them (bf16), both ranks' data at once
    model = make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param)  # as the broadcast does: the masters adopt the bf16 values
    train(model, opt, rank=None)
    expected = [p for g in opt.param_groups for p in g["params"]]
    for got, want in zip(first["masters"], expected, strict=False):  # type: ignore[call-overload]
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)


@pytest.mark.slow
def test_an_already_wrapped_model_is_refused_with_the_order_explained(results: list[dict[str, object]]) -> None:
    message = str(results[0].get("wrapped_error"))
    assert "already wrapped in DistributedDataParallel. Decorate first, then wrap" in message


@pytest.mark.slow
@pytest.mark.skipif(not HAS_GRAD_DTYPE, reason=f"master_grad=True needs Tensor.grad_dtype; torch {torch.__version__}")
def test_master_grad_under_ddp_is_refused_at_the_first_forward(results: list[dict[str, object]]) -> None:
    assert "master_grad=True" in str(results[0].get("master_grad_error"))
