"""What ampcore's wrapper of ``torch.autocast.__enter__`` costs a ``torch.autocast`` entry
(issue 27, thirteenth stop: ``ampcore/_auto/_entered.py``, installed once a float32-default
program has run; it reads one thread-local per entry anywhere in the process).

Times ``with torch.autocast("cpu", dtype=torch.bfloat16): pass`` with torch's own
``__enter__`` and with the wrapper, in interleaved rounds (the order alternating), one
thread, and prints the medians and their ratio.

    python benchmarks/bench_autocast_enter.py --rounds 21
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.amp.autocast_mode import autocast

from ampcore._auto import _entered


def _time(n: int) -> float:
    """Seconds per entry and exit, over ``n``."""
    region = torch.autocast
    start = time.perf_counter()
    for _ in range(n):
        with region("cpu", dtype=torch.bfloat16):
            pass
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--entries", type=int, default=20000, help="entries per timed run")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    own = _entered._torch_enter
    times: dict[str, list[float]] = {"torch": [], "wrapped": []}
    _time(opts.entries)  # warm
    for r in range(opts.rounds):
        for name in ("torch", "wrapped") if r % 2 == 0 else ("wrapped", "torch"):
            autocast.__enter__ = own if name == "torch" else _entered._enter  # type: ignore[method-assign]
            times[name].append(_time(opts.entries))
    autocast.__enter__ = own  # type: ignore[method-assign]
    torch_us, wrapped_us = (statistics.median(times[k]) * 1e6 for k in ("torch", "wrapped"))
    ratios = sorted(w / t for w, t in zip(times["wrapped"], times["torch"], strict=True))
    print(f"torch.autocast enter+exit: torch's {torch_us:.3f} us, wrapped {wrapped_us:.3f} us")
    print(f"wrapped / torch's: median of per-round ratios {statistics.median(ratios):.3f} ", end="")
    print(f"(quartiles {ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f}, {opts.rounds} rounds)")


if __name__ == "__main__":
    main()
