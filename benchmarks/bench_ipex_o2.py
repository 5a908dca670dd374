"""ampcore's O2 training step against ``ipex.optimize``'s (issue 31's IPEX row).

Needs Intel Extension for PyTorch, which pins its torch release (IPEX 2.8 needs torch 2.8):
run it in a separate environment, not ampcore's test venv::

    python3 -m venv /tmp/venv28
    /tmp/venv28/bin/pip install torch==2.8.0 intel-extension-for-pytorch==2.8.0 pluggy psutil
    /tmp/venv28/bin/pip install --no-deps -e .
    /tmp/venv28/bin/python benchmarks/bench_ipex_o2.py --optimizers adamw sgd

Every row is a ratio of medians measured in one process, interleaved (one training step of
every mode per round, in an order that rotates per round): forward, MSE loss in float32,
backward, ``optimizer.step()``, ``zero_grad``.  Modes, each with its own model from the same
initial weights and its own optimizer (bfloat16 on the CPU):

* ``ampcore O2``: ``ampcore.decorate`` + ``ampcore.autocast(level="O2")``;
* ``ipex``: ``ipex.optimize(model, optimizer=opt, dtype=torch.bfloat16)`` + ``torch.autocast``
  (IPEX's defaults: prepacked oneDNN weights, split bf16 master weights, fused update);
* ``ipex -prepack`` / ``ipex -split`` / ``ipex -fused``: the same with one of those turned off
  (``weights_prepack=False``, ``split_master_weight_for_bf16=False``,
  ``fuse_update_step=False``), which says what each contributes;
* ``O1``: float32 parameters + ``ampcore.autocast(level="O1")``; ``pure``: the model in bf16.

``--flavour fused`` gives the non-IPEX modes torch's fused optimizer (``fused=True``): IPEX
replaces every optimizer's step with its own kernel whatever was asked, while ampcore runs
the flavour the user chose (bit-identical to it), so ``fused`` compares kernel with kernel.

Each step is also split into its parts (the CPU runs synchronously, so a clock read between
them times each): forward (with the loss), backward, ``optimizer.step()`` and ``zero_grad``, so
the table shows where a difference comes from, with the minor page faults of a step (memory
the allocator gave back to the system and takes again: a backward that faults runs slower).
``--clock cpu`` times them in the thread's CPU time (``time.thread_time``; with ``--threads 1``
all of torch's work runs on this thread), which a busy machine disturbs less than the wall clock.
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, Final

import torch
from torch import nn

import ampcore

OPTIMIZERS: Final[dict[str, Callable[..., torch.optim.Optimizer]]] = {
    "adamw": lambda p, **kw: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.01, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, lr=1e-4, **kw),
    "sgd": lambda p, **kw: torch.optim.SGD(p, lr=1e-4, **kw),
    "sgd-momentum": lambda p, **kw: torch.optim.SGD(p, lr=1e-4, momentum=0.9, **kw),
}
#: ``ipex.optimize`` keyword arguments per IPEX mode
IPEX_MODES: Final[dict[str, dict[str, bool]]] = {
    "ipex": {},
    "ipex -prepack": {"weights_prepack": False},
    "ipex -split": {"split_master_weight_for_bf16": False},
    "ipex -fused": {"fuse_update_step": False},
}
#: ``--modes`` names of the modes compared with ``ampcore O2`` (always run: the ratios' numerator)
OTHER_MODES: Final[dict[str, str]] = {
    "ipex": "ipex",
    "ipex-prepack": "ipex -prepack",
    "ipex-split": "ipex -split",
    "ipex-fused": "ipex -fused",
    "o1": "O1",
    "pure": "pure",
}
LOW: Final = torch.bfloat16


PARTS: Final = ("forward", "backward", "step", "zero_grad")


class Mode:
    """One mode's model, optimizer and region; ``step()`` returns the seconds of each of
    :data:`PARTS`."""

    def __init__(
        self,
        base: nn.Module,
        kind: str,
        mode: str,
        data: tuple[torch.Tensor, torch.Tensor],
        flavour: str,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``flavour``: the optimizer flavour of the non-IPEX modes (IPEX replaces the step)."""
        x, y = data
        self.clock = clock
        self.model = copy.deepcopy(base)
        self.inputs, self.y = x, y
        self.region: Callable[[], Any] = lambda: ampcore.autocast(device="cpu", level="O1", dtype=LOW)
        if mode == "pure":
            self.model.to(LOW)
            self.inputs = x.to(LOW)
            self.region = lambda: torch.autocast("cpu", enabled=False)
        options = {} if mode in IPEX_MODES or flavour == "default" else {flavour: True}
        self.opt = OPTIMIZERS[kind](self.model.parameters(), **options)
        if mode == "ampcore O2":
            self.model, self.opt = ampcore.decorate(self.model, self.opt, level="O2", device="cpu", dtype=LOW)
            self.region = lambda: ampcore.autocast(device="cpu", level="O2", dtype=LOW)
        elif mode in IPEX_MODES:
            import intel_extension_for_pytorch as ipex

            self.model.train()
            self.model, self.opt = ipex.optimize(self.model, optimizer=self.opt, dtype=LOW, **IPEX_MODES[mode])
            self.region = lambda: torch.autocast("cpu", dtype=LOW)

    def step(self) -> tuple[float, ...]:
        marks = [self.clock()]
        with self.region():
            out = self.model(self.inputs)
        loss = nn.functional.mse_loss(out.float(), self.y)
        marks.append(self.clock())
        loss.backward()
        marks.append(self.clock())
        self.opt.step()
        marks.append(self.clock())
        self.opt.zero_grad(set_to_none=True)
        marks.append(self.clock())
        return tuple(after - before for before, after in zip(marks, marks[1:], strict=False))


