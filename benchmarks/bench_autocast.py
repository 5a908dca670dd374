"""ampcore.autocast against torch.autocast: the op-policy engine's speed targets (issue 3).

Every case runs its variants interleaved in one process (the order rotates every round) and
reports medians and ratios against the baseline measured in the same run.  The first row of
each table runs the baseline against itself: its distance from 1.000 is the machine's noise.

1. Seed network (9 x ``Linear(2048, 2048)``, batch 512, MSE, SGD), bf16, one training step:
   ampcore O1 and ampcore O1 with ``custom_white_list={"add"}`` / torch.autocast.
2. Small-op model (4-layer ``nn.TransformerEncoder``, d_model 256), one training step:
   ampcore O1 / torch.autocast.
3. Added cost per call of an op whose policy was customised (64x64 ``add``).
4. Region entry + exit, and the kernel registration it may cost (linger vs immediate).
5. What custom lists and levels OD/O2 cost on the small-op model (every op through Python).

    python benchmarks/bench_autocast.py                  # all cases
    python benchmarks/bench_autocast.py --rounds 15 --cases seed transformer
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch
import torch.nn.functional as F
from torch import nn

import ampcore
from ampcore._dispatch import _installer, sweep

BF16: Final = torch.bfloat16
Region = Callable[[], contextlib.AbstractContextManager[Any]]


def torch_region() -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cpu", dtype=BF16)


def o1_region() -> contextlib.AbstractContextManager[Any]:
    return ampcore.autocast(device="cpu", dtype=BF16)


def custom_add_region() -> contextlib.AbstractContextManager[Any]:
    return ampcore.autocast(device="cpu", dtype=BF16, custom_white_list={"add"})


def interleaved(variants: dict[str, Callable[[], None]], rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each variant, run in rotating order every round."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def table(title: str, medians: dict[str, float], baseline: str, unit: str = "ms", scale: float = 1e3) -> None:
    print(f"\n{title}\n")
    print(f"| variant | median {unit} | ratio vs {baseline} |")
    print("|---|---:|---:|")
    base = medians[baseline]
    for name, value in medians.items():
        print(f"| {name} | {value * scale:.3f} | {value / base:.3f} |")


def training_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, region: Region) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with region():
            loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()

    return step


def _models(make: Callable[[], nn.Module], n: int) -> Iterator[nn.Module]:
    torch.manual_seed(0)
    first = make()
    for _ in range(n):
        model = make()
        model.load_state_dict(first.state_dict())
        yield model


def case_seed(rounds: int) -> None:
    size, batch = 2048, 512
    x, y = torch.rand(batch, size), torch.rand(batch, size)
    make = lambda: nn.Sequential(*[nn.Linear(size, size) for _ in range(9)])  # noqa: E731
    regions = {"torch.autocast": torch_region, "torch.autocast (again)": torch_region, "ampcore O1": o1_region, 'ampcore O1 custom_white_list={"add"}': custom_add_region}
    variants = {}
    for (name, region), model in zip(regions.items(), _models(make, len(regions))):
        variants[name] = training_step(model, torch.optim.SGD(model.parameters(), lr=1e-4), x, y, region)
    table(f"Seed network: 9 x Linear({size}) batch {batch}, bf16 training step ({rounds} rounds)", interleaved(variants, rounds), "torch.autocast")


def case_transformer(rounds: int) -> None:
    layer = lambda: nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)  # noqa: E731
    make = lambda: nn.TransformerEncoder(layer(), 4, enable_nested_tensor=False)  # noqa: E731
    x, y = torch.randn(16, 64, 256), torch.randn(16, 64, 256)
    regions = {"torch.autocast": torch_region, "torch.autocast (again)": torch_region, "ampcore O1": o1_region}
    variants = {}
    for (name, region), model in zip(regions.items(), _models(make, len(regions))):
        variants[name] = training_step(model, torch.optim.SGD(model.parameters(), lr=1e-4), x, y, region)
    table(f"Small-op model: 4-layer TransformerEncoder d_model 256, batch 16 x 64 tokens, training step ({rounds} rounds)", interleaved(variants, rounds), "torch.autocast")


def case_levels(rounds: int) -> None:
    layer = lambda: nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)  # noqa: E731
    make = lambda: nn.TransformerEncoder(layer(), 4, enable_nested_tensor=False)  # noqa: E731
    x, y = torch.randn(16, 64, 256), torch.randn(16, 64, 256)
    regions: dict[str, Region] = {
        "torch.autocast": torch_region,
        'ampcore O1 custom_white_list={"add"}': custom_add_region,
        'ampcore O1 custom_black_list={"linear"}': lambda: ampcore.autocast(device="cpu", custom_black_list={"linear"}),
        "ampcore OD": lambda: ampcore.autocast(device="cpu", level="OD"),
        "ampcore O2 (op side; float32 parameters)": lambda: ampcore.autocast(device="cpu", level="O2"),
    }
    variants = {}
    for (name, region), model in zip(regions.items(), _models(make, len(regions))):
        variants[name] = training_step(model, torch.optim.SGD(model.parameters(), lr=1e-4), x, y, region)
    table(f"Policy kernels on a small-op model: the TransformerEncoder step of case 2 ({rounds} rounds)", interleaved(variants, rounds), "torch.autocast")


def _calls(region: Region, call: Callable[[], Any], n: int) -> Callable[[], None]:
    def run() -> None:
        with region():
            for _ in range(n):
                call()

    return run


def case_per_call(rounds: int) -> None:
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    n = 2000
    add = lambda: x + y  # noqa: E731
    manual = lambda: x.to(BF16) + y.to(BF16)  # noqa: E731
    black = lambda: ampcore.autocast(device="cpu", custom_black_list={"add"})  # noqa: E731
    variants = {
        "torch.autocast: add (follows its fp32 inputs)": _calls(torch_region, add, n),
        'ampcore custom_black_list={"add"}: add (no cast needed)': _calls(black, add, n),
        "torch.autocast: x.to(bf16) + y.to(bf16) (casts by hand)": _calls(torch_region, manual, n),
        'ampcore custom_white_list={"add"}: add (two casts)': _calls(custom_add_region, add, n),
    }
    medians = {name: value / n for name, value in interleaved(variants, rounds).items()}
    names = list(medians)
    print(f"\nAdded cost per call of a customised op (64x64 add, {n} calls per sample, {rounds} rounds)\n")
    print("| variant | median us per call | added us |")
    print("|---|---:|---:|")
    for i, name in enumerate(names):
        base = medians[names[i - i % 2]]
        print(f"| {name} | {medians[name] * 1e6:.2f} | {(medians[name] - base) * 1e6:+.2f} |")


def case_regions(rounds: int) -> None:
    n = 50

    def entries(make: Region) -> Callable[[], None]:
        def run() -> None:
            for _ in range(n):
                with make():
                    pass

        return run

    od = lambda: ampcore.autocast(device="cpu", level="OD")  # noqa: E731
    warm = {
        "torch.autocast": entries(torch_region),
        "ampcore O1": entries(o1_region),
        'ampcore custom_white_list={"add"}, kernels lingering': entries(custom_add_region),
        "ampcore OD, kernels lingering": entries(od),
    }
    medians = {name: value / n for name, value in interleaved(warm, rounds).items()}
    table(f"Region entry + exit, default: unused kernels linger {_installer.linger} s ({n} per sample, {rounds} rounds)", medians, "torch.autocast", unit="us", scale=1e6)
    _installer.linger = 0.0  # every exit unregisters, every entry registers again
    cold = {
        "torch.autocast": entries(torch_region),
        'ampcore custom_white_list={"add"}, released at exit': entries(custom_add_region),
        "ampcore OD, released at exit": entries(od),
    }
    try:
        medians = {name: value / n for name, value in interleaved(cold, rounds).items()}
    finally:
        _installer.linger = 2.0
    table(f"Region entry + exit with linger = 0 ({n} per sample, {rounds} rounds)", medians, "torch.autocast", unit="us", scale=1e6)
    sweep()


CASES: Final = {
    "seed": case_seed,
    "transformer": case_transformer,
    "per-call": case_per_call,
    "regions": case_regions,
    "levels": case_levels,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per case (default 9)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, ampcore {ampcore.__version__}, {torch.get_num_threads()} threads")
    for name in args.cases:
        sweep()
        CASES[name](args.rounds)


if __name__ == "__main__":
    main()
