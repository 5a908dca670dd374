"""The Adam/AdamW update alone: O2's chunked master-weight update against torch's optimizer on
float32 parameters (what O1 and fp32 training run) and on bfloat16 parameters and states (the
hand-written bf16 loop), issue 17.

The seed network's parameters (9 x ``Linear(WIDTH, WIDTH)``) with fixed random gradients;
each round runs one ``optimizer.step()`` of every setup (O2 once per chunk size), in an order
that rotates per round.  The table gives the median of the timed rounds and the ratios
against the float32 and the bfloat16 update of the same run.  The chunk size is an
experiment knob (set on each O2 optimizer's master weights; 0: whole tensors, as the GPU
adapters ask for; the CPU adapter's own value by default).

    python benchmarks/bench_adam_update.py                      # AdamW, torch's threads
    python benchmarks/bench_adam_update.py --optimizer adam --threads 1 --chunks 262144 1048576
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Final

import torch

import ampcore
from ampcore._cli.experiment import SeedNet
from ampcore._o2.master import master_weights_of
from ampcore._o2.update_walk import UpdateWalk

OPTIMIZERS: Final = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def setup(kind: str, optimizer: str, width: int, chunk: int | None = None) -> Callable[[], None]:
    """One optimizer step of a fresh seed network of ``kind`` (fp32, bf16, O2), its
    gradients set before every step (outside the timed call)."""
    torch.manual_seed(0)
    model: torch.nn.Module = SeedNet(width)
    if kind == "bf16":
        model.to(torch.bfloat16)
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=1e-4)
    if kind == "O2":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bf16 emulated on CPUs without bf16 instructions
            model, opt = ampcore.decorate(model, opt, level="O2", device="cpu")
        weights = master_weights_of(opt)
        if weights is not None:
            weights.walk = UpdateWalk(chunk or None, adaptive=False)
    params = list(model.parameters())
    grads = [torch.randn_like(p) for p in params]

    def step() -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        opt.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="adamw")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    cpu_chunk = ampcore.get_backend("cpu").master_update_chunk_elements
    parser.add_argument("--chunks", type=int, nargs="+", default=[cpu_chunk or 0], help="O2 chunk sizes (0: whole)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (after one warm-up round)")
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    name = "AdamW" if args.optimizer == "adamw" else "Adam"
    steps = {
        f"fp32 {name} (torch)": setup("fp32", args.optimizer, args.width),
        f"bf16 {name} (bf16 params and states)": setup("bf16", args.optimizer, args.width),
    }
    for chunk in args.chunks:
        label = f"O2 chunked, {chunk} elements" if chunk else "O2 whole tensors"
        steps[label] = setup("O2", args.optimizer, args.width, chunk)
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds + 1):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            steps[n]()
            if r:
                times[n].append(time.perf_counter() - start)
    medians = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    fp32, bf16 = medians[names[0]], medians[names[1]]
    print(
        f"\n{name} update of 9 x Linear({args.width}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"median of {args.rounds} rounds, load average {os.getloadavg()[0]:.2f}\n"
    )
    print("| update | ms | / fp32 | / bf16 |")
    print("|---|---:|---:|---:|")
    for n in names:
        print(f"| {n} | {medians[n]:.1f} | {medians[n] / fp32:.3f} | {medians[n] / bf16:.3f} |")


if __name__ == "__main__":
    main()
