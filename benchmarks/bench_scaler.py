"""ampcore.GradScaler vs torch.amp.GradScaler: ``scale + unscale_ + step + update`` on CPU.

A model of 100 parameter tensors (1M parameters in all); gradients are refilled outside the
timed region before every iteration.  The two scalers run interleaved (alternating which goes
first) on identical copies of the model; the table gives the median time per iteration of
each and the ratio ampcore / torch.  The first row runs torch against itself: its distance
from 1.000 is the noise of the machine at the time.

    python benchmarks/bench_scaler.py --rounds 300
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, Final

import torch

import ampcore

N_TENSORS, TENSOR_NUMEL = 100, 10_000


PARTS: Final = ("scale", "unscale_", "step", "update")


def make_case(
    optimizer: str, scaler_factory: Callable[[], Any]
) -> tuple[Callable[[], None], Callable[[], tuple[float, ...]]]:
    """(refill gradients, one iteration returning the seconds of each of PARTS) for one
    scaler on its own model copy."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(100, 100)) for _ in range(N_TENSORS)]
    grads = [torch.randn(100, 100) * 2.0**10 for _ in range(N_TENSORS)]
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.Adam(params, lr=1e-3, fused=optimizer == "adam-fused")
    scaler = scaler_factory()
    loss = torch.tensor(1.0, requires_grad=True)

    def refill() -> None:
        for p, g in zip(params, grads, strict=True):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)

    def iteration() -> tuple[float, ...]:
        t0 = time.perf_counter()
        scaler.scale(loss)
        t1 = time.perf_counter()
        scaler.unscale_(opt)
        t2 = time.perf_counter()
        scaler.step(opt)
        t3 = time.perf_counter()
        scaler.update()
        t4 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, t4 - t3

    return refill, iteration


TORCH_VS_TORCH: Final = "noise floor: torch vs torch (SGD)"
#: Case option: run the portable update, as on a device without ``torch._amp_update_scale_``.
PORTABLE: Final = "portable"
CASES: list[tuple[str, str, dict[str, Any]]] = [
    (TORCH_VS_TORCH, "sgd", {}),
    ("SGD momentum, hysteresis=1", "sgd", {}),
    ("SGD momentum, hysteresis=2, min_scale=1", "sgd", {"hysteresis": 2, "min_scale": 1.0}),
    ("Adam (foreach)", "adam", {}),
    ("Adam (fused)", "adam-fused", {}),
    ("SGD momentum, hysteresis=2, portable update", "sgd", {"hysteresis": 2, "min_scale": 1.0, PORTABLE: True}),
]


Row = tuple[str, dict[str, list[float]], dict[str, list[float]]]


def run(rounds: int, warmup: int) -> list[Row]:
    """Per case: the title and, for torch and ampcore, the seconds of every timed round as
    ``{"total": [...], "scale": [...], ...}``."""
    rows = []
    for title, optimizer, options in CASES:

        def torch_scaler() -> Any:
            return torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10**9)

        def ampcore_scaler(options: dict[str, Any] = options) -> Any:
            settings = {k: v for k, v in options.items() if k != PORTABLE}
            scaler = ampcore.GradScaler(
                "cpu", dtype=torch.float16, init_scale=2.0**10, growth_interval=10**9, **settings
            )
            if options.get(PORTABLE):
                scaler._kernels._native_update["cpu"] = False  # noqa: SLF001 - the probe's answer on such a device
            return scaler

        baseline = make_case(optimizer, torch_scaler)
        ours = make_case(optimizer, torch_scaler if title == TORCH_VS_TORCH else ampcore_scaler)
        times: dict[str, dict[str, list[float]]] = {
            name: {part: [] for part in ("total", *PARTS)} for name in ("torch", "ampcore")
        }
        for i in range(warmup + rounds):
            order = [("torch", baseline), ("ampcore", ours)]
            if i % 2:
                order.reverse()
            for name, (refill, iteration) in order:
                refill()
                parts = iteration()
                if i >= warmup:
                    times[name]["total"].append(sum(parts))
                    for part, seconds in zip(PARTS, parts, strict=True):
                        times[name][part].append(seconds)
        rows.append((title, times["torch"], times["ampcore"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1: quiet on shared CPUs)")
    parser.add_argument("--parts", action="store_true", help="also print the median of each call, in microseconds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} interleaved rounds, "
        f"{N_TENSORS} tensors x {TENSOR_NUMEL} = {N_TENSORS * TENSOR_NUMEL:,} parameters"
    )
    rows = run(args.rounds, args.warmup)
    print(f"{'case':<42} {'torch ms':>9} {'ampcore ms':>11} {'ratio':>7}")
    for title, base, ours in rows:
        base_ms, ours_ms = (statistics.median(t["total"]) * 1e3 for t in (base, ours))
        print(f"{title:<42} {base_ms:>9.3f} {ours_ms:>11.3f} {ours_ms / base_ms:>7.3f}")
    if args.parts:
        print(f"\nmedian us per call, torch / ampcore\n{'case':<42}" + "".join(f"{p:>18}" for p in PARTS))
        for title, base, ours in rows:
            cells = [f"{statistics.median(base[p]) * 1e6:.0f} / {statistics.median(ours[p]) * 1e6:.0f}" for p in PARTS]
            print(f"{title:<42}" + "".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
