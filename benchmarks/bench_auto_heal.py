"""How many class decisions end provisional on this machine, and how many a later process
measures again (issue 27, fourteenth stop: class decisions that heal, second pass).

Each run starts ``--processes`` fresh processes one after another on one disk cache (a
temporary directory): each runs ``--steps`` training steps of a model of ``--classes``
Linear layers of distinct shapes in ``ampcore.autocast("cpu", level="auto")`` with
``--threads`` intra-op threads, then prints how many classes the plan holds, how many are
provisional (``?`` in the table), how many this process measured, and the adapter's load.
A class provisional on a machine busy for good is measured again by the next processes
(three measurements in all): the measuring cost of a cold start, paid again for nothing
where the clock left the other work out (one thread: the thread's CPU time).

Run it with the code before a change on ``PYTHONPATH`` for the other side of an A/B::

    python benchmarks/bench_auto_heal.py --threads 1 2 --processes 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(classes: int, steps: int, threads: int) -> dict[str, object]:
    import torch
    from torch import nn

    import ampcore
    from ampcore._auto import _hooks

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    widths = [64 + 32 * i for i in range(classes)]
    heads = nn.ModuleList(nn.Linear(256, w) for w in widths)
    x = torch.randn(64, 256)
    start = time.perf_counter()
    for _ in range(steps):
        with ampcore.autocast("cpu", level="auto"):
            outs = [h(x).float().sum() for h in heads]
        torch.stack(outs).sum().backward()
        heads.zero_grad(set_to_none=True)
    plan = ampcore.auto_plan("cpu")
    costs = [e.costs for e in plan.entries.values() if e.costs is not None]
    return {
        "classes": len(costs),
        "provisional": sum(c.provisional for c in costs),
        "checks": sorted(c.checks for c in costs),
        "measured_s": round(_hooks._process.spent_s, 3),
        "load": max((c.load or 0.0) for c in costs) if costs else None,
        "wall_s": round(time.perf_counter() - start, 2),
        "code": os.path.dirname(os.path.dirname(ampcore.__file__)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=12)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    for threads in args.threads:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "AMPCORE_AUTO_CACHE": cache, "AMPCORE_AUTO_BUDGET": "60"}
            for n in range(args.processes):
                argv = [sys.executable, __file__, "--child", str(args.classes), str(args.steps), str(threads)]
                out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
                found = json.loads(out.strip().splitlines()[-1])
                share = found["provisional"] / max(1, found["classes"])
                print(
                    f"threads={threads} process={n + 1}: classes {found['classes']}, provisional "
                    f"{found['provisional']} ({share:.0%}), checks {found['checks']}, measuring "
                    f"{found['measured_s']} s, load {found['load']:.2f}, wall {found['wall_s']} s, uptime "
                    f"{os.getloadavg()[0]:.1f} ({found['code']})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
