"""What finding a copy's program costs ``level="auto"`` (issue 27, thirteenth stop).

A model copied every step (``copy.deepcopy``, a replica as ``nn.DataParallel`` makes one)
runs the program kept for its source (``ampcore/_auto/_twins.py``): the digest of its
layers finds it, once per copy (twice for a deep copy: its first call, then the adoption).
This prints the median time of that digest on a new copy of ``heldout-replica``'s encoder
(2 layers, d_model 128, 4 heads: 22 modules) and of a 12-layer one (130 modules), the
source's digest made first (its program kept)::

    python benchmarks/bench_auto_copies.py --rounds 300

``--lookup`` (the fifteenth stop) times the whole lookup of a copy's program instead: each
step makes a new copy and calls it in a ``level="auto"`` region (``no_grad``, 2 x 4 tokens),
and the thread CPU time spent in the root call's ``_roots._find`` plus, for a deep copy,
``_root_hooks.call_kwargs`` (its first call's digest) is taken per copy (median)::

    python benchmarks/bench_auto_copies.py --lookup --rounds 400

Run it once per version (``PYTHONPATH=<other worktree>`` for the other) to compare.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import torch
from auto_models7 import replicate
from torch import nn

from ampcore._auto import _twins


def _encoder(depth: int) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(128, 4, dim_feedforward=512, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)


def _digest_us(source: nn.Module, make: object, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        twin = make(source)  # type: ignore[operator]
        start = time.perf_counter()
        _twins.layers(twin)
        _twins.layers(twin)  # (a deep copy's first call and its adoption each make one)
        times.append((time.perf_counter() - start) * 1e6 / 2)
    return statistics.median(times)


def _lookup_us(source: nn.Module, make: object, rounds: int) -> float:
    """The thread CPU time of a new copy's program lookup (median over ``rounds`` copies)."""
    import ampcore
    from ampcore._auto import _root_hooks, _roots

    spent = [0.0]

    def timed(real: Any) -> Any:
        def call(*args: Any) -> Any:
            start = time.thread_time()
            try:
                return real(*args)
            finally:
                spent[0] += time.thread_time() - start

        return call

    x = torch.randn(2, 4, 128)

    def step() -> None:
        twin = make(source)  # type: ignore[operator]
        with torch.no_grad(), ampcore.autocast("cpu", level="auto"):
            twin(x)

    for _ in range(20):  # the source's program recorded, measured, kept
        step()
    real_find, real_kwargs = _roots._find, _root_hooks.call_kwargs
    _roots._find, _root_hooks.call_kwargs = timed(real_find), timed(real_kwargs)
    times = []
    try:
        for _ in range(rounds):
            spent[0] = 0.0
            step()
            times.append(spent[0] * 1e6)
    finally:
        _roots._find, _root_hooks.call_kwargs = real_find, real_kwargs
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--lookup", action="store_true", help="time the whole lookup of a copy's program")
    found = parser.parse_args()
    rounds = found.rounds
    if found.lookup:
        torch.set_num_threads(1)
        for depth in (2, 12):
            source = _encoder(depth)
            for how, make in (("replica", replicate), ("deepcopy", copy.deepcopy)):
                found_us = _lookup_us(source, make, rounds)
                print(f"depth {depth:2d} {how:9s} lookup of a new copy {found_us:7.1f} us (median)")
        return
    for depth in (2, 12):
        source = _encoder(depth)
        _twins.layers(source)  # (kept when its program is)
        for how, make in (("replica", replicate), ("deepcopy", copy.deepcopy)):
            print(f"depth {depth:2d} {how:9s} digest of a new copy {_digest_us(source, make, rounds):7.1f} us (median)")


if __name__ == "__main__":
    main()