def minor_faults() -> int:
    """This process's minor page faults so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run(kind: str, modes: list[str], args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    base = nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(args.layers)))
    x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    steps = {name: Mode(base, kind, name, (x, y), args.flavour, clock) for name in modes}
    times: dict[str, list[tuple[float, ...]]] = {name: [] for name in modes}
    faults: dict[str, list[int]] = {name: [] for name in modes}
    for round_ in range(args.warmup + args.rounds):
        order = modes[round_ % len(modes) :] + modes[: round_ % len(modes)]
        for name in order:
            before = minor_faults()
            took = steps[name].step()
            if round_ >= args.warmup:
                times[name].append(took)
                faults[name].append(minor_faults() - before)
    median = {name: statistics.median(sum(parts) for parts in got) for name, got in times.items()}
    phase = {name: [statistics.median(parts) for parts in zip(*got, strict=True)] for name, got in times.items()}
    ours = median["ampcore O2"]
    print(
        f"\n{kind} ({args.flavour} flavour outside IPEX): {args.layers} x Linear({args.width}), "
        f"batch {args.batch}, bf16, {args.rounds} rounds, {args.clock} clock"
    )
    print(f"| mode | ms / step | fwd+bwd ms | step ms | {' ms | '.join(PARTS)} ms | page faults | ampcore O2 / mode |")
    print(f"|---|---:|---:|---:|{'---:|' * len(PARTS)}---:|---:|")
    for name in modes:
        fwd, bwd, upd, zero = phase[name]
        cells = " | ".join(f"{1e3 * part:.2f}" for part in phase[name])
        print(
            f"| {name} | {1e3 * median[name]:.1f} | {1e3 * (fwd + bwd):.1f} | {1e3 * (upd + zero):.1f} | {cells} "
            f"| {statistics.median(faults[name]):.0f} | {ours / median[name]:.3f} |"
        )
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizers", nargs="+", choices=tuple(OPTIMIZERS), default=["adamw", "sgd"])
    parser.add_argument(
        "--flavour",
        choices=("default", "foreach", "fused"),
        default="default",
        help="torch optimizer flavour of the ampcore, O1 and pure modes (IPEX always runs its own step)",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=tuple(OTHER_MODES),
        default=list(OTHER_MODES),
        help="the modes run besides ampcore O2 (default: all)",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--width", type=int, default=1664)
    parser.add_argument("--batch", type=int, default=416)
    parser.add_argument("--layers", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter; cpu: this thread's CPU time (with --threads 1: a loaded machine)",
    )
    args = parser.parse_args()
    try:
        import intel_extension_for_pytorch as ipex
    except ImportError as error:
        sys.exit(f"bench_ipex_o2: Intel Extension for PyTorch is not installed ({error}); see this file's docstring")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    print(
        f"torch {torch.__version__}, IPEX {ipex.__version__}, ampcore {ampcore.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    modes = ["ampcore O2", *(OTHER_MODES[key] for key in args.modes)]
    for kind in args.optimizers:
        run(kind, modes, args)


if __name__ == "__main__":
    main()
