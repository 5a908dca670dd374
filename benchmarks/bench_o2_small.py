"""Level O2 on small-op models (issue 17): training steps of ``ampcore.decorate`` + O2 against
``torch.autocast`` with float32 parameters, on a 4-layer TransformerEncoder and a small CNN.

Each model runs three ways from the same initial weights, each with its own optimizer
(``--optimizer``): torch.autocast, torch.autocast again (its distance from 1.000 is the noise
of the run) and O2.  One training step (forward in the region, float32 MSE loss, backward,
optimizer step) of every mode per round, in an order that rotates per round; the table gives
medians, the ratio against torch.autocast and the difference in ms per step.

At a small batch (``--batch 1``) compute is small and the difference is what O2 adds or
saves per step whatever the hardware: its Python policy kernels (ops whose O2 action torch's
kernels do not take), its master-weight update against torch's update of float32 weights,
and the weight casts torch.autocast makes every step and O2 does not.

    python benchmarks/bench_o2_small.py                   # batch 16, SGD
    python benchmarks/bench_o2_small.py --batch 1 --rounds 31 --optimizer adamw
    python benchmarks/bench_o2_small.py --models narrow-cnn --batch 1 --rounds 41   # overhead only
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any, Final

import torch
from torch import nn

import ampcore

BF16: Final = torch.bfloat16
Step = Callable[[], None]


def transformer() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """The small-op model of issue 3: 4 layers, d_model 256, 4 heads, feed-forward 1024."""
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), lambda b: torch.randn(b, 64, 256)


def cnn() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """A ResNet-like stem: three conv-BN-ReLU blocks, pooling, a linear head (32 x 32 images)."""
    blocks: list[nn.Module] = []
    for cin, cout in ((3, 32), (32, 64), (64, 64)):
        blocks += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    model = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return model, lambda b: torch.randn(b, 3, 32, 32)


def narrow_cnn() -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """The CNN's layers with 4 channels on 8 x 8 images: compute is negligible, so a step is
    what each mode costs per op and per parameter (a small model on a fast accelerator)."""
    blocks: list[nn.Module] = []
    for cin, cout in ((3, 4), (4, 4), (4, 4)):
        blocks += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    model = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
    return model, lambda b: torch.randn(b, 3, 8, 8)


MODELS: Final = {"transformer": transformer, "cnn": cnn, "narrow-cnn": narrow_cnn}
OPTIMIZERS: Final = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


def make_step(model: nn.Module, kind: str, mode: str, x: torch.Tensor) -> Step:
    """One training step of ``model`` (a private copy) in ``mode``: torch.autocast or O2."""
    model = copy.deepcopy(model)
    opt = OPTIMIZERS[kind](model.parameters(), lr=1e-4)
    region: Callable[[], Any] = lambda: torch.autocast("cpu", dtype=BF16)  # noqa: E731
    if mode in ("O2", "O2 weights, O1 region"):
        model, opt = ampcore.decorate(model, opt, level="O2", device="cpu")
        level = "O2" if mode == "O2" else "O1"
        region = lambda: ampcore.autocast(device="cpu", level=level)  # noqa: E731

    def step() -> None:
        with region():
            out = model(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(steps: dict[str, Step], rounds: int) -> dict[str, float]:
    """Median ms per step of each mode, interleaved in rotating order, after two warm-ups."""
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds + 2):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            steps[n]()
            if r >= 2:
                times[n].append((time.perf_counter() - start) * 1e3)
    return {n: statistics.median(v) for n, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=["transformer", "cnn"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="sgd")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    warnings.simplefilter("ignore")  # bf16 runs emulated on CPUs without bf16 instructions
    for name in args.models:
        torch.manual_seed(0)
        model, data = MODELS[name]()
        x = data(args.batch)
        steps = {
            "torch.autocast": make_step(model, args.optimizer, "torch", x),
            "torch.autocast (again)": make_step(model, args.optimizer, "torch", x),
            "ampcore O2 (decorate + O2 region)": make_step(model, args.optimizer, "O2", x),
            "ampcore decorate + O1 region": make_step(model, args.optimizer, "O2 weights, O1 region", x),
        }
        medians = measure(steps, args.rounds)
        base = medians["torch.autocast"]
        print(
            f"\n{name}, batch {args.batch}, {args.optimizer}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, median of {args.rounds} rounds, "
            f"load average {os.getloadavg()[0]:.2f}\n"
        )
        print("| mode | ms/step | / torch.autocast | ms vs torch.autocast |")
        print("|---|---:|---:|---:|")
        for mode, ms in medians.items():
            print(f"| {mode} | {ms:.2f} | {ms / base:.3f} | {ms - base:+.2f} |")


if __name__ == "__main__":
    main()
