"""What the whole-call check's ``low`` side costs against a real torch.autocast step, on
models that use a weight more than once in one call (issue 27, fourteenth stop).

A torch.autocast step casts each float32 weight once (autocast's cache); the check's timed
runs went without the cache where gradients are on, a cast per use: the low side timed
dearer than the step it stands for, a bias toward float32 on exactly these models.  For
each model (:mod:`auto_models14`, and any other of ``bench_auto.py``'s; ``@ISA`` as there),
in a process of its own with an empty plan cache, this times a torch.autocast step and a
float32 step (forward, then :func:`torch.autograd.grad` outside the region, as the check's
runs) with the adapter's clock, then runs three auto steps and prints the check's figures
over the steps'::

    python benchmarks/bench_auto_looped.py --models heldout-albert heldout-cell \\
        heldout-albert@AVX512_CORE heldout-cell@AVX512_CORE

``low/step`` near 1.0 is fair; above it the check's low side costs more than the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from auto_procs import isa_env


def child(name: str, rounds: int) -> dict[str, Any]:
    import torch
    from auto_models import build
    from auto_models import loss as loss_of

    import ampcore
    from ampcore._auto import _hooks
    from ampcore._backends.registry import resolve_device

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, inputs = build(name, "cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    clock = _hooks.device_clock(resolve_device("cpu").backend, 0)
    if clock is None:
        raise SystemExit("no clock")

    def step(low: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
            out = model(*inputs)
        torch.autograd.grad(loss_of(out, inputs), params, allow_unused=True)

    times: dict[str, list[float]] = {"low": [], "fp32": []}
    for i in range(rounds + 2):
        for mode in ("low", "fp32") if i % 2 else ("fp32", "low"):
            ms = clock(lambda low=mode == "low": step(low), "fp32")  # type: ignore[misc]
            if i >= 2:
                times[mode].append(ms)
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            out = model(*inputs)
        loss_of(out, inputs).backward()
        model.zero_grad(set_to_none=True)
    checks = {key: vars(check) for key, check in ampcore.auto_plan("cpu").roots.items()}
    return {"step": {k: statistics.median(v) for k, v in times.items()}, "checks": checks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["heldout-albert", "heldout-cell"])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rounds)))
        return
    print(
        f"{'model':32} {'step low':>9} {'step fp32':>9} {'chk low':>8} {'chk fp32':>8} {'chk plan':>8} "
        f"{'low/step':>8} {'fp32/step':>9}  verdict"
    )
    for spec in args.models:
        name, _, isa = spec.partition("@")
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, **isa_env(isa), "AMPCORE_AUTO_CACHE": cache}
            cmd = [sys.executable, __file__, "--child", name, "--rounds", str(args.rounds)]
            found = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        step = found["step"]
        for key, c in found["checks"].items():
            print(
                f"{spec:32} {step['low']:9.2f} {step['fp32']:9.2f} {c['low_ms']:8.2f} {c['fp32_ms']:8.2f} "
                f"{c['plan_ms']:8.2f} {c['low_ms'] / step['low']:8.3f} {c['fp32_ms'] / step['fp32']:9.3f}  "
                f"{c['verdict']} ({key.split(' #')[0].split('] ')[-1]})"
            )
        if not found["checks"]:
            print(f"{spec:32} {step['low']:9.2f} {step['fp32']:9.2f}  (no whole-call check)")


if __name__ == "__main__":
    main()
