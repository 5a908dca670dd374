"""What torch's module-hook path alone costs inside a training step (issue 27): no ampcore,
the heldout-tie model of ``bench_auto.py``, one training step of each mode in turn, the
model call timed inside the step (cold caches after the backward), medians in us.

* ``plain``: no hooks;
* ``hooks``: the shape of a settled ``level="auto"`` root call: a global forward pre-hook
  that takes itself out (as auto's sentinel does while a program runs), the root marked in
  its with-kwargs pre-hook dict and an always-called forward hook (the root's post-hook),
  each a Python function that does nothing else;
* ``hooks+autocast``: the same under an enabled torch.autocast, switched off and on around
  the call (what a float32 program does).

Usage::

    python benchmarks/bench_hook_path.py [--steps 300]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from typing import Any

import torch
from auto_models import build, loss

MODES = ("plain", "hooks", "hooks+autocast")


class _Key:
    """A hook-dict key of our own (as auto's)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    base, data = build("heldout-tie", "cpu")
    pre_hooks: Any = torch.nn.modules.module._global_forward_pre_hooks
    key = _Key()

    def pre(module: Any, args: Any, kwargs: Any = None) -> None:
        pre_hooks.pop(key, None)  # off while the call runs

    def post(module: Any, args: Any, output: Any = None) -> None:
        return None

    models = {mode: copy.deepcopy(base) for mode in MODES}
    calls: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.steps + 20):
        for mode in MODES:
            model: Any = models[mode]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "hooks+autocast"):
                if mode != "plain":
                    pre_hooks[key] = pre
                    model._forward_pre_hooks_with_kwargs[key] = True
                    model._forward_hooks[key] = post
                    model._forward_hooks_always_called[key] = True
                start = time.perf_counter_ns()
                if mode == "hooks+autocast":
                    torch.set_autocast_enabled("cpu", False)
                out = model(*data)
                if mode == "hooks+autocast":
                    torch.set_autocast_enabled("cpu", True)
                calls[mode].append((time.perf_counter_ns() - start) / 1e3)
                if mode != "plain":
                    pre_hooks.pop(key, None)
                    del model._forward_pre_hooks_with_kwargs[key], model._forward_hooks[key]
                    del model._forward_hooks_always_called[key]
                value = loss(out, data)
            value.backward()
            for p in model.parameters():
                p.grad = None
    for mode in MODES:
        print(f"heldout-tie, {mode}: the model call in the step {statistics.median(calls[mode][20:]):.1f} us (median)")


if __name__ == "__main__":
    main()
