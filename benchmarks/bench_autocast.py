"""ampcore.autocast against torch.autocast: the op-policy engine's speed targets (issue 3).

Every case runs its variants interleaved in one process (the order rotates every round) and
reports medians and ratios against the baseline measured in the same run.  The first row of
each table runs the baseline against itself: its distance from 1.000 is the machine's noise.

1. Seed network (9 x ``Linear(2048, 2048)``, batch 512, MSE, SGD), bf16, one training step:
   ampcore O1 and ampcore O1 with ``custom_white_list={"add"}`` / torch.autocast.
2. Small-op model (4-layer ``nn.TransformerEncoder``, d_model 256), one training step:
   ampcore O1 / torch.autocast.
3. Added cost per call in a customised region: of the customised op (64x64 ``add``), of an
   op on no list, and of a white-listed op whose policy the region leaves as torch's.
4. Region entry + exit, and the one-time kernel registration of the first customised region.
5. What custom lists and levels OD/O2 cost on the small-op model (every op through Python).
6. Plain torch.autocast in a process that used customised, OD and O2 regions before, against
   torch.autocast in a fresh process (child processes, alternated; issue 10).

    python benchmarks/bench_autocast.py                  # all cases
    python benchmarks/bench_autocast.py --rounds 15 --cases seed transformer
    python benchmarks/bench_autocast.py --rounds 15 --cases after
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import torch
import torch.nn.functional as F
from torch import nn

import ampcore

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


def training_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, region: Region
) -> Callable[[], None]:
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


#: (width, batch) of the seed network; ``--seed-size`` shrinks it on a machine where bf16 is
#: emulated (a full-size step takes ~40 s there): per-op overheads weigh more, not less
SEED_SHAPE = [2048, 512]


def case_seed(rounds: int) -> None:
    size, batch = SEED_SHAPE
    x, y = torch.rand(batch, size), torch.rand(batch, size)
    make = lambda: nn.Sequential(*[nn.Linear(size, size) for _ in range(9)])  # noqa: E731
    regions = {
        "torch.autocast": torch_region,
        "torch.autocast (again)": torch_region,
        "ampcore O1": o1_region,
        'ampcore O1 custom_white_list={"add"}': custom_add_region,
    }
    variants = {}
    for (name, region), model in zip(regions.items(), _models(make, len(regions)), strict=False):
        variants[name] = training_step(model, torch.optim.SGD(model.parameters(), lr=1e-4), x, y, region)
    table(
        f"Seed network: 9 x Linear({size}) batch {batch}, bf16 training step ({rounds} rounds)",
        interleaved(variants, rounds),
        "torch.autocast",
    )


def case_transformer(rounds: int) -> None:
    layer = lambda: nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)  # noqa: E731
    make = lambda: nn.TransformerEncoder(layer(), 4, enable_nested_tensor=False)  # noqa: E731
    x, y = torch.randn(16, 64, 256), torch.randn(16, 64, 256)
    regions = {"torch.autocast": torch_region, "torch.autocast (again)": torch_region, "ampcore O1": o1_region}
    variants = {}
    for (name, region), model in zip(regions.items(), _models(make, len(regions)), strict=False):
        variants[name] = training_step(model, torch.optim.SGD(model.parameters(), lr=1e-4), x, y, region)
    table(
        "Small-op model: 4-layer TransformerEncoder d_model 256, batch 16 x 64 tokens, "
        f"training step ({rounds} rounds)",
        interleaved(variants, rounds),
        "torch.autocast",
    )


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
    for (name, region), model in zip(regions.items(), _models(make, len(regions)), strict=False):
        variants[name] = training_step(model, torch.optim.SGD(model.parameters(), lr=1e-4), x, y, region)
    table(
        f"Policy kernels on a small-op model: the TransformerEncoder step of case 2 ({rounds} rounds)",
        interleaved(variants, rounds),
        "torch.autocast",
    )


def _calls(region: Region, call: Callable[[], Any], n: int) -> Callable[[], None]:
    def run() -> None:
        with region():
            for _ in range(n):
                call()

    return run


def case_per_call(rounds: int) -> None:
    """Rows in pairs: a torch.autocast baseline, then the same op in an ampcore region."""
    # as in a training process: constructing a torch optimizer imports torch._dynamo (which
    # once made every policy region push torch.compile's guard mode, +3-4 us per call)
    torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    n = 2000
    add = lambda: x + y  # noqa: E731
    manual = lambda: x.to(BF16) + y.to(BF16)  # noqa: E731
    black = lambda: ampcore.autocast(device="cpu", custom_black_list={"add"})  # noqa: E731
    other = lambda: ampcore.autocast(device="cpu", custom_black_list={"mul"})  # noqa: E731
    sub = lambda: x - y  # noqa: E731
    small = torch.randn(8, 8)
    mm = lambda: torch.mm(small, small)  # noqa: E731
    variants = {
        "torch.autocast: add (follows its fp32 inputs)": _calls(torch_region, add, n),
        'ampcore custom_black_list={"add"}: add (no cast needed)': _calls(black, add, n),
        "torch.autocast: x.to(bf16) + y.to(bf16) (casts by hand)": _calls(torch_region, manual, n),
        'ampcore custom_white_list={"add"}: add (two casts)': _calls(custom_add_region, add, n),
        "torch.autocast: sub (on no list)": _calls(torch_region, sub, n),
        'ampcore custom_black_list={"mul"}: sub (on no list)': _calls(other, sub, n),
        "torch.autocast: 8x8 mm (white list)": _calls(torch_region, mm, n),
        'ampcore custom_black_list={"mul"}: 8x8 mm (torch\'s kernel)': _calls(other, mm, n),
    }
    medians = {name: value / n for name, value in interleaved(variants, rounds).items()}
    names = list(medians)
    print(f"\nAdded cost per call in a customised region (64x64 unless said, {n} calls per sample, {rounds} rounds)\n")
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
    variants = {
        "torch.autocast": entries(torch_region),
        "ampcore O1": entries(o1_region),
        'ampcore custom_white_list={"add"}': entries(custom_add_region),
        "ampcore OD": entries(od),
    }
    medians = {name: value / n for name, value in interleaved(variants, rounds).items()}
    table(
        f"Region entry + exit ({n} per sample, {rounds} rounds; kernels registered once per process)",
        medians,
        "torch.autocast",
        unit="us",
        scale=1e6,
    )
    first = [_child("first-region") for _ in range(3)]
    print(
        "\nOne-time registration: first customised region of a fresh process, entry + exit: "
        f"{statistics.median(first) * 1e3:.1f} ms (median of 3 processes)"
    )


def _child(kind: str, rounds: int = 0) -> float:
    """Run ``--child KIND`` in a fresh interpreter; the seconds it reports."""
    command = [sys.executable, __file__, "--child", kind, "--rounds", str(rounds)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["seconds"])


def _transformer_step(region: Region) -> Callable[[], None]:
    layer = lambda: nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)  # noqa: E731
    torch.manual_seed(0)
    model = nn.TransformerEncoder(layer(), 4, enable_nested_tensor=False)
    x, y = torch.randn(16, 64, 256), torch.randn(16, 64, 256)
    return training_step(model, torch.optim.SGD(model.parameters(), lr=1e-4), x, y, region)


def child(kind: str, rounds: int) -> None:
    """One measurement in a fresh process (printed as JSON on the last line)."""
    torch.set_flush_denormal(True)
    if kind == "first-region":
        ampcore.get_backend("cpu")
        start = time.perf_counter()
        with custom_add_region():
            pass
        seconds = time.perf_counter() - start
    else:
        if kind == "plain-after":  # every kind of ampcore region first, in this thread
            x = torch.randn(8, 8)
            for level, white in (("O1", {"add"}), ("OD", None), ("O2", None)):
                with ampcore.autocast(device="cpu", level=level, custom_white_list=white):
                    (x + x).sum()
        step = _transformer_step(torch_region)
        seconds = interleaved({"step": step}, rounds)["step"]
    print(json.dumps({"kind": kind, "seconds": seconds}))


def case_after(rounds: int, repeats: int = 5) -> None:
    samples: dict[str, list[float]] = {"plain-fresh": [], "plain-after": []}
    for i in range(repeats):  # alternate which goes first
        for kind in ("plain-fresh", "plain-after") if i % 2 == 0 else ("plain-after", "plain-fresh"):
            samples[kind].append(_child(kind, rounds))
    medians = {
        "torch.autocast, fresh process": statistics.median(samples["plain-fresh"]),
        "torch.autocast after O1-custom, OD and O2 regions": statistics.median(samples["plain-after"]),
    }
    table(
        "Plain torch.autocast after ampcore's regions: TransformerEncoder step of case 2 "
        f"({repeats} process pairs x {rounds} rounds)",
        medians,
        "torch.autocast, fresh process",
    )


CASES: Final = {
    "seed": case_seed,
    "transformer": case_transformer,
    "per-call": case_per_call,
    "regions": case_regions,
    "levels": case_levels,
    "after": case_after,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per case (default 9)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument(
        "--seed-size",
        nargs=2,
        type=int,
        metavar=("WIDTH", "BATCH"),
        default=SEED_SHAPE,
        help="seed network shape (default 2048 512)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    SEED_SHAPE[:] = args.seed_size
    if args.child:
        child(args.child, args.rounds)
        return
    torch.set_flush_denormal(True)
    print(f"torch {torch.__version__}, ampcore {ampcore.__version__}, {torch.get_num_threads()} threads")
    for name in args.cases:
        CASES[name](args.rounds)


if __name__ == "__main__":
    main()
