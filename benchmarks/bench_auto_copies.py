"""What finding a copy's program costs ``level="auto"`` (issue 27, thirteenth stop).

A model copied every step (``copy.deepcopy``, a replica as ``nn.DataParallel`` makes one)
runs the program kept for its source (``ampcore/_auto/_twins.py``): the digest of its
layers finds it, once per copy (twice for a deep copy: its first call, then the adoption).
This prints the median time of that digest on a new copy of ``heldout-replica``'s encoder
(2 layers, d_model 128, 4 heads: 22 modules) and of a 12-layer one (130 modules), the
source's digest made first (its program kept)::

    python benchmarks/bench_auto_copies.py --rounds 300

Run it once per version (``PYTHONPATH=<other worktree>`` for the other) to compare.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    rounds = parser.parse_args().rounds
    for depth in (2, 12):
        source = _encoder(depth)
        _twins.layers(source)  # (kept when its program is)
        for how, make in (("replica", replicate), ("deepcopy", copy.deepcopy)):
            print(f"depth {depth:2d} {how:9s} digest of a new copy {_digest_us(source, make, rounds):7.1f} us (median)")


if __name__ == "__main__":
    main()
