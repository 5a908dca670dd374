"""The bench's network before and after issue 30: torch's ``nn.Linear`` (``addmm``) against
Paddle's Linear (``GuideLinear``: ``matmul`` + a separate bias add), float32 training steps of
9 layers, interleaved rounds, medians.

    python benchmarks/bench_guide_linear.py                 # 2048 x batch 512, 5 rounds
    python benchmarks/bench_guide_linear.py --size 512 --batch 128 --rounds 11
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from ampcore._cli.experiment import SeedNet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after one warm-up)")
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    x, y = torch.rand(args.batch, args.size), torch.rand(args.batch, args.size)
    nets = {
        "torch nn.Linear (before)": nn.Sequential(*[nn.Linear(args.size, args.size) for _ in range(9)]),
        "GuideLinear (after)": SeedNet(args.size),
    }
    opts = {name: torch.optim.SGD(net.parameters(), lr=1e-4) for name, net in nets.items()}
    times: dict[str, list[float]] = {name: [] for name in nets}
    for round_ in range(args.rounds + 1):
        for name, net in nets.items():
            start = time.perf_counter()
            nn.functional.mse_loss(net(x), y).backward()
            opts[name].step()
            opts[name].zero_grad()
            if round_:
                times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"{name:26s} {statistics.median(values) * 1e3:8.0f} ms/step (fp32, median of {len(values)})")


if __name__ == "__main__":
    main()
