"""A settled auto site of N roots: marking every root at each region against marking only
the root called (issue 27, twelfth stop).

An ensemble of N two-layer ``Linear(64)`` MLPs, a batch of 8, a training step (forward,
backward) per member, each member in an ``ampcore.autocast(level="auto")`` region entered
at one place in the code (a site of N roots; each N has its own site).  Three ways, in
one process, rounds interleaved: float32 without a region, ``all`` (the region marks every
root of the site at entry and unmarks them at exit: the way before the twelfth stop, and
still the way of a site of fewer than ``_MARK_CALLED`` roots) and ``called`` (the marker,
a second global pre-hook, marks the root called).  The way is switched per site
(``_Site.marking``), so both run the same code otherwise.

Printed per N: the step's process CPU time (ms) of each way and called / all (median of
the per-round ratios), then, from rounds with timers around each part, the in-step us per
region of ``region_entered``, ``region_exited``, the sentinel, the marker and the
post-hook.

Usage::

    python benchmarks/bench_auto_site_marks.py [--roots 2 3 4 6 8 20] [--rounds 12]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
import types
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

PARTS = ("region_entered", "region_exited", "_sentinel", "mark_called", "_root_post")


def _step_of(n: int) -> Callable[[list[Any], Any], None]:
    """A step function whose region is entered at a place of its own (one site per N)."""

    def step(models: list[Any], x: Any) -> None:
        import ampcore

        for m in models:
            with ampcore.autocast("cpu", level="auto"):
                out = m(x)
            out.float().mean().backward()
            for p in m.parameters():
                p.grad = None

    code = step.__code__.replace(co_name=f"step_{n}_roots")
    return types.FunctionType(code, step.__globals__)  # type: ignore[return-value]


def _fp32(models: list[Any], x: Any) -> None:
    for m in models:
        m(x).float().mean().backward()
        for p in m.parameters():
            p.grad = None


def _run(models: list[Any], x: Any, step: Callable[..., None], site: Any, way: str, count: int) -> float:
    """``count`` steps the ``way`` given; ms of process CPU time a step."""
    start = time.process_time()
    for _ in range(count):
        if way == "fp32":
            _fp32(models, x)
        else:
            site.marking = way == "called"
            step(models, x)
    return (time.process_time() - start) / count * 1e3


def _timers(times: dict[str, int]) -> Callable[[], None]:
    """Wrap the parts in timers adding ns to ``times``; returns the undo."""
    from ampcore._auto import _root_hooks, _roots

    undo = []
    for name in PARTS:
        for module in (_roots, _root_hooks):
            real = getattr(module, name, None)
            if real is None or getattr(real, "_timed", False):
                continue

            def timed(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
                start = time.perf_counter_ns()
                try:
                    return _real(*a, **k)
                finally:
                    times[_name] += time.perf_counter_ns() - start

            timed = functools.wraps(real)(timed)
            timed._timed = True  # type: ignore[attr-defined]
            setattr(module, name, timed)
            undo.append((module, name, real))
            # the same function under the other module's name: one wrapper for both
            for other in (_roots, _root_hooks):
                if other is not module and getattr(other, name, None) is real:
                    setattr(other, name, timed)
                    undo.append((other, name, real))

    def restore() -> None:
        for module, name, real in undo:
            setattr(module, name, real)

    return restore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roots", type=int, nargs="+", default=[2, 3, 4, 6, 8, 20])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    os.environ.setdefault("AMPCORE_AUTO_CACHE", tempfile.mkdtemp())
    import torch
    from torch import nn

    import ampcore
    from ampcore._auto._roots_state import _MARK_CALLED, _local

    warnings.filterwarnings("ignore", category=ampcore.AmpcoreWarning)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    print(f"torch {torch.__version__}, 1 thread; {os.getloadavg()[0]:.1f} load at start")
    for n in args.roots:
        models = [nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)) for _ in range(n)]
        step = _step_of(n)
        steps = max(15, 300 // n)
        for _ in range(60 if n < 10 else 20):
            step(models, x)
        site = _local.site
        if site is None or len(site.roots) != n:
            raise SystemExit(f"the site of {n} roots was not settled")

        run = functools.partial(_run, models, x, step, site)

        for way in ("all", "called", "fp32"):
            run(way, steps)
        took: dict[str, list[float]] = defaultdict(list)
        ways = ("fp32", "all", "called")
        for r in range(args.rounds):
            for way in ways[r % 3 :] + ways[: r % 3]:
                took[way].append(run(way, steps))
        parts: dict[tuple[str, str], list[float]] = defaultdict(list)
        times: dict[str, int] = defaultdict(int)
        restore = _timers(times)
        try:
            for r in range(args.rounds):
                for way in ("all", "called") if r % 2 else ("called", "all"):
                    times.clear()
                    run(way, steps)
                    for name in PARTS:
                        parts[(way, name)].append(times[name] / steps / n / 1e3)
        finally:
            restore()
        site.marking = len(site.called) >= _MARK_CALLED
        ratio = statistics.median(c / a for c, a in zip(took["called"], took["all"], strict=True))
        excess = statistics.median(
            (c - f) / (a - f) for c, a, f in zip(took["called"], took["all"], took["fp32"], strict=True)
        )
        med = {w: statistics.median(took[w]) for w in ways}
        print(
            f"\n{n} roots: step fp32 {med['fp32']:.3f} ms, all {med['all']:.3f}, called {med['called']:.3f}; "
            f"called / all {ratio:.3f}, excess over fp32 x {excess:.3f} (load {os.getloadavg()[0]:.1f})"
        )
        for name in PARTS:
            a, c = (statistics.median(parts[(w, name)]) for w in ("all", "called"))
            print(f"  {name:15s} all {a:6.2f} us  called {c:6.2f} us per region")


if __name__ == "__main__":
    main()
