"""A short mixed-precision training run on the best available backend.

Trains the same small MLP regression in float32 and under ``ampcore.autocast`` (level O1)
from the same initial weights and data, and prints step times and final losses.  The O1 run
goes through ``ampcore.GradScaler``: it scales the loss for float16 (whose small gradients
would underflow) and is a transparent no-op for bfloat16.

    python examples/train_o1.py [--device cpu] [--steps 30] [--size 1024] [--batch 256]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time

import torch
from torch import nn

import ampcore


def build(size: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(size, size), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(size, 1))


def train(
    model: nn.Module,
    data: torch.Tensor,
    target: torch.Tensor,
    steps: int,
    region: ampcore.autocast | None,
    scaler: ampcore.GradScaler | None,
) -> tuple[float, float]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    loss = torch.tensor(0.0)
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with region or contextlib.nullcontext():
            loss = nn.functional.mse_loss(model(data), target)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)  # skipped when a gradient overflowed
            scaler.update()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:] or times) * 1e3, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="backend name, e.g. cpu or cuda:0 (default: best available)")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype) if args.dtype else None
    try:  # a backend that is unknown or cannot run here: one clear line, not a traceback
        region = ampcore.autocast(device=args.device, dtype=dtype, level="O1")
        scaler = ampcore.GradScaler(args.device, dtype=region.dtype)
    except ampcore.AmpcoreError as exc:
        sys.exit(f"train_o1.py: {exc}")
    device = torch.device(region.device_type, region.device_index or 0)
    torch.manual_seed(0)
    base = build(args.size).to(device)
    data = torch.randn(args.batch, args.size, device=device)
    target = data[:, :1].clone()

    print(
        f"\nbackend {region.backend.name} ({region.backend.device_name(region.device_index or 0)}), "
        f"dtype {region.dtype}"
    )
    print(f"{'mode':<6} {'ms/step':>8} {'speed-up':>8} {'final loss':>11} {'loss scale':>10}")
    fp32_ms, fp32_loss = train(copy.deepcopy(base), data, target, args.steps, None, None)
    o1_ms, o1_loss = train(copy.deepcopy(base), data, target, args.steps, region, scaler)
    scale = f"{scaler.get_scale():g}" if scaler.is_enabled() else "- (none)"
    print(f"{'fp32':<6} {fp32_ms:8.2f} {1.0:8.2f} {fp32_loss:11.6f} {'-':>10}")
    print(f"{'O1':<6} {o1_ms:8.2f} {fp32_ms / o1_ms:8.2f} {o1_loss:11.6f} {scale:>10}")


if __name__ == "__main__":
    main()
