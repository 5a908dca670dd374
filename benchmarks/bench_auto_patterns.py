"""level="auto" in usage patterns the other benchmarks never use (issue 27, helper autoroles).

``bench_auto.py`` runs one model, one training step per region.  Here each *pattern* is a
training (or inference) step with its own region structure, run under three modes, each on
its own copy of the modules from the same initial weights and on the same data:

* ``fp32``: no region; ``torch.autocast``: its region where auto's is; ``auto``:
  ``ampcore.autocast(level="auto")``, a region object made per step as user code does
  (``--reuse``: one object for every step, as ``bench_auto.py``), measuring in this process
  (an empty disk cache).

Patterns:

* ``seqlen``: a 4-layer MLP (d 128) on a sequence of 1-256 tokens, a new length every step
  (as many lengths as a root keeps programs for: 256); ``seqlen-long``: 1-1024 tokens (more);
* ``gan``: G and D (3-layer MLPs, d 256, batch 32) in one region, D called three times;
* ``micro``: a model called on two micro-batches of 32 and 9 in one region;
* ``eval-tail``: an inference loop (``eval()``, ``no_grad``) over batches 64, 64, 64, 17;
* ``ensemble``: 20 small models, a region each, at one place in the code (more roots than
  a place keeps: 16);
* ``model-loss``: a model and an ``nn.CrossEntropyLoss`` module in one region;
* ``dtype-switch``: a 3-layer MLP (d 256, batch 64) whose region alternates bfloat16 and
  float16 from one step to the next (at one place in the code; each dtype has its plan);
* ``fast-weights``: a 3-layer MLP (d 128, batch 32) called through
  ``torch.func.functional_call`` with new parameters every step (meta-learning's fast
  weights: each step's are the model's own times a step factor);
* ``generate`` (not in the default list: needs ``transformers``): a tiny GPT-2 (d 64, 2
  layers, vocabulary 256) decoding 8 tokens greedily with its KV cache from 2 prompts of 8
  tokens, ``generate()`` inside the region (issue 27, fourth sweep);
* ``plain-12``, ``pre-hook``, ``gather`` (not in the default list; issue 27, roots with
  pre-hooks of their own): 12 x ``Linear(256)``, batch 64, training; plain, with a no-op
  forward pre-hook on the root, and with a pre-hook / post-hook pair on the root that puts
  each layer's parameters in place for the forward and an empty placeholder back after it
  (FSDP2 / ZeRO-3 in pure torch).  Every mode runs the same hooks.

``--floors`` (issue 27, fifteenth stop) adds two modes that are not auto, to show what any
region could reach on a pattern: ``off``, ``torch.autocast(enabled=False)`` made where auto's
region is (the floor of any region object), and ``guard``, ``torch.autocast`` with only the
hooks a guarded region cannot drop (``bench_auto_call_parts.py``'s guard floor: a global
pre-hook that takes the root's signature and goes out for its forward, a post-hook that puts
it back, autocast off for the root); each printed over the better fixed mode as auto is.
``--parts`` then times auto's parts inside its steps (``bench_auto_call_parts.py``'s
timers: the region's construction is not one, the timers add to the parts).

After ``--warmup`` steps of every mode (auto measures and records), ``--rounds`` rounds
each run ``--steps`` steps of every mode in orders that balance which mode runs before which
(``bench_auto.orders``, across the rounds' boundaries too);
the figure is the median over rounds of auto's time over the better fixed mode's time in
that round, with the recordings auto made during the timed rounds (``recorded``: must be 0
for a settled pattern).  One thread, process CPU time (``--threads N``: torch's intra-op
threads, timed by the wall clock: the process's CPU time would count the workers' spinning).

    python benchmarks/bench_auto_patterns.py --patterns seqlen gan --rounds 7
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any, Final

from bench_auto import orders
from bench_auto_call_parts import PARTS, _timed

MODES: Final = ("fp32", "torch.autocast", "auto")
FLOORS: Final = ("off", "guard")  # --floors
PATTERNS: Final = (
    "seqlen", "seqlen-long", "gan", "micro", "eval-tail", "ensemble", "model-loss", "dtype-switch", "fast-weights",
)  # fmt: skip
Step = Callable[[list[Any], Callable[..., Any], int], None]
HOOKED: Final = ("plain-12", "pre-hook", "gather")


def _mlp(torch: Any, d: int, layers: int, out: int | None = None) -> Any:
    nn = torch.nn
    parts: list[Any] = []
    for i in range(layers):
        parts += [nn.Linear(d, out if out is not None and i == layers - 1 else d), nn.ReLU()]
    return nn.Sequential(*parts[:-1])


def patterns(torch: Any) -> dict[str, tuple[Callable[[], list[Any]], Step]]:
    """Each pattern: a function making its modules, and its step ``step(modules, region, i)``."""
    nn = torch.nn
    rnd = random.Random(0)
    lengths = [rnd.randint(1, 256) for _ in range(4096)]
    longer = [rnd.randint(1, 1024) for _ in range(4096)]

    def seqlen(ms: list[Any], region: Callable[[], Any], i: int, lengths: list[int] = lengths) -> None:
        with region():
            out = ms[0](torch.randn(lengths[i % len(lengths)], 128))
        out.float().pow(2).mean().backward()

    def gan(ms: list[Any], region: Callable[[], Any], i: int) -> None:
        g, d = ms
        with region():
            fake = g(torch.randn(32, 64))
            loss = d(fake.detach()).float().mean() - d(torch.randn(32, 256)).float().mean() - d(fake).float().mean()
        loss.backward()

    def micro(ms: list[Any], region: Callable[[], Any], i: int) -> None:
        with region():
            loss = ms[0](torch.randn(32, 256)).float().mean() + ms[0](torch.randn(9, 256)).float().mean()
        loss.backward()

    def eval_tail(ms: list[Any], region: Callable[[], Any], i: int) -> None:
        ms[0].eval()
        with torch.no_grad(), region():
            ms[0](torch.randn((64, 64, 64, 17)[i % 4], 256))

    def ensemble(ms: list[Any], region: Callable[[], Any], i: int) -> None:
        for m in ms:
            with region():
                out = m(torch.randn(8, 64))
            out.float().mean().backward()

    def model_loss(ms: list[Any], region: Callable[[], Any], i: int) -> None:
        n = (64, 64, 23)[i % 3]
        with region():
            loss = ms[1](ms[0](torch.randn(n, 256)), torch.randint(0, 16, (n,)))
        loss.backward()

    def dtype_switch(ms: list[Any], region: Callable[..., Any], i: int) -> None:
        with region((torch.bfloat16, torch.float16)[i % 2]):
            out = ms[0](torch.randn(64, 256))
        out.float().pow(2).mean().backward()

    def generate(ms: list[Any], region: Callable[[], Any], i: int) -> None:
        ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(i))
        with region():
            ms[0].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=0)

    def fast_weights(ms: list[Any], region: Callable[[], Any], i: int) -> None:
        params = {n: (p * (1 + (i % 7) / 64)).detach().requires_grad_() for n, p in ms[0].named_parameters()}
        with region():
            out = torch.func.functional_call(ms[0], params, (torch.randn(32, 128),))
        out.float().pow(2).mean().backward()

    def train12(ms: list[Any], region: Callable[[], Any], i: int) -> None:
        with region():
            out = ms[0](torch.randn(64, 256))
        out.float().pow(2).mean().backward()

    return {
        "plain-12": (lambda: [_mlp(torch, 256, 12)], train12),
        "pre-hook": (lambda: [_hooked(torch, _mlp(torch, 256, 12), gather=False)], train12),
        "gather": (lambda: [_hooked(torch, _mlp(torch, 256, 12), gather=True)], train12),
        "fast-weights": (lambda: [_mlp(torch, 128, 3)], fast_weights),
        "generate": (lambda: [_gpt2(torch)], generate),
        "seqlen": (lambda: [_mlp(torch, 128, 4)], seqlen),
        "seqlen-long": (lambda: [_mlp(torch, 128, 4)], lambda ms, region, i: seqlen(ms, region, i, longer)),
        "gan": (lambda: [_gan_g(torch), _mlp(torch, 256, 3, out=1)], gan),
        "micro": (lambda: [_mlp(torch, 256, 3)], micro),
        "eval-tail": (lambda: [_mlp(torch, 256, 3)], eval_tail),
        "ensemble": (lambda: [_mlp(torch, 64, 2) for _ in range(20)], ensemble),
        "model-loss": (lambda: [_mlp(torch, 256, 3, out=16), nn.CrossEntropyLoss()], model_loss),
        "dtype-switch": (lambda: [_mlp(torch, 256, 3)], dtype_switch),
    }


class _Guard:
    """``--floors``' ``guard`` region, made per step: ``torch.autocast`` and only the hooks of a
    guarded region (``bench_auto_call_parts.py``'s guard floor), for any root called in it: a
    global pre-hook that takes the call's signature, goes out of torch's dict for the root's
    forward (its modules take torch's hook-free path), gives the root a post-hook and turns
    autocast off; the post-hook undoes all three.  No check of auto's: a floor, not a region."""

    def __init__(self, torch: Any, dtype: Any) -> None:
        self.region = torch.autocast("cpu", dtype=dtype)
        self.hooks = torch.nn.modules.module._global_forward_pre_hooks
        self.set_autocast, self.grad_enabled = torch.set_autocast_enabled, torch.is_grad_enabled

    def __enter__(self) -> None:
        self.region.__enter__()
        self.hooks[self] = self.pre

    def __exit__(self, *exc: Any) -> None:
        self.hooks.pop(self, None)
        self.region.__exit__(*exc)

    def pre(self, module: Any, args: tuple[Any, ...]) -> None:
        self.hooks.pop(self, None)
        module._forward_hooks[self] = self.post
        module._forward_hooks_always_called[self] = True
        (self.grad_enabled(), *((a.shape, a.dtype, a.device) for a in args))  # the signature
        self.set_autocast("cpu", False)

    def post(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        module._forward_hooks.pop(self, None)
        module._forward_hooks_always_called.pop(self, None)
        self.set_autocast("cpu", True)
        self.hooks[self] = self.pre


def _noop(module: Any, args: tuple[Any, ...]) -> None:
    return None


def _gather(module: Any, args: tuple[Any, ...]) -> None:
    for owner, name, full, _ in module.slots:
        owner._parameters[name] = full


def _reshard(module: Any, args: tuple[Any, ...], out: Any) -> None:
    for owner, name, _, shard in module.slots:
        owner._parameters[name] = shard


def _hooked(torch: Any, model: Any, gather: bool) -> Any:
    """``model`` with a no-op pre-hook, or (``gather``) the FSDP2-like pair: the full
    parameters in place for the forward (gradients accumulate there), placeholders between."""
    if not gather:
        model.register_forward_pre_hook(_noop)
        return model
    model.slots = []
    for owner in model.modules():
        for name, p in list(owner._parameters.items()):
            model.slots.append((owner, name, p, torch.nn.Parameter(torch.empty(0))))
            owner._parameters[name] = model.slots[-1][3]
    model.full = [s[2] for s in model.slots]  # (the optimizer's parameters)
    model.register_forward_pre_hook(_gather)
    model.register_forward_hook(_reshard, always_call=True)
    return model


def _gpt2(torch: Any) -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    cfg.bos_token_id = cfg.eos_token_id = None  # (never stops early: 8 tokens every step)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _gan_g(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))


def run(name: str, args: argparse.Namespace) -> None:
    import torch

    import ampcore
    from ampcore._auto import _roots

    warnings.filterwarnings("ignore", category=ampcore.AmpcoreWarning)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    make, step = patterns(torch)[name]
    base = make()
    modes = MODES + FLOORS * args.floors
    copies = {mode: copy.deepcopy(base) for mode in modes}

    def auto(dtype: Any = None) -> Any:  # as the other patterns' user code: no dtype unless switched
        return (
            ampcore.autocast("cpu", level="auto")
            if dtype is None
            else ampcore.autocast("cpu", level="auto", dtype=dtype)
        )

    ones = {d: auto(d) for d in (None, torch.bfloat16, torch.float16)}
    regions: dict[str, Callable[..., Any]] = {  # (a region in a dtype: the default unless given)
        "fp32": lambda dtype=None: contextlib.nullcontext(),
        "torch.autocast": lambda dtype=None: torch.autocast("cpu", dtype=dtype or torch.bfloat16),
        "auto": (lambda dtype=None: ones[dtype]) if args.reuse else auto,
        "off": lambda dtype=None: torch.autocast("cpu", enabled=False),
        "guard": lambda dtype=None: _Guard(torch, dtype or torch.bfloat16),
    }
    recorded = [0, 0]  # recordings; root calls applied call by call (unrecorded)
    real = _roots.Recording

    def counted(*a: Any) -> Any:
        rec = real(*a)
        recorded[rec.mode is None] += 1
        return rec

    _roots.Recording = counted  # type: ignore[misc]  # a benchmark's counter
    counters = dict.fromkeys(modes, 0)

    clock = time.process_time if args.threads == 1 else time.perf_counter  # (idle workers spin)

    def steps(mode: str, n: int) -> float:
        start = clock()
        for _ in range(n):
            step(copies[mode], regions[mode], counters[mode])
            counters[mode] += 1
            for m in copies[mode]:
                for p in m.__dict__.get("full", m.parameters()):
                    p.grad = None
        return clock() - start

    for mode in modes:
        steps(mode, args.warmup)
    recorded[:] = [0, 0]
    ratios: dict[str, list[float]] = {mode: [] for mode in ("auto", *FLOORS[: len(modes) - len(MODES)])}
    totals = {mode: 0.0 for mode in modes}
    rows = orders(modes)
    for r in range(args.rounds):
        took = {mode: steps(mode, args.steps) for mode in rows[r % len(rows)]}
        for mode, t in took.items():
            totals[mode] += t
        for mode, each in ratios.items():
            each.append(took[mode] / min(took["fp32"], took["torch.autocast"]))
    per = {mode: totals[mode] / (args.rounds * args.steps) * 1e3 for mode in modes}
    print(
        f"{name:<11} "
        + "  ".join(
            f"{mode}/min {statistics.median(each):.3f} (rounds {min(each):.3f}-{max(each):.3f})"
            for mode, each in ratios.items()
        )
        + "  "
        + "  ".join(f"{mode} {ms:.3f} ms" for mode, ms in per.items())
        + f"  recorded {recorded[0]}, call by call {recorded[1]} in {args.rounds * args.steps} auto steps"
        + (f", {args.threads} threads" if args.threads != 1 else "")
    )
    if args.parts:  # auto's parts inside its steps, timed apart (the timers add to the step)
        times: dict[str, float] = collections.defaultdict(float)
        steps_n = args.rounds * args.steps
        with _timed(times):
            steps("auto", steps_n)
        print(
            f"{name:<11} auto's parts, us per step: "
            + ", ".join(f"{key} {times[key] / steps_n * 1e6:.1f}" for key, _ in PARTS if key in times)
        )
    if args.tables:
        print(ampcore.debugging.auto_plan_table("cpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40, help="steps of each mode per round")
    parser.add_argument("--warmup", type=int, default=300, help="steps of each mode before timing")
    parser.add_argument("--tables", action="store_true", help="print auto's plan table after each pattern")
    parser.add_argument("--floors", action="store_true", help="also time the floors: torch's region off, the guard")
    parser.add_argument("--parts", action="store_true", help="then time auto's parts inside its steps (timers on)")
    parser.add_argument("--reuse", action="store_true", help="one auto region object for every step (as bench_auto.py)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1; more: timed by the wall clock)"
    )
    parser.add_argument(
        "--load", type=float, help="the device load auto is told (default: the adapter's; 0: a quiet machine's)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.load is not None:  # (measurements busy by the load are provisional: docs/auto.md)
            from ampcore._auto import _hooks

            _hooks.load_of = lambda region: args.load
        run(args.child, args)
        return
    for name in args.patterns:  # a process each, with an empty cache: auto measures in it
        if os.path.exists("/proc/loadavg"):
            print(f"load {' '.join(open('/proc/loadavg').read().split()[:3])}", flush=True)
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "AMPCORE_AUTO_CACHE": cache}
            argv = [sys.executable, __file__, "--child", name, "--rounds", str(args.rounds)]
            argv += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
            argv += ["--tables"] * args.tables + ["--reuse"] * args.reuse
            argv += ["--floors"] * args.floors + ["--parts"] * args.parts
            argv += [] if args.load is None else ["--load", str(args.load)]
            subprocess.run(argv, env=env, check=True)


if __name__ == "__main__":
    main()
