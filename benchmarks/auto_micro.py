"""The micro-benchmarks of ``bench_auto.py``: ``--region-cost`` (what an auto region costs
to enter and leave) and ``--pairs`` (auto against fp32, step by step)."""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

from auto_models import build, loss


def region_cost(rounds: int = 11, calls: int = 2000) -> None:
    """What an auto region costs to enter and leave against an O1 region, empty and around
    a call of a 3-module model whose program is settled (all float32: it runs as float32
    does), and a plain call of that model after auto regions (no hook runs there): medians
    of ``rounds`` interleaved rounds of ``calls`` calls, in us."""
    import warnings

    import torch

    import ampcore

    warnings.filterwarnings("ignore", category=ampcore.AmpcoreWarning)
    torch.set_num_threads(1)
    auto, o1 = ampcore.autocast("cpu", level="auto"), ampcore.autocast("cpu", level="O1")
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), torch.randn(2, 8)

    def enter(region: Any, call: bool) -> Callable[[], None]:
        def run() -> None:
            with region:  # one place in the code for every case: the root is known there
                if call:
                    model(x)

        return run

    for _ in range(3):
        enter(auto, True)()  # measured and recorded: a program from the third call on

    def made(make: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            with make():  # a region object made per step, as training loops write it
                pass

        return run

    cases = {
        "torch.autocast made + enter/exit": made(lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
        "O1 region made + enter/exit": made(lambda: ampcore.autocast("cpu")),
        "auto region made + enter/exit": made(lambda: ampcore.autocast("cpu", level="auto")),
        "O1 region enter/exit": enter(o1, False),
        "auto region enter/exit": enter(auto, False),
        "O1 region, 3-module call": enter(o1, True),
        "auto region, 3-module call": enter(auto, True),
        "plain 3-module call after auto": lambda: model(x),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            start = time.process_time()
            for _ in range(calls):
                run()
            times[name].append((time.process_time() - start) / calls * 1e6)
    for name, values in times.items():
        print(f"{name:<36}{statistics.median(values):8.2f} us (min {min(values):.2f})")


def pairs(name: str, count: int) -> None:
    """auto against fp32 on ``name``, one training step of each in turn, ``count`` times in
    one process: the median of the per-pair ratios (robust to a loaded machine's drift),
    next to an O1 region and torch.autocast around the float32 step (what any region costs:
    the loss runs under the enabled region, the model under ``enabled=False``)."""
    import warnings

    import torch

    import ampcore

    warnings.filterwarnings("ignore", category=ampcore.AmpcoreWarning)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    base, data = build(name, "cpu")
    modes = ("fp32", "auto", "O1 region, fp32 inside", "torch.autocast, fp32 inside")
    models = {mode: copy.deepcopy(base) for mode in modes}
    auto, o1 = ampcore.autocast("cpu", level="auto"), ampcore.autocast("cpu", level="O1")
    outers = {"auto": auto, modes[2]: o1, modes[3]: torch.autocast("cpu", dtype=torch.bfloat16)}
    calls: dict[str, list[float]] = {mode: [] for mode in models}

    def step(mode: str) -> None:
        model = models[mode]
        outer = outers.get(mode, contextlib.nullcontext())
        inner = contextlib.nullcontext() if mode in ("auto", "fp32") else torch.autocast("cpu", enabled=False)
        with outer:
            with inner:
                start = time.perf_counter_ns()
                out = model(*data)
                calls[mode].append((time.perf_counter_ns() - start) / 1e3)
            value = loss(out, data)
        value.backward()
        for p in model.parameters():
            p.grad = None

    times: dict[str, list[float]] = {mode: [] for mode in models}
    for round_ in range(count + 20):
        for mode in models:
            start = time.perf_counter()
            step(mode)
            if round_ >= 20:
                times[mode].append(time.perf_counter() - start)
    for mode in modes[1:]:
        ratios = [a / b for a, b in zip(times[mode], times["fp32"], strict=True)]
        print(f"{name}: {mode} / fp32 = {statistics.median(ratios):.3f} (median of {count} pairs)")
    for mode in modes:  # inside the step: Python runs on cold caches after the backward
        print(f"{name}: {mode}, the model call in the step: {statistics.median(calls[mode][20:]):.1f} us (median)")
