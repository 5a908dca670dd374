"""level="auto" on a model called with numbers that change every step (issue 27).

A model of small residual ``Linear(64)`` layers on a batch of 16 is called as
``model(x, step, temperature)`` with a new step counter and temperature every call.  The
guard of a root's program held such numbers by value, so every call was a new signature:
recorded (the global module hooks and a dispatch mode on every module call, the program
store cleared every 64 signatures).  Now a number whose recordings give the same program is
held by type after two of them (``ampcore._auto._loose.loosen``).

One process, three modes in turn per round (training steps: forward, MSE, backward, SGD;
each mode its own copy of the model from the same weights): ``fp32``; ``auto`` (numbers
held by type); ``auto-by-value`` (the same with :func:`loosen` switched off for its copy:
the behaviour before); ``auto-same`` (the same numbers every call: one signature, what a
settled program costs on this model).  Each round's order rotates; the ratios are medians of the per-round
ratios to ``fp32`` (process CPU time), after ``--warmup`` untimed rounds (auto measures its
shape classes there).

    python benchmarks/bench_auto_args.py --rounds 200 --threads 1

``--strings``: the step counter given as a string (``"step 17"``, as a batch's file names
or a logging tag): held by value before issue 27's eleventh sweep (every call recorded),
by type now (``auto-by-value`` is the behaviour before for strings too).  ``--numpy``: the
temperature given as a ``numpy.float32``: not guarded before that sweep (every call applied
the plan call by call), held as a number now (compare with the base commit's code).
``--plain``: also ``skip={99}`` (a set) and ``act=torch.tanh`` (a builtin): not guarded
before the twelfth sweep (call by call), by value and by identity now.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import ampcore
from ampcore._auto import _store


class Stepped(nn.Module):
    """``layers`` residual ``Linear(width)`` blocks; ``step`` and ``temperature`` change per call."""

    def __init__(self, layers: int = 24, width: int = 64) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(
        self, x: torch.Tensor, step: int | str, temperature: Any = 1.0, act: Any = torch.tanh, skip: Any = None
    ) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if not skip or i not in skip:
                x = x + act(block(x)) * float(temperature)
        return x


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, i: int, mode: str, args: Any) -> None:
    step = f"step {i}" if args.strings else i
    temperature = 1.0 + (i % 7) / 100
    if args.numpy:
        import numpy as np

        temperature = np.float32(temperature)
    plain = {"act": torch.tanh, "skip": {99}} if args.plain else {}  # (a builtin, a set)
    if mode == "fp32":
        out = model(x, step, temperature, **plain)
    elif mode == "auto-same":  # the same numbers every call: one signature (the floor)
        with ampcore.autocast("cpu", level="auto"):
            out = model(x, "step 0" if args.strings else 0, 1.0, **plain)
    else:
        with ampcore.autocast("cpu", level="auto"):
            out = model(x, step, temperature, **plain)
    nn.functional.mse_loss(out.float(), torch.zeros_like(x)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _by_value(blocked: nn.Module) -> None:
    """Switch :func:`loosen` off for ``blocked`` (the behaviour before: numbers by value)."""
    loosen = _store.loosen

    def patched(root: nn.Module, *args: Any) -> Any:
        return None if root is blocked else loosen(root, *args)

    _store.loosen = patched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--strings", action="store_true", help="the step counter as a string (a tag)")
    parser.add_argument("--numpy", action="store_true", help="the temperature as a numpy.float32")
    parser.add_argument("--plain", action="store_true", help="also a set and a function (act=torch.tanh)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    os.environ.setdefault("AMPCORE_AUTO_CACHE", "off")
    warnings.filterwarnings("ignore", category=ampcore.AmpcoreWarning)
    torch.manual_seed(0)
    base, x = Stepped(), torch.randn(16, 64)
    models = {m: copy.deepcopy(base) for m in ("fp32", "auto", "auto-by-value", "auto-same")}
    opts = {m: torch.optim.SGD(models[m].parameters(), lr=1e-4) for m in models}
    _by_value(models["auto-by-value"])
    runs: dict[str, Callable[[int], None]] = {
        m: (lambda i, m=m: _step(models[m], opts[m], x, i, m, args))  # type: ignore[misc]
        for m in models
    }
    names = list(runs)
    ratios: dict[str, list[float]] = {m: [] for m in names if m != "fp32"}
    for r in range(args.warmup + args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        took = {}
        for m in order:
            start = time.process_time()
            runs[m](r)
            took[m] = time.process_time() - start
        if r >= args.warmup:
            for m in ratios:
                ratios[m].append(took[m] / took["fp32"])
    what = "strings" if args.strings else "numbers"
    what += ", numpy temperature" if args.numpy else ""
    what += ", a set and a function" if args.plain else ""
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {args.threads} thread(s), load {load:.2f}, {args.rounds} rounds, {what}")
    for m, values in ratios.items():
        print(f"{m:>14} / fp32: median {statistics.median(values):.3f}")


if __name__ == "__main__":
    main()
