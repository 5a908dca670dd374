"""What ``level="auto"``'s call-by-call path costs inside a training step (issue 27).

A region that cannot have programs applies the plan call by call through the two global
module hooks of ``ampcore._auto._hooks``: here a ``level="auto"`` region nested in an O1
region (always that path).  Each step runs the forward in the regions and the backward
after them; the plan is loaded (nothing is measured) and decides every Linear ``low``
(``--plan low``: the same ops as an O1 region, so the difference is the hooks alone) or
every other one ``fp32`` (``--plan mixed``).  Against, in the same process and
interleaved: the same step in an O1 region nested in an O1 region; and that step with two
global hooks that do nothing registered (torch's own hook path, which the call-by-call
path cannot avoid).  Process CPU time, medians over rounds, us per step, and per planned
(Linear) call for the hooks' own code.

Models: ``mlp`` (4 x ``Linear(128)``, ReLU between, 100 tokens: ``seqlen-long``'s model)
and ``small`` (32 x ``Linear(32)``, batch 8: many small layers).  To compare two versions
of ampcore, run this file from each with ``PYTHONPATH`` pointing at its checkout.

Usage::

    python benchmarks/bench_auto_call_path.py [--models mlp small] [--plan low] [--rounds 9]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any


def _model(torch: Any, name: str) -> tuple[Any, Any]:
    nn = torch.nn
    d, n, x = (128, 4, torch.randn(100, 128)) if name == "mlp" else (32, 32, torch.randn(8, 32))
    parts: list[Any] = []
    for _ in range(n):
        parts += [nn.Linear(d, d), nn.ReLU()]
    return nn.Sequential(*parts[:-1]), x


def _load_plan(torch: Any, ampcore: Any, model: Any, x: Any, mixed: bool) -> int:
    from ampcore._auto._shapes import shape_class

    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    entries = {}
    for i, layer in enumerate(linears):
        for dtype in (torch.float32, torch.bfloat16):
            key = shape_class(layer, (torch.zeros(x.shape, dtype=dtype),), "cpu")
            entries[key] = {"decision": "fp32" if mixed and i % 2 == 0 else "low"}
    ampcore.load_plan({"format": 2, "fingerprint": ampcore.auto_plan("cpu").fingerprint, "entries": entries})
    return len(linears)


@contextlib.contextmanager
def _idle_hooks(torch: Any) -> Iterator[None]:
    module = torch.nn.modules.module
    handles = [
        module.register_module_forward_pre_hook(lambda m, a: None),
        module.register_module_forward_hook(lambda m, a, k, o: None, with_kwargs=True, always_call=True),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def run(name: str, args: argparse.Namespace) -> None:
    import torch

    import ampcore

    torch.set_num_threads(1)
    model, x = _model(torch, name)
    planned = _load_plan(torch, ampcore, model, x, args.plan == "mixed")

    def step(level: str, idle: bool = False) -> None:
        with _idle_hooks(torch) if idle else contextlib.nullcontext():
            with ampcore.autocast("cpu"), ampcore.autocast("cpu", level=level):
                out = model(x)
        out.float().sum().backward()
        for p in model.parameters():
            p.grad = None

    cases: dict[str, Callable[[], None]] = {
        "O1 in O1": lambda: step("O1"),
        "O1 in O1 + idle global hooks": lambda: step("O1", idle=True),
        "auto in O1 (call by call)": lambda: step("auto"),
    }
    times: dict[str, list[float]] = {case: [] for case in cases}
    for call in cases.values():
        for _ in range(args.steps // 2):
            call()
    for r in range(args.rounds):
        names = list(cases)[r % 3 :] + list(cases)[: r % 3]
        for case in names:
            start = time.process_time()
            for _ in range(args.steps):
                cases[case]()
            times[case].append((time.process_time() - start) / args.steps * 1e6)
    med = {case: statistics.median(t) for case, t in times.items()}
    base = med["O1 in O1"]
    for case, us in med.items():
        print(f"{name:<6} {args.plan:<6} {case:<30} {us:9.1f} us/step  (+{us - base:7.1f})")
    hooks = med["auto in O1 (call by call)"] - med["O1 in O1 + idle global hooks"]
    print(f"{name:<6} {args.plan:<6} auto's hooks: {hooks:.1f} us/step, {hooks / planned:.1f} us per planned call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "small"], choices=["mlp", "small"])
    parser.add_argument("--plan", default="low", choices=["low", "mixed"])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["AMPCORE_AUTO_CACHE"] = cache
        warnings.simplefilter("ignore")
        for name in args.models:
            run(name, args)


if __name__ == "__main__":
    main()
