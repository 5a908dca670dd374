"""Level O2 (``ampcore.decorate`` + O2 autocast) against fp32, O1 and hand-written bf16 loops.

Time: the seed network scaled down (9 x ``Linear(2048, 2048)``, batch 512, MSE, lr 1e-4 with
``--optimizer`` SGD (default), Adam or AdamW, the guide's uniform data, 10 batches cycled),
every mode with its own model from the same initial weights and its own optimizer of that
kind, all in one process, with ``torch.set_flush_denormal(True)``.  Each round runs one training step of every mode (the
order rotates per round); the table gives the median step time of the timed rounds and the
ratios against the baselines of the same run, plus the final loss after ``--steps`` steps.

Memory: one fresh process per (configuration, mode), run with
``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors leave the resident set.  The child
creates its data, enters the O1 and O2 regions once (one-time set-up), reads its resident
set (VmRSS), builds the model and optimizer (decorate included), reads it again, resets the
peak (VmHWM, through the CPU adapter's memory hooks), trains 3 steps and reads the peak:
"steps" is the peak growth over the built model (activations, gradients, optimizer state),
"total" the peak growth over the process before building (the weights added).

    python benchmarks/bench_o2.py                 # time table, then memory table
    python benchmarks/bench_o2.py --steps 20 --skip-memory
    python benchmarks/bench_o2.py --optimizer adamw     # Adam-family targets (issue 17)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch import nn

import ampcore
from ampcore._backends.memory import memory_in_use, peak_memory, reset_peak_memory
from ampcore._cli.experiment import SeedNet

BF16: Final = torch.bfloat16
TIME_MODES: Final = ("fp32", "O1", "torch.autocast", "bf16 loop", "bf16 loop + master", "O2", "O2 no master")
OPTIMIZERS: Final = ("sgd", "adam", "adamw")
MEMORY_MODES: Final = ("fp32", "O1", "bf16 loop + master", "O2")
CONFIGS: Final = {"activations": (1024, 8192), "parameters": (2048, 512)}
#: glibc serves every block above 64 KiB with its own mmap and unmaps it on free, so the
#: resident set follows the live tensors instead of the allocator's free lists (with the
#: default dynamic threshold, a freed 16 MiB tensor can stay resident, and the peak then
#: depends on allocation order: runs of one mode varied by up to 150 MiB)
MALLOC_ENV: Final = {"MALLOC_MMAP_THRESHOLD_": "65536"}


@dataclass
class Mode:
    """One way of training: ``step(x, y)`` runs forward, backward, update; returns the loss."""

    name: str
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def plain_step(
    model: nn.Module, opt: torch.optim.Optimizer, region: Callable[[], Any], cast: torch.dtype | None = None
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with region():  # (no name for the output: it would stay alive through backward)
            loss = nn.functional.mse_loss(model(x if cast is None else x.to(cast)).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def make_optimizer(kind: str, params: Any, lr: float) -> torch.optim.Optimizer:
    """The optimizer of ``--optimizer`` (torch's defaults otherwise: single-tensor on CPU)."""
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    return torch.optim.SGD(params, lr=lr)


def master_loop_step(model: nn.Module, lr: float, kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A hand-written bf16 loop with an fp32 master copy: the reference for O2's overhead
    (SGD reads the bf16 gradients directly; Adam/AdamW get fp32 copies, the textbook way)."""
    masters = [p.detach().float().requires_grad_() for p in model.parameters()]
    model.to(BF16)
    params = list(model.parameters())
    opt = None if kind == "sgd" else make_optimizer(kind, masters, lr)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.mse_loss(model(x.to(BF16)).float(), y)
        loss.backward()
        with torch.no_grad():
            grads = [p.grad for p in params]
            if opt is None:
                for master, grad in zip(masters, grads, strict=False):
                    master.add_(grad, alpha=-lr)  # reads bf16 grads directly: no fp32 copy
            else:
                for master, grad in zip(masters, grads, strict=False):
                    master.grad = grad.float()
                opt.step()
                for master in masters:
                    master.grad = None
            torch._foreach_copy_(params, masters)
        for p in params:
            p.grad = None
        return loss

    return step


def make_mode(name: str, size: int, lr: float, kind: str = "sgd") -> Mode:
    torch.manual_seed(0)
    model = SeedNet(size)
    opt = make_optimizer(kind, model.parameters(), lr)
    null: Callable[[], Any] = contextlib.nullcontext
    if name == "fp32":
        return Mode(name, plain_step(model, opt, null))
    if name == "O1":
        return Mode(name, plain_step(model, opt, lambda: ampcore.autocast(device="cpu", level="O1")))
    if name == "torch.autocast":
        return Mode(name, plain_step(model, opt, lambda: torch.autocast("cpu", dtype=BF16)))
    if name == "bf16 loop":  # bf16 parameters and optimizer states
        model.to(BF16)
        return Mode(name, plain_step(model, make_optimizer(kind, model.parameters(), lr), null, cast=BF16))
    if name == "bf16 loop + master":
        return Mode(name, master_loop_step(model, lr, kind))
    model, opt = ampcore.decorate(model, opt, level="O2", device="cpu", master_weight=name == "O2")
    return Mode(name, plain_step(model, opt, lambda: ampcore.autocast(device="cpu", level="O2")))


def guide_data(size: int, batch: int, batches: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.rand(batches, batch, size), torch.rand(batches, batch, size)


def run_time(steps: int, warmup: int, size: int, batch: int, lr: float, kind: str = "sgd") -> list[Mode]:
    data, label = guide_data(size, batch)
    modes = [make_mode(name, size, lr, kind) for name in TIME_MODES]
    for step in range(steps):
        x, y = data[step % len(data)], label[step % len(label)]
        shift = step % len(modes)
        for mode in modes[shift:] + modes[:shift]:  # rotate who goes first
            start = time.perf_counter()
            loss = mode.step(x, y)
            elapsed = time.perf_counter() - start
            mode.losses.append(float(loss.detach()))
            if step >= warmup:
                mode.times.append(elapsed * 1e3)
        print(
            f"round {step}: "
            + ", ".join(f"{m.name} {m.times[-1]:.0f} ms" for m in modes if m.times and step >= warmup),
            file=sys.stderr,
            flush=True,
        )  # partial results survive a killed run
    return modes


def print_time(modes: list[Mode], args: argparse.Namespace) -> None:
    by = {m.name: statistics.median(m.times) for m in modes}
    fp32_loss = modes[0].losses[-1]
    name = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}[args.optimizer]
    print(
        f"\n## Step time: 9 x Linear({args.size}), batch {args.batch}, {name} lr {args.lr}, bf16, "
        "O2: decorate + autocast level O2"
    )
    load = ", load average " + " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else ""
    print(
        f"medians of {len(modes[0].times)} interleaved rounds (after {args.warmup} warm-up), "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads{load}\n"
    )
    print(f"| mode | ms/step | / fp32 | / torch.autocast | / bf16 loop | loss after {args.steps} steps | vs fp32 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in modes:
        ms, loss = by[m.name], m.losses[-1]
        print(
            f"| {m.name} | {ms:.1f} | {ms / by['fp32']:.3f} | {ms / by['torch.autocast']:.3f} | "
            f"{ms / by['bf16 loop']:.3f} | {loss:.6f} | {100 * (loss - fp32_loss) / fp32_loss:+.3f}% |"
        )
    o1, bf16 = by["O2"] / by["torch.autocast"], by["O2"] / by["bf16 loop"]
    if args.optimizer == "sgd":
        print(
            f"\ntargets: O2 / torch.autocast <= 0.90: {o1:.3f}; O2 / bf16 loop <= 1.25: {bf16:.3f}; "
            f"O2 no master / bf16 loop <= 1.05: {by['O2 no master'] / by['bf16 loop']:.3f}"
        )
    else:
        print(f"\ntargets ({name}): O2 / torch.autocast <= 0.90: {o1:.3f}; O2 / bf16 loop <= 1.15: {bf16:.3f}")


def memory_child(mode: str, size: int, batch: int, lr: float, kind: str = "sgd") -> None:
    """Print the resident-set growth of building ``mode`` and the peak growth of 3 steps."""
    torch.set_num_threads(2)
    backend = ampcore.get_backend("cpu")
    data, label = guide_data(size, batch, batches=1)
    for level in ("O1", "O2"):  # one-time library set-up (op tables) is not training memory
        with ampcore.autocast(device="cpu", level=level):
            pass
    before = memory_in_use(backend)
    step = make_mode(mode, size, lr, kind).step
    built = memory_in_use(backend)
    reset_peak_memory(backend)
    for _ in range(3):
        step(data[0], label[0])
    peak = peak_memory(backend)
    if before is None or built is None or peak is None:
        raise SystemExit("this platform reports no resident-set sizes")
    print(json.dumps({"steps": peak - built, "total": peak - before}))


def run_memory(repeats: int, lr: float, kind: str = "sgd", configs: tuple[str, ...] = tuple(CONFIGS)) -> None:
    print(
        f"\n## Peak memory growth of training steps with {kind} (fresh process per run, "
        f"MALLOC_MMAP_THRESHOLD_=65536; median of {repeats})\n"
    )
    print(
        "steps: VmHWM during 3 steps - VmRSS after building model and optimizer (activations, "
        "gradients, optimizer state);\ntotal: the same peak - VmRSS before building (adds the "
        "weights: fp32, or fp32 masters + low-precision copies)\n"
    )
    print("| configuration | mode | steps MiB | steps / fp32 | total MiB | total / fp32 |")
    print("|---|---|---:|---:|---:|---:|")
    for config in configs:
        size, batch = CONFIGS[config]
        got: dict[str, tuple[float, float]] = {}
        for mode in MEMORY_MODES:
            runs = []
            for _ in range(repeats):
                out = subprocess.run(
                    [sys.executable, __file__, "--memory-child", mode, str(size), str(batch), "--optimizer", kind],
                    check=True,
                    capture_output=True,
                    text=True,
                    env={**os.environ, **MALLOC_ENV},
                )
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            got[mode] = (
                statistics.median(r["steps"] for r in runs) / 2**20,
                statistics.median(r["total"] for r in runs) / 2**20,
            )
            steps, total = got[mode]
            base_steps, base_total = got["fp32"]
            params = 9 * (size * size + size) / 1e6
            print(
                f"| {config}: 9 x Linear({size}), batch {batch}, {params:.1f}M params | {mode} | "
                f"{steps:.0f} | {steps / base_steps:.3f} | {total:.0f} | {total / base_total:.3f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="the optimizer of every mode")
    parser.add_argument("--repeats", type=int, default=3, help="memory runs per mode")
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--memory-configs", nargs="+", choices=tuple(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-child", nargs=3, metavar=("MODE", "SIZE", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_flush_denormal(True)  # deep fp32 chains must not fall into denormals
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        mode, size, batch = args.memory_child
        memory_child(mode, int(size), int(batch), args.lr, args.optimizer)
        return
    if not args.skip_time:
        print_time(run_time(args.steps, args.warmup, args.size, args.batch, args.lr, args.optimizer), args)
    if not args.skip_memory:
        run_memory(args.repeats, args.lr, args.optimizer, tuple(args.memory_configs))


if __name__ == "__main__":
    main()
