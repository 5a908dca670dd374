"""What custom lists, OD and O2 cost over torch.autocast, per policy-kernel executor (issue 26).

Each executor (``AMPCORE_POLICY_KERNEL=compiled`` / ``python``) runs in a process of its own
(the kernels a process registers stay for the process); inside it every case runs its
variants interleaved (the order rotates every round) and reports medians and ratios against
torch.autocast measured in the same process.  ``torch.autocast (again)`` is the noise.

1. ``per-call``: added microseconds per op call in a region against the same op under
   torch.autocast: an op on no list (no cast), a white-listed op (two casts, against casts by
   hand), an op whose policy is torch's (PASS), and at O2 an op on low-precision inputs.
2. ``regions``: region entry + exit.
3. ``steps``: training steps of a tiny TransformerEncoder (d_model 32, 2 layers, batch 1,
   8 tokens, AdamW: nearly all per-op cost), custom lists / OD / O2 + decorate against
   torch.autocast; ``steps-gpu-row``: the same with issue 26's GPU model (d_model 256, 4
   layers, batch 8, 64 tokens), run by default off the CPU.

    python benchmarks/bench_policy_kernel.py --threads 1              # both executors, CPU
    python benchmarks/bench_policy_kernel.py --threads 1 --clock cpu  # a loaded CPU host
    python benchmarks/bench_policy_kernel.py --device cuda --dtype float16 --rounds 15
    python benchmarks/bench_policy_kernel.py --executors compiled --cases steps
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, Final

import torch
from torch import nn

import ampcore

Region = Callable[[], Any]
CASES: Final = ("per-call", "regions", "steps", "steps-gpu-row")


class Bench:
    """The device, dtype and round count of one run."""

    def __init__(self, device: str, dtype: torch.dtype, rounds: int, clock: str = "wall") -> None:
        self.device, self.dtype, self.rounds = device, dtype, rounds
        self.device_type = torch.device(device).type
        #: ``cpu``: the thread's CPU time (blind to preemption on a loaded host; CPU only)
        self.clock: Callable[[], float] = time.thread_time if clock == "cpu" else time.perf_counter
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
        self.best: dict[str, float] = {}

    def torch_region(self) -> Any:
        # the device type as a user writes it (a torch.device parsed here would cost the
        # baseline 0.7 us per region: before issue 26 item 3 the region rows included it)
        return torch.autocast(self.device_type, dtype=self.dtype)

    def region(self, **kwargs: Any) -> Region:
        return lambda: ampcore.autocast(device=self.device, dtype=self.dtype, **kwargs)

    def interleaved(self, variants: dict[str, Callable[[], None]], warmup: int = 2) -> dict[str, float]:
        """Median seconds per sample of each variant, in rotating order every round."""
        names = list(variants)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(self.rounds + warmup):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                self.sync()
                start = self.clock()
                variants[name]()
                self.sync()
                if r >= warmup:
                    times[name].append(self.clock() - start)
        self.best = {name: min(values) for name, values in times.items()}  # the fastest round
        return {name: statistics.median(values) for name, values in times.items()}


def _calls(region: Region, call: Callable[[], Any], n: int) -> Callable[[], None]:
    def run() -> None:
        with region():
            for _ in range(n):
                call()

    return run


def case_per_call(b: Bench) -> None:
    """Rows in pairs: torch.autocast, then the same op in an ampcore region.  The first group
    runs before any region of this process changed ``add`` or ``mm`` (issue 26: an op no policy
    changes has no kernel of ampcore's, so the dispatcher passes it by); the second group's
    regions register kernels for ``add``."""
    torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)  # imports torch._dynamo, as training does
    x, y = torch.randn(64, 64, device=b.device), torch.randn(64, 64, device=b.device)
    low_x, low_y = x.to(b.dtype), y.to(b.dtype)
    small = torch.randn(8, 8, device=b.device)
    n, low = 1000, b.dtype
    other = b.region(custom_black_list={"mul"})
    untouched = {
        "torch.autocast: add (on no list)": _calls(b.torch_region, lambda: x + y, n),
        'custom_black_list={"mul"}: add (on no list, no cast)': _calls(other, lambda: x + y, n),
        "torch.autocast: 8x8 mm (white list)": _calls(b.torch_region, lambda: torch.mm(small, small), n),
        'custom_black_list={"mul"}: 8x8 mm (torch\'s action)': _calls(other, lambda: torch.mm(small, small), n),
    }
    with other():
        pass  # its kernels registered before the rows say which ops have one
    has = {op: _has_kernel(op, b.device) for op in ("add.Tensor", "mm")}
    _per_call_rows(b, untouched, f"ops no region of the process changed so far; a kernel of ampcore's: {has}")
    changing = {
        "torch.autocast: x.to(low) + y.to(low) (casts by hand)": _calls(
            b.torch_region, lambda: x.to(low) + y.to(low), n
        ),
        'custom_white_list={"add"}: add (two casts)': _calls(b.region(custom_white_list={"add"}), lambda: x + y, n),
        "torch.autocast: add of low-precision inputs": _calls(b.torch_region, lambda: low_x + low_y, n),
        "O2: add of low-precision inputs (no cast)": _calls(b.region(level="O2"), lambda: low_x + low_y, n),
    }
    _per_call_rows(b, changing, "ops a region changes")


def _has_kernel(overload: str, device: str) -> bool:
    """Whether ``overload`` has a kernel of ampcore's on its shadow key for ``device``."""
    route = ampcore._policy.registration.routes().get(torch.device(device).type)
    return route is not None and overload in ampcore._policy.registration.registered_overloads(route.key)


def _per_call_rows(b: Bench, variants: dict[str, Callable[[], None]], what: str, n: int = 1000) -> None:
    medians = {name: value / n for name, value in b.interleaved(variants).items()}
    best = {name: value / n for name, value in b.best.items()}
    names = list(medians)
    print(f"\nAdded cost per op call, {what} (64x64 unless said, {n} calls per sample, {b.rounds} rounds)\n")
    print("| variant | us per call, median | added us, median | added us, fastest rounds |")
    print("|---|---:|---:|---:|")
    for i, name in enumerate(names):
        base = names[i - i % 2]
        added, added_best = (medians[name] - medians[base]) * 1e6, (best[name] - best[base]) * 1e6
        print(f"| {name} | {medians[name] * 1e6:.2f} | {added:+.2f} | {added_best:+.2f} |")


def case_regions(b: Bench) -> None:
    """Entry + exit of a region made in the loop (``with ampcore.autocast(...):``, as a
    training step writes it), alone and nested in a region of the same kind (issue 26 item 3)."""
    n = 100

    def entries(make: Region, outer: Region | None = None) -> Callable[[], None]:
        def run() -> None:
            for _ in range(n):
                with make():
                    pass

        if outer is None:
            return run

        def nested() -> None:
            with outer():
                run()

        return nested

    custom = b.region(custom_white_list={"add"})
    variants = {
        "torch.autocast": entries(b.torch_region),
        "ampcore O1": entries(b.region()),
        'ampcore custom_white_list={"add"}': entries(custom),
        "ampcore OD": entries(b.region(level="OD")),
        "ampcore O2": entries(b.region(level="O2")),
        "torch.autocast inside torch.autocast": entries(b.torch_region, b.torch_region),
        "ampcore O1 inside O1": entries(b.region(), b.region()),
        'custom_white_list={"add"} inside custom_black_list={"softmax"}': entries(
            custom, b.region(custom_black_list={"softmax"})
        ),
    }
    medians = {name: value / n for name, value in b.interleaved(variants).items()}
    _table(f"Region entry + exit ({n} per sample, {b.rounds} rounds)", medians, "us", 1e6)


def _step(b: Bench, model: nn.Module, region: Region, o2: bool, shape: tuple[int, int, int]) -> Callable[[], None]:
    model = copy.deepcopy(model)
    opt: Any = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if o2:
        model, opt = ampcore.decorate(model, opt, level="O2", dtype=b.dtype, device=b.device)
    x = torch.randn(*shape, device=b.device)

    def step() -> None:
        with region():
            out = model(x)
        out.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


#: case -> (d_model, layers, batch, tokens): the tiny CPU model (nearly all per-op cost) and
#: issue 26's GPU row (launch-bound on a GPU)
STEP_MODELS: Final = {"steps": (32, 2, 1, 8), "steps-gpu-row": (256, 4, 8, 64)}


def case_steps(b: Bench, case: str = "steps") -> None:
    torch.manual_seed(0)
    d_model, layers, batch, tokens = STEP_MODELS[case]
    layer = nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(b.device)
    regions: dict[str, tuple[Region, bool]] = {
        "torch.autocast": (b.torch_region, False),
        "torch.autocast (again)": (b.torch_region, False),
        'custom list changing no op (white {"mm"}): kernel cost only': (b.region(custom_white_list={"mm"}), False),
        'custom lists (white {"add"}, black {"softmax"})': (
            b.region(custom_white_list={"add"}, custom_black_list={"softmax"}),
            False,
        ),
        "OD": (b.region(level="OD"), False),
        "O2 region, float32 parameters (no decorate)": (b.region(level="O2"), False),
        "O2 + decorate": (b.region(level="O2"), True),
    }
    shape = (batch, tokens, d_model)
    variants = {name: _step(b, model, region, o2, shape) for name, (region, o2) in regions.items()}
    medians = b.interleaved(variants, warmup=3)
    _table(
        f"Training step: TransformerEncoder d_model {d_model}, {layers} layers, batch {batch} x {tokens} tokens, "
        f"AdamW ({b.rounds} rounds)",
        medians,
        "ms",
        1e3,
    )


def _table(title: str, medians: dict[str, float], unit: str, scale: float) -> None:
    base = medians["torch.autocast"]
    print(f"\n{title}\n")
    print(f"| variant | median {unit} | / torch.autocast |")
    print("|---|---:|---:|")
    for name, value in medians.items():
        print(f"| {name} | {value * scale:.3f} | {value / base:.3f} |")


RUN: Final = {
    "per-call": case_per_call,
    "regions": case_regions,
    "steps": case_steps,
    "steps-gpu-row": lambda b: case_steps(b, "steps-gpu-row"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="device of the run (default cpu)")
    parser.add_argument("--dtype", default="bfloat16", help="low-precision dtype (default bfloat16)")
    parser.add_argument("--rounds", type=int, default=21, help="timed rounds per case (default 21)")
    parser.add_argument(
        "--cases", nargs="+", choices=CASES, help="default: all; steps-gpu-row only off the CPU (d_model 256)"
    )
    parser.add_argument("--executors", nargs="+", choices=("compiled", "python"), default=["compiled", "python"])
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: thread CPU time (a loaded CPU host; not for GPUs)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child:
        print(
            f"torch {torch.__version__}, ampcore {ampcore.__version__}, {torch.get_num_threads()} threads, "
            f"device {args.device}, load {os.getloadavg()[0]:.2f}"
        )
        for name in args.executors:
            print(f"\n### executor: {name}")
            sys.stdout.flush()
            command = [sys.executable, __file__, "--child", *sys.argv[1:]]
            subprocess.run(command, env={**os.environ, "AMPCORE_POLICY_KERNEL": name}, check=True)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    warnings.simplefilter("ignore")  # bf16 runs emulated on CPUs without bf16 instructions
    bench = Bench(args.device, getattr(torch, args.dtype), args.rounds, args.clock)
    with ampcore.autocast(device=args.device, dtype=bench.dtype, custom_black_list={"mul"}):
        pass  # builds the compiled kernels at their first use; registers those this policy needs
    print(f"executor: {ampcore._policy.executor.describe()}")
    cases = args.cases or [c for c in CASES if c != "steps-gpu-row" or not args.device.startswith("cpu")]
    for name in cases:
        RUN[name](bench)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
