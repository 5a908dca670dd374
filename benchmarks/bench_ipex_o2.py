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

Each step is also split into its forward + backward and its ``optimizer.step()`` (host clock;
the CPU runs synchronously), so the table shows where a difference comes from.
"""

from __future__ import annotations

import argparse
import copy
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
LOW: Final = torch.bfloat16


class Mode:
    """One mode's model, optimizer and region; ``step()`` returns (fwd+bwd s, step s)."""

    def __init__(
        self, base: nn.Module, kind: str, mode: str, data: tuple[torch.Tensor, torch.Tensor], flavour: str
    ) -> None:
        """``flavour``: the optimizer flavour of the non-IPEX modes (IPEX replaces the step)."""
        x, y = data
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

    def step(self) -> tuple[float, float]:
        start = time.perf_counter()
        with self.region():
            out = self.model(self.inputs)
        nn.functional.mse_loss(out.float(), self.y).backward()
        middle = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return middle - start, time.perf_counter() - middle


def run(kind: str, modes: list[str], args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    base = nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(args.layers)))
    x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)
    steps = {name: Mode(base, kind, name, (x, y), args.flavour) for name in modes}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    for round_ in range(args.warmup + args.rounds):
        order = modes[round_ % len(modes) :] + modes[: round_ % len(modes)]
        for name in order:
            took = steps[name].step()
            if round_ >= args.warmup:
                times[name].append(took)
    median = {name: statistics.median(a + b for a, b in got) for name, got in times.items()}
    phase = {
        name: (statistics.median(a for a, _ in got), statistics.median(b for _, b in got))
        for name, got in times.items()
    }
    ours = median["ampcore O2"]
    print(
        f"\n{kind} ({args.flavour} flavour outside IPEX): {args.layers} x Linear({args.width}), "
        f"batch {args.batch}, bf16, {args.rounds} rounds"
    )
    print("| mode | ms / step | fwd+bwd ms | step ms | ampcore O2 / mode |")
    print("|---|---:|---:|---:|---:|")
    for name in modes:
        fwd, upd = phase[name]
        print(f"| {name} | {1e3 * median[name]:.1f} | {1e3 * fwd:.1f} | {1e3 * upd:.1f} | {ours / median[name]:.3f} |")
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
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--width", type=int, default=1664)
    parser.add_argument("--batch", type=int, default=416)
    parser.add_argument("--layers", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
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
    modes = ["ampcore O2", *IPEX_MODES, "O1", "pure"]
    for kind in args.optimizers:
        run(kind, modes, args)


if __name__ == "__main__":
    main()
