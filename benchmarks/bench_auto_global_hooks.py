"""Settled auto blocks with and without a global hook of the user's (issue 27, seventeenth stop).

Two roots (a float32 tower and a small one) in one ``level="auto"`` block, settled; per
case the Python calls of one block (``sys.setprofile``: load-independent) and the median
time of a block (microseconds, ``--rounds`` rounds of ``--blocks`` blocks).  Cases: no
global hook ("plain"), a global forward pre-hook registered before the blocks ("before"),
one registered inside each block ("inside").  Run it with this checkout and with an older
one on ``PYTHONPATH`` to compare (docs/performance.md)::

    python benchmarks/bench_auto_global_hooks.py --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

import ampcore


def _calls(run: Callable[[], Any]) -> int:
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += event == "call"

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--blocks", type=int, default=300)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
    b = nn.Sequential(nn.Linear(16, 16))
    x = torch.randn(8, 16)

    def hook(module: nn.Module, inputs: tuple[Any, ...]) -> None:
        return None

    def block(inside: bool) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad(), ampcore.autocast("cpu", level="auto"):
                handle = register_module_forward_pre_hook(hook) if inside else None
                y, z = a(x), b(x)
                if handle is not None:
                    handle.remove()
                return y @ z.t()

        return run

    for case in ("plain", "before", "inside"):
        handle = register_module_forward_pre_hook(hook) if case == "before" else None
        run = block(case == "inside")
        for _ in range(20):  # recorded, checked, settled
            run()
        calls = _calls(run)
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.blocks):
                run()
            times.append((time.perf_counter() - start) / args.blocks * 1e6)
        if handle is not None:
            handle.remove()
        print(f"{case:7s} python calls/block {calls:4d}  us/block median {statistics.median(times):8.1f}", flush=True)


if __name__ == "__main__":
    main()
