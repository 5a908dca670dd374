"""Plain ``torch.autocast`` on a PrivateUse1 device with its own autocast kernels, before and
after ampcore's resident kernels are registered (issue 25, defect 6).

The device is the in-repo test device in mode ``partial`` (kernels for ``mm`` and ``dot``, a
fallthrough for everything else: torch_openreg's registrations, in Python).  Each process
times every op under plain ``torch.autocast`` (median of ``--calls`` calls, each call a
median of a batch), runs one ampcore OD region (which registers the resident kernels), and
times them again.  Registration is for the life of the process, so before and after cannot
interleave: ``--processes`` fresh processes alternate, and the table gives the median
microseconds per call and the median of the per-process differences.

    python benchmarks/bench_vendor_kernels.py --processes 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

OPS = ("add", "relu", "softmax", "mm", "dot")


def _measure(calls: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    x = torch.randn(64, 64).to("acme")
    ops: dict[str, Callable[[], Any]] = {
        "add": lambda: x + x,
        "relu": lambda: torch.relu(x),
        "softmax": lambda: F.softmax(x, -1),
        "mm": lambda: torch.mm(x, x),
        "dot": lambda: torch.dot(x[0], x[1]),
    }
    timings: dict[str, float] = {}
    with torch.autocast("acme", dtype=torch.float16):
        for name, op in ops.items():
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                for _ in range(20):
                    op()
                samples.append((time.perf_counter() - start) / 20 * 1e6)
            timings[name] = statistics.median(samples)
    return timings


def child(calls: int) -> None:
    import torch

    import ampcore

    torch.set_num_threads(1)  # a shared machine: no thread pool to wait on
    ampcore.get_backend("acme").require_available()
    _measure(5)  # warm-up
    before = _measure(calls)
    with ampcore.autocast("acme", dtype=torch.float16, level="OD"):
        pass
    after = _measure(calls)
    print(json.dumps({"before": before, "after": after}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.calls)
        return
    env = {**os.environ, "AMPCORE_ACME_AUTOCAST": "partial", "AMPCORE_BLOCK_PLUGINS": ""}
    runs = []
    for _ in range(args.processes):
        done = subprocess.run([sys.executable, __file__, "--child", "--calls", str(args.calls)],
                              capture_output=True, text=True, env=env, check=True)  # fmt: skip
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    print(f"{'op':10} {'before us':>10} {'after us':>10} {'added us':>10}   ({args.processes} processes)")
    for op in OPS:
        before = statistics.median(r["before"][op] for r in runs)
        after = statistics.median(r["after"][op] for r in runs)
        added = statistics.median(r["after"][op] - r["before"][op] for r in runs)
        print(f"{op:10} {before:10.1f} {after:10.1f} {added:+10.1f}")


if __name__ == "__main__":
    main()
