"""A reentrant activation-checkpointing step under ``ampcore.autocast`` at O1 (issue 28).

Since issue 28, a checkpoint taken in any ampcore region is wrapped so that its reentrant
recomputation casts as the forward pass did (its inputs are kept out of the weight-cast
caches).  This measures what that costs: the same training step (a 3-layer MLP checkpointed
whole, forward + backward) with the wrapper (``new``) and with the previous pass-through at
O1 (``old``), interleaved in one process; and the cost of the idempotent
``recompute.install()`` call each enabled region now makes, against a region's enter + exit.

    python benchmarks/bench_checkpoint_o1.py --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

import ampcore
import ampcore._policy.recompute as recompute


def _per_call_us(run: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    region = ampcore.autocast("cpu")
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    x = torch.randn(32, 64, requires_grad=True)
    new_carry = recompute._carry

    def old_carry(function: Callable[..., Any], reentrant: bool) -> Callable[..., Any]:
        return function if not recompute._snapshot() else new_carry(function, reentrant)

    def step() -> None:
        with region:
            y = checkpoint(net, x, use_reentrant=True)
        y.float().sum().backward()

    def enter_exit() -> None:
        with region:
            pass

    _per_call_us(step, 50)  # warm-up
    times: dict[str, list[float]] = {"new": [], "old": [], "enter_exit": [], "install": []}
    for _ in range(args.rounds):
        recompute._carry = new_carry
        times["new"].append(_per_call_us(step, args.steps))
        recompute._carry = old_carry
        times["old"].append(_per_call_us(step, args.steps))
        recompute._carry = new_carry
        times["enter_exit"].append(_per_call_us(enter_exit, 5000))
        times["install"].append(_per_call_us(recompute.install, 5000))
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"{name:>10}: median {median[name]:9.2f} us (range {min(values):.2f}-{max(values):.2f})")
    print(f"checkpoint step new / old: {median['new'] / median['old']:.3f}")
    print(f"install() / region enter + exit: {median['install'] / median['enter_exit']:.3f}")


if __name__ == "__main__":
    main()
