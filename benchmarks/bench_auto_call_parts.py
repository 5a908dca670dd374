"""Where a settled ``level="auto"`` region's time goes inside a step (issue 27).

A region object made per step around one root call whose program is settled, on an MLP of
three ``Linear(width)`` layers (ReLU between) and a batch of 64, each step followed by
other work that evicts the caches (the backward of a training step, or the next batch's
forward in inference), as in user code.  Each part is timed inside the step by wrapping
it (the wrappers add about 0.2 us each): the region's construction, ``__enter__`` (and
within it auto's ``region_entered``), the sentinel (auto's pre-hook of the root; within
it the signature, the guard's tree check and the autocast switch), the root's post-hook,
``__exit__`` (within it ``region_exited``), and the whole step against a float32 step
without a region and one inside ``torch.autocast(enabled=False)`` made per step (the floor of
any region), interleaved, medians over rounds, in us.

``guard floor`` is the cheapest region that still guards the call (issue 27, tenth stop):
``torch.autocast`` on in bfloat16 made per step, and only the hook work no guarded design
can drop: a global pre-hook (a module called directly must be noticed: a new root) that
takes the root's signature, takes itself out of torch's global dict (the root's inner
modules then take torch's hook-free path), gives the root a post-hook and switches
autocast off; the post-hook undoes both.  No checks of ampcore's, no stack, no plan: what
auto would cost if each of its parts were free but the hooks.

Parts timed cold (inside a step) cost several times what the same code costs in a
tight loop (``bench_auto.py --region-cost``): every object a part reads was evicted by
the step's other work.

Usage::

    python benchmarks/bench_auto_call_parts.py [--width 256] [--train] [--rounds 15]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

PARTS = (
    ("made", "the region object made (memo)"),
    ("__enter__", "ampcore.autocast.__enter__"),
    ("region_entered", "  of which auto's region_entered"),
    ("_sentinel", "the root's sentinel (pre-hook)"),
    ("signature", "  of which the signature"),
    ("unchanged", "  of which the tree and weight check"),
    ("_set_autocast", "the autocast switch (sentinel and post-hook)"),
    ("_root_post", "the root's post-hook"),
    ("__exit__", "ampcore.autocast.__exit__"),
    ("region_exited", "  of which auto's region_exited"),
)


@contextlib.contextmanager
def _timed(times: dict[str, float]) -> Iterator[None]:
    """Wrap each part in a timer adding to ``times`` (undone on exit)."""
    import ampcore
    from ampcore._auto import _roots

    clock = time.perf_counter
    undo: list[Callable[[], None]] = []

    def wrap(owner: Any, name: str, key: str) -> None:
        real = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return real(*args, **kwargs)
            finally:
                times[key] += clock() - start

        setattr(owner, name, timed)
        undo.append(lambda: setattr(owner, name, real))

    for name in ("region_entered", "region_exited", "_sentinel", "_root_post"):
        wrap(_roots, name, name)
    for name in ("signature", "unchanged", "_set_autocast"):
        wrap(_roots, name, name)
    wrap(ampcore.autocast, "__enter__", "__enter__")
    wrap(ampcore.autocast, "__exit__", "__exit__")
    try:
        yield
    finally:
        for step in reversed(undo):
            step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--train", action="store_true", help="training steps (backward, grads cleared)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200, help="steps of each mode per round")
    args = parser.parse_args()
    import os

    os.environ["AMPCORE_AUTO_CACHE"] = tempfile.mkdtemp()  # measure here, never the user's cache
    import torch
    from torch import nn

    import ampcore

    warnings.filterwarnings("ignore", category=ampcore.AmpcoreWarning)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    d = args.width
    model = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
    model.train(args.train)
    x = torch.randn(64, d)
    grad = torch.enable_grad() if args.train else torch.no_grad()
    clock = time.perf_counter
    guard = _GuardFloor(model)

    def step(mode: str, times: dict[str, float]) -> None:
        start = clock()
        with grad:
            if mode == "auto":
                made = clock()
                region = ampcore.autocast("cpu", level="auto")
                times["made"] += clock() - made
                with region:
                    out = model(x)
            elif mode == "torch":  # the floor of any region: torch's own, made per step, off
                with torch.autocast("cpu", enabled=False):
                    out = model(x)
            elif mode == "guard":  # the floor of a guarded region (see the module's docstring)
                with torch.autocast("cpu", dtype=torch.bfloat16), guard:
                    out = model(x)
            else:
                out = model(x)
        if args.train:
            out.float().mean().backward()
            for p in model.parameters():
                p.grad = None
        times["step"] += clock() - start

    modes = ("fp32", "torch", "guard", "auto")
    for _ in range(300):  # auto measures and settles
        for mode in modes:
            step(mode, defaultdict(float))
    rounds: dict[str, list[float]] = defaultdict(list)
    for r in range(args.rounds):
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            times: dict[str, float] = defaultdict(float)
            with _timed(times) if mode == "auto" else contextlib.nullcontext():
                for _ in range(args.steps):
                    step(mode, times)
            for key, total in times.items():
                rounds[key if mode == "auto" else f"{mode} step"].append(total / args.steps * 1e6)
    median = {key: statistics.median(values) for key, values in rounds.items()}
    kind = "training" if args.train else "inference (no_grad, eval)"
    print(f"{kind} steps, 3 x Linear({d}) on a batch of 64, 1 thread, medians of {args.rounds} rounds, us per step")
    print(f"{'part':<48} {'us':>7}")
    for key, label in PARTS:
        print(f"{label:<48} {median.get(key, 0.0):7.1f}")
    fp32, auto, off, floor = median["fp32 step"], median["step"], median["torch step"], median["guard step"]
    print(f"{'float32 step (no region)':<48} {fp32:7.1f}")
    rows = (
        ("torch.autocast(enabled=False) made per step", off),
        ("guard floor (torch.autocast and the hooks alone)", floor),
        ("auto step (timers included)", auto),
    )
    for label, t in rows:
        print(f"{label:<48} {t:7.1f}  ({t / fp32:.3f} x float32, +{t - fp32:.1f} us)")


class _GuardFloor:
    """The hooks of a guarded region and nothing else (see the module's docstring), for a
    region around calls of ``root``."""

    def __init__(self, root: Any) -> None:
        import torch

        self.root, self.hooks, self.set_autocast = (
            root,
            torch.nn.modules.module._global_forward_pre_hooks,
            torch.set_autocast_enabled,
        )
        self.key, self.post_key = object(), object()
        self.grad_enabled = torch.is_grad_enabled

    def pre(self, module: Any, args: tuple[Any, ...], kwargs: Any = None) -> None:
        self.hooks.pop(self.key, None)
        module._forward_hooks[self.post_key] = self.post
        module._forward_hooks_always_called[self.post_key] = True
        (self.grad_enabled(), *((a.shape, a.dtype, a.device) for a in args))  # the signature
        self.set_autocast("cpu", False)

    def post(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        module._forward_hooks.pop(self.post_key, None)
        module._forward_hooks_always_called.pop(self.post_key, None)
        self.set_autocast("cpu", True)
        self.hooks[self.key] = self.pre

    def __enter__(self) -> None:
        self.root._forward_pre_hooks_with_kwargs[self.key] = True
        self.hooks[self.key] = self.pre

    def __exit__(self, *exc: Any) -> None:
        self.hooks.pop(self.key, None)
        self.root._forward_pre_hooks_with_kwargs.pop(self.key, None)


if __name__ == "__main__":
    main()
