"""The settled step of float32-default programs (issue 27, thirteenth stop: ``_auto/_entered.py``
touches their ``Running``; this times what it may cost where the forward enters no region).

Two small training steps, each under ``level="auto"`` with a frozen plan loaded (known
decisions, no timing, no whole-call check), against float32 (no region) in the same
process, in rounds that alternate the order:

* ``wide``: 4 x ``Linear(16)``-like layers decided float32 and the last (``Linear(32, 4)``)
  low: a float32-default program with one switched module (hooks, ``Running.stop``);
* ``all-fp32``: the same layers, every one float32: a float32 default that hooks nothing
  (the inline path of ``_roots``).

Prints per model the median step times and the median of per-round ratios auto / float32.
Run it with the old code on ``PYTHONPATH`` in other processes, interleaved, to compare.

    python benchmarks/bench_auto_fp32_default.py --rounds 15
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
import warnings

import torch
from torch import nn

import ampcore
from ampcore._auto._shapes import shape_class


def _model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 32), nn.Linear(32, 4))


def _load(model: nn.Module, x: torch.Tensor, all_fp32: bool) -> None:
    """A frozen bfloat16 plan deciding every class the model meets (float32 and bfloat16 inputs)."""
    found: dict[str, str] = {}
    h = x
    for layer in model:
        for arg in (h, h.bfloat16()):
            key = shape_class(layer, (arg,), "cpu")
            if key is not None:
                found[key] = "fp32" if all_fp32 or layer.in_features == 16 else "low"
        h = layer(h)
    fp = ampcore.auto_plan("cpu", torch.bfloat16).fingerprint
    entries = {k: {"decision": d} for k, d in found.items()}
    ampcore.load_plan({"format": 2, "fingerprint": fp, "entries": entries}, freeze=True)


def _step(model: nn.Module, x: torch.Tensor, auto: bool) -> None:
    if auto:
        with ampcore.autocast("cpu", level="auto", dtype=torch.bfloat16):
            out = model(x)
    else:
        out = model(x)
    out.float().sum().backward()


def _run(model: nn.Module, x: torch.Tensor, auto: bool, steps: int) -> float:
    start = time.process_time()
    for _ in range(steps):
        _step(model, x, auto)
    return (time.process_time() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=300)
    opts = parser.parse_args()
    os.environ.setdefault("AMPCORE_AUTO_CACHE", tempfile.mkdtemp())
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    x = torch.randn(8, 16)
    for name, all_fp32 in (("wide", False), ("all-fp32", True)):
        torch.manual_seed(0)
        model = _model()
        plain = copy.deepcopy(model)
        _load(model, x, all_fp32)
        for _ in range(50):  # recorded, then settled
            _step(model, x, True)
            _step(plain, x, False)
        from ampcore._auto import _store

        programs = [p for p in _store._programs.get(model, {}).values() if hasattr(p, "default_fp32")]
        shown = [f"default {'fp32' if p.default_fp32 else 'low'}, {len(p.switched)} switched" for p in programs]
        times: dict[str, list[float]] = {"auto": [], "fp32": []}
        for r in range(opts.rounds):
            for mode in ("auto", "fp32") if r % 2 == 0 else ("fp32", "auto"):
                times[mode].append(_run(model if mode == "auto" else plain, x, mode == "auto", opts.steps))
        ratios = sorted(a / f for a, f in zip(times["auto"], times["fp32"], strict=True))
        auto_us, fp32_us = (statistics.median(times[m]) * 1e6 for m in ("auto", "fp32"))
        print(
            f"{name:9s} auto {auto_us:7.1f} us  fp32 {fp32_us:7.1f} us  auto/fp32 {statistics.median(ratios):.3f} "
            f"(quartiles {ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f})  programs: {shown}",
            flush=True,
        )


if __name__ == "__main__":
    main()
