"""O2's master-weight update against O1 and the pure low-precision loop (issue 31's table).

Every row is a ratio of medians measured in one process, interleaved (one training step of
every mode per round, in an order that rotates per round): forward, MSE loss in float32,
backward, ``optimizer.step()``, ``zero_grad``.  Modes, each with its own model from the same
initial weights and its own optimizer:

* ``O2``: ``ampcore.decorate`` + ``ampcore.autocast(level="O2")`` (fp32 master weights);
* ``O1``: float32 parameters + ``ampcore.autocast(level="O1")`` (torch.autocast's lists);
* ``pure``: the model in the low-precision dtype, the optimizer on it (the limit).

Like with like: every mode of a row has the same optimizer *and flavour* (``--flavours``:
``default``, torch's choice for the device, for-loop on the CPU and foreach on CUDA;
``foreach``; ``fused``; ``--quick`` runs foreach and fused).  For fused Adam/AdamW an extra
O2 mode runs ampcore's Triton kernel (``--kernels torch triton``; by default wherever
Triton drives the device; a kernel that fails costs its own rows only), and for every
flavour one the one-pass CPU kernel (``onepass``: ``ampcore/_o2/onepass.py`` for fused,
``onepass_loop.py`` for the for-loop and foreach flavours; by default where the backend
offers it; the ``torch`` rows then run torch's optimizer with separate widening and
refresh passes, what O2 did before it).  The last column
counts the kernels one ``optimizer.step()`` launches in each mode (torch.profiler's device
events; on the CPU the aten ops dispatched, a proxy).

``--chunks`` compares ways of walking the parameters in O2's update (one O2 mode each: a
number of elements per chunk, 0 for whole tensors, -1 (the default) for what users get, the
backend's ``BackendSpec.master_update_chunk_elements``: on the CPU chunks or whole tensors,
whichever times faster, ``ampcore/_o2/update_walk.py``).

Sizes: on the CPU 7 x ``Linear(1664)``, batch 416, bfloat16; elsewhere the seed network
9 x ``Linear(8192)``, batch 2048, the backend's default dtype (float16 on CUDA).

``--busy`` adds the contention rows: a sibling process spinning (``while True: pass``, as
a data-loader worker would be) is paused with SIGSTOP and resumed with SIGCONT per round,
so quiet and busy steps interleave in the same run.  ``--memory``: peak memory of a few SGD
steps, O2 / float32 training (the device's allocator; on the CPU the resident set's
high-water mark, glibc told to return freed blocks; both modes warmed up on a small model
first, and measured before the timed rows).  ``--check``: whether O2's masters (and the
optimizer's states) equal torch's optimizer of the same flavour on float32 masters fed the
same gradients upcast, bit for bit, after 3 steps (on the device's own kernels), per state
tensor; for the Triton kernel with each formula it knows; then (``o2_kernel_check.py``) on
a device torch's fused kernel against its transcriptions and the Triton kernel, per state
tensor, plainly and under GradScaler's tensors, and O2 + fused AdamW under a GradScaler
(an overflowing step) against torch's on float32 masters, with each kernel.

    python benchmarks/bench_o2_update.py                            # CPU rows, AdamW and SGD
    python benchmarks/bench_o2_update.py --optimizers adamw --busy --rounds 9
    python benchmarks/bench_o2_update.py --chunks -1 262144 0 --busy     # chunks against whole tensors
    python benchmarks/bench_o2_update.py --device cuda --quick --memory --check   # at most ~1 minute

``--budget S`` (``--quick``: 50): after S seconds what is left is skipped, and said so (the
GPU check kills the row at 75 s, and a killed run may lose its output); the checks run
before the timed rows, so that a run cut short keeps them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import functools
import gc
import os
import signal
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ampcore
from ampcore._backends.memory import memory_in_use, peak_memory, reset_peak_memory, synchronize
from ampcore._o2.master import master_weights_of
from ampcore._o2.master_kernel import triton_unavailable
from ampcore._o2.update_walk import UpdateWalk

OPTIMIZERS: Final[dict[str, Callable[..., torch.optim.Optimizer]]] = {
    "adamw": lambda p, **kw: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.01, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, lr=1e-4, **kw),
    "sgd": lambda p, **kw: torch.optim.SGD(p, lr=1e-4, **kw),
    "sgd-momentum": lambda p, **kw: torch.optim.SGD(p, lr=1e-4, momentum=0.9, **kw),
}
#: the optimizer flavours (every mode of a row gets the same): torch's default for the
#: device (for-loop on the CPU, foreach on CUDA), foreach, fused
FLAVOURS: Final[dict[str, dict[str, bool]]] = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}
#: the optimizers whose fused flavour ampcore's Triton kernel can run (``--kernels triton``)
TRITON_KINDS: Final = ("adamw", "adam")
BASELINES: Final = ("O1", "pure")
#: the issue's targets: O2 / O1, O2 / pure
TARGETS: Final = (0.90, 1.15)


def network(width: int, layers: int, device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width, device=device) for _ in range(layers)))


class Mode:
    """One mode's private model and optimizer (see the module docstring): ``step()`` is one
    training step, ``update_launches()`` counts the kernels of one ``optimizer.step()``."""

    def __init__(
        self,
        base: nn.Module,
        kind: str,
        flavour: str,
        mode: str,
        backend: ampcore.Backend,
        data: tuple[torch.Tensor, torch.Tensor, torch.dtype],
        chunk: int | None = None,
        kernel: str = "torch",
    ) -> None:
        """``mode``: O2, O1 or pure; for O2, ``chunk`` elements per chunk of the master update
        (0: whole tensors; None: the backend's choice) and the update ``kernel``."""
        x, self.y, low = data
        self.model = copy.deepcopy(base)
        self.region: Callable[[], Any] = contextlib.nullcontext
        self.inputs = x
        self.backend = backend
        if mode == "pure":
            self.model.to(low)
            self.inputs = x.to(low)
        self.opt = OPTIMIZERS[kind](self.model.parameters(), **FLAVOURS[flavour])
        if mode.startswith("O2"):
            self.model, self.opt = ampcore.decorate(self.model, self.opt, level="O2", device=backend.name, dtype=low)
            self.region = lambda: ampcore.autocast(device=backend.name, level="O2", dtype=low)
            ampcore.set_master_update_kernel(self.opt, "torch" if kernel == "onepass" else kernel)  # type: ignore[arg-type]
            weights = master_weights_of(self.opt)
            if weights is not None:  # the one-pass CPU kernel only in its own rows
                weights.onepass = kernel == "onepass"
            if chunk is not None and weights is not None:
                weights.walk = UpdateWalk(chunk or None, adaptive=False)
        elif mode == "O1":
            self.region = lambda: ampcore.autocast(device=backend.name, level="O1", dtype=low)

    def backward(self) -> None:
        with self.region():
            out = self.model(self.inputs)
        nn.functional.mse_loss(out.float(), self.y).backward()

    def step(self) -> None:
        self.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def update_launches(self) -> str:
        """Kernels launched by one ``optimizer.step()`` (the device's, seen by torch.profiler),
        or on the CPU the aten ops it dispatches (``ops``)."""
        self.backward()
        synchronize(self.backend)
        if self.backend.device_type == "cpu":
            with _CountOps() as counter:
                self.opt.step()
            found = f"{counter.count} ops"
        else:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                self.opt.step()
                synchronize(self.backend)
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            found = str(len(kernels))
        self.opt.zero_grad(set_to_none=True)
        return found


class _CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched (the CPU's proxy for kernel launches)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += func.overloadpacket.__name__ not in ("empty", "empty_like", "detach", "view", "alias")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def sibling(busy: bool) -> Iterator[Callable[[bool], None]]:
    """A spinning sibling process (stopped while quiet); yields ``set_busy(flag)``."""
    if not busy:
        yield lambda flag: None
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield lambda flag: os.kill(proc.pid, signal.SIGCONT if flag else signal.SIGSTOP)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait()


def measure(
    steps: dict[str, Mode],
    rounds: int,
    warmup: int,
    backend: ampcore.Backend,
    set_busy: Callable[[bool], None],
    busy: bool,
) -> dict[tuple[str, bool], float]:
    """Median ms per step of each (mode, busy), interleaved, after ``warmup`` rounds."""
    names = list(steps)
    conditions = (False, True) if busy else (False,)
    times: dict[tuple[str, bool], list[float]] = {(n, c): [] for n in names for c in conditions}
    for r in range(rounds + warmup):
        for condition in conditions:
            set_busy(condition)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                synchronize(backend)
                start = time.perf_counter()
                steps[name].step()
                synchronize(backend)
                if r >= warmup:
                    times[name, condition].append((time.perf_counter() - start) * 1e3)
    set_busy(False)
    return {key: statistics.median(values) for key, values in times.items()}


def o2_modes(
    args: argparse.Namespace, backend: ampcore.Backend, kind: str, flavour: str
) -> dict[str, tuple[int | None, str]]:
    """O2 mode name -> its chunk setting for :class:`Mode` (-1 or no ``--chunks``: the
    backend's own walk, None) and its update kernel (triton: fused Adam/AdamW only)."""
    own = backend.master_update_chunk_elements
    default = "whole tensors" if own is None else f"{own}-element chunks or whole, timed"
    names = {0: "whole tensors", -1: default}
    modes: dict[str, tuple[int | None, str]] = {}
    for kernel in args.kernels:
        if kernel == "triton" and (flavour != "fused" or kind not in TRITON_KINDS):
            continue
        for c in args.chunks or [-1]:
            suffix = "" if kernel == "torch" else f", {kernel} kernel"
            modes[f"O2 ({names.get(c, f'{c}-element chunks')}{suffix})"] = (None if c == -1 else c, kernel)
    return modes


def out_of_time(args: argparse.Namespace, what: str) -> bool:
    """Whether ``--budget`` seconds have passed (then ``what`` is skipped, and said so):
    a run cut short keeps what it printed, one killed by its caller's timeout may not."""
    if args.deadline is None or time.perf_counter() < args.deadline:
        return False
    print(f"(skipped, the time budget of {args.budget:.0f} s is spent: {what})", flush=True)
    return True


def time_rows(args: argparse.Namespace, backend: ampcore.Backend, low: torch.dtype) -> None:
    """One table row per (optimizer, flavour, condition, O2 mode); every mode of a row has
    the same optimizer configuration.  ``launches``: kernels per ``optimizer.step()`` (O2 /
    O1 / pure; on the CPU the aten ops dispatched)."""
    print(
        "| optimizer | flavour | condition | O2 update | O2 ms | O1 ms | pure ms | O2 / O1 (<= 0.90) "
        "| O2 / pure (<= 1.15) | launches O2 / O1 / pure |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|")
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(args.batch, args.width, generator=gen).to(args.device)
    y = torch.rand(args.batch, args.width, generator=gen).to(args.device)
    with sibling(args.busy) as set_busy:
        for kind in args.optimizers:
            for flavour in args.flavours:
                if out_of_time(args, f"the {kind} ({flavour}) rows"):
                    continue
                variants = o2_modes(args, backend, kind, flavour)
                base = network(args.width, args.layers, args.device)
                data = (x, y, low)
                steps = {mode: Mode(base, kind, flavour, mode, backend, data) for mode in BASELINES}
                for m, (c, k) in list(variants.items()):
                    mode_or_error = _tried(functools.partial(_stepped, base, kind, flavour, m, backend, data, c, k), k)
                    if isinstance(mode_or_error, str):
                        print(f"| {kind} | {flavour} | - | {m[4:-1]} | failed: {mode_or_error} | | | | | |")
                        del variants[m]
                    else:
                        steps[m] = mode_or_error
                del base
                medians = measure(steps, args.rounds, args.warmup, backend, set_busy, args.busy)
                launches = {mode: step.update_launches() for mode, step in steps.items()}
                del steps
                gc.collect()  # (an O2 optimizer and its master weights refer to each other)
                for condition in (False, True) if args.busy else (False,):
                    o1, pure = (medians[mode, condition] for mode in BASELINES)
                    label = "one busy sibling" if condition else "quiet"
                    for mode in variants:
                        o2 = medians[mode, condition]
                        counts = " / ".join(launches[m] for m in (mode, *BASELINES))
                        print(
                            f"| {kind} | {flavour} | {label} | {mode[4:-1]} | {o2:.1f} | {o1:.1f} | {pure:.1f} "
                            f"| {o2 / o1:.3f} | {o2 / pure:.3f} | {counts} |"
                        )
                sys.stdout.flush()


T = TypeVar("T")


def _stepped(*args: Any) -> Mode:
    """A :class:`Mode` that has run one training step (a kernel that fails, fails here)."""
    mode = Mode(*args)
    mode.step()
    return mode


def _tried(make: Callable[[], T], kernel: str) -> T | str:
    """``make()``; for the optional Triton kernel, an exception becomes its message (one
    failed row, not a lost run); torch's kernels raise."""
    if kernel == "torch":
        return make()
    try:
        return make()
    except Exception as exc:  # a Triton or driver version this kernel was not run on
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def memory_row(args: argparse.Namespace, backend: ampcore.Backend, low: torch.dtype) -> None:
    """Peak memory of 3 SGD steps (the first of ``--flavours``), O2 / float32 training (fresh
    models, one after the other, after both ran once on a small model: one-time costs such
    as the CPU's thread pools and the allocator's first blocks are paid before either is
    measured)."""
    _return_freed_memory()
    for mode in ("fp32", "O2"):
        _sgd_steps(args, backend, low, mode, 64)
    peaks: dict[str, int | None] = {}
    for mode in ("fp32", "O2"):
        gc.collect()
        synchronize(backend)
        before = memory_in_use(backend)
        reset_peak_memory(backend)
        _sgd_steps(args, backend, low, mode, args.width)
        peak = peak_memory(backend)
        peaks[mode] = None if peak is None or before is None else peak - before
    fp32, o2 = peaks["fp32"], peaks["O2"]
    if fp32 is None or o2 is None:
        print("peak memory: the backend cannot tell")
        return
    gib = 1 << 30
    print(
        f"peak memory growth of building the model and 3 SGD steps: fp32 {fp32 / gib:.3f} GiB, "
        f"O2 {o2 / gib:.3f} GiB, O2 / fp32 {o2 / fp32:.3f} (target <= 0.75)"
    )


def _sgd_steps(args: argparse.Namespace, backend: ampcore.Backend, low: torch.dtype, mode: str, width: int) -> None:
    """Build ``args.layers`` x Linear(width) and train it 3 SGD steps, float32 or O2."""
    x = torch.rand(args.batch, width, device=args.device)
    y = torch.rand(args.batch, width, device=args.device)
    model = network(width, args.layers, args.device)
    opt: torch.optim.Optimizer = OPTIMIZERS["sgd"](model.parameters(), **FLAVOURS[args.flavours[0]])
    region: Callable[[], Any] = contextlib.nullcontext
    if mode == "O2":
        model, opt = ampcore.decorate(model, opt, level="O2", device=backend.name, dtype=low)
        region = lambda: ampcore.autocast(device=backend.name, level="O2", dtype=low)  # noqa: E731
    for _ in range(3):
        with region():
            out = model(x)
        nn.functional.mse_loss(out.float(), y).backward()
        del out
        opt.step()
        opt.zero_grad(set_to_none=True)
    synchronize(backend)


def _return_freed_memory() -> None:
    """glibc: serve blocks above 64 KiB by mmap, so freed tensors leave the resident set."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # M_MMAP_THRESHOLD


def check_rows(args: argparse.Namespace, backend: ampcore.Backend, low: torch.dtype) -> None:
    """Bit-identity of O2's masters (and Adam's moments) with torch's optimizer (same
    flavour) on float32 masters, 3 steps; per flavour, and for the Triton kernel on fused
    Adam/AdamW (with each formula of ``triton_adam.FORMULAS``); then, on a device, the
    kernel-level rows and the GradScaler rows of ``o2_kernel_check.py``."""
    print()
    _model_rows(args, backend, low)
    if out_of_time(args, "the kernel-level checks"):
        return
    import o2_kernel_check

    if args.device == "cpu":
        print("kernel-level rows: on a device only (torch's CPU fused Adam computes another formula)")
    else:
        o2_kernel_check.kernel_rows(args.device, "triton" in args.kernels)
    if "adamw" in args.optimizers and "fused" in args.flavours:
        o2_kernel_check.scaler_rows(args.device, low, [k for k in args.kernels if k != "onepass"])


def _model_rows(args: argparse.Namespace, backend: ampcore.Backend, low: torch.dtype) -> None:
    for kind in args.optimizers:
        for flavour in args.flavours:
            if out_of_time(args, f"the {kind} ({flavour}) checks"):
                continue
            variants: list[tuple[str, str, str | None]] = [("torch kernel", "torch", None)]
            if "triton" in args.kernels and flavour == "fused" and kind in TRITON_KINDS:
                variants.append(("triton kernel", "triton", None))
                variants.append(("triton kernel, formula double", "triton", "double"))
            if "onepass" in args.kernels:  # fused: onepass.py; for-loop and foreach: onepass_loop.py
                variants.append(("onepass kernel", "onepass", None))
            for label, kernel, variant in variants:
                with _formula(variant):
                    pairs = _tried(functools.partial(_three_steps, args, backend, low, kind, flavour, kernel), kernel)
                if isinstance(pairs, str):
                    print(f"{kind} {flavour}, {label}: failed: {pairs}")
                    continue
                print(
                    f"{kind} {flavour}, {label}: bit-identical to torch's {kind} ({flavour}) on fp32 masters: ", end=""
                )
                print(_verdict(pairs))


def _verdict(pairs: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]]) -> str:
    """ "yes", or per state which share of the elements differ."""
    if all(torch.equal(a, b) for got, want in pairs.values() for a, b in zip(got, want, strict=True)):
        return "yes"
    parts = []
    for name, (got, want) in pairs.items():
        differ = sum(int((a != b).sum()) for a, b in zip(got, want, strict=True))
        worst = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
        parts.append(f"{name} {differ} of {sum(a.numel() for a in got)} differ (largest by {worst:.3g})")
    return "NO: " + "; ".join(parts)


@contextlib.contextmanager
def _formula(formula: str | None) -> Iterator[None]:
    """The Triton kernel with another formula than its default (``triton_adam.FORMULAS``)."""
    if formula is None:
        yield
        return
    from ampcore._o2 import triton_adam

    launch = triton_adam.launch_adam
    triton_adam.launch_adam = functools.partial(launch, formula=formula)
    try:
        yield
    finally:
        triton_adam.launch_adam = launch


def _three_steps(
    args: argparse.Namespace, backend: ampcore.Backend, low: torch.dtype, kind: str, flavour: str, kernel: str
) -> dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """O2's masters (and optimizer states) after 3 steps, and torch's optimizer's on float32
    masters fed the same low-precision gradients upcast: name -> (O2's, torch's)."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(1031, 601, device=args.device), nn.Linear(601, 7, device=args.device))
    model = copy.deepcopy(base)
    opt = OPTIMIZERS[kind](model.parameters(), **FLAVOURS[flavour])
    model, opt = ampcore.decorate(model, opt, level="O2", device=backend.name, dtype=low)
    ampcore.set_master_update_kernel(opt, "torch" if kernel == "onepass" else kernel)  # type: ignore[arg-type]
    weights = master_weights_of(opt)
    if weights is not None:
        weights.onepass = kernel == "onepass"
    masters = [p.detach().clone().requires_grad_() for p in base.parameters()]
    ref = OPTIMIZERS[kind](masters, **FLAVOURS[flavour])
    lowm = ampcore.decorate(copy.deepcopy(base), level="O2", device=backend.name, dtype=low, master_weight=False)
    for step in range(3):
        x = torch.randn(16, 1031, generator=torch.Generator().manual_seed(step)).to(args.device)
        for net in (model, lowm):
            net.zero_grad()
            with ampcore.autocast(device=backend.name, level="O2", dtype=low):
                loss = net(x).float().pow(2).mean()
            loss.backward()
        opt.step()
        for master, param in zip(masters, lowm.parameters(), strict=True):
            master.grad = param.grad.float()
        ref.step()
        with torch.no_grad():
            for param, master in zip(lowm.parameters(), masters, strict=True):
                param.copy_(master)
    ours = [p for g in opt.param_groups for p in g["params"]]
    pairs = {"masters": ([p.detach() for p in ours], [m.detach() for m in masters])}
    for name in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
        if all(name in opt.state[p] and name in ref.state[m] for p, m in zip(ours, masters, strict=True)):
            pairs[name] = ([opt.state[p][name] for p in ours], [ref.state[m][name] for m in masters])
    return pairs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="an ampcore backend name (cpu, cuda, ...)")
    parser.add_argument("--optimizers", nargs="+", choices=tuple(OPTIMIZERS), default=None)
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds (default: 7, --quick 4)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--width", type=int, default=0)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--layers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument(
        "--flavours",
        nargs="+",
        choices=tuple(FLAVOURS),
        default=None,
        help="optimizer flavours (default: CPU default; --quick foreach fused)",
    )
    parser.add_argument(
        "--kernels",
        nargs="+",
        choices=("torch", "triton", "onepass"),
        default=None,
        help="O2 update kernels (default: torch, onepass where the backend offers it, triton where it can run)",
    )
    parser.add_argument("--chunks", type=int, nargs="+", default=None, help="O2 update chunks (0: whole tensors)")
    parser.add_argument("--busy", action="store_true", help="also rows with one busy sibling process")
    parser.add_argument("--memory", action="store_true", help="the peak-memory row (SGD)")
    parser.add_argument("--check", action="store_true", help="bit-identity with torch on fp32 masters")
    parser.add_argument("--quick", action="store_true", help="every optimizer, 4 rounds, 1 warm-up (GPU check)")
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--budget", type=float, default=0, help="seconds, then skip what is left (--quick: 50)")
    args = parser.parse_args()
    args.budget = args.budget or (50.0 if args.quick else 0.0)
    args.deadline = time.perf_counter() + args.budget if args.budget else None
    return args


def main() -> None:
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a killed run keeps its lines
    backend = ampcore.get_backend(args.device)
    backend.require_available()  # an unavailable device: its reason, not a torch error
    cpu = backend.device_type == "cpu"
    args.device = backend.device_type
    args.width = args.width or (1664 if cpu else 8192)
    args.batch = args.batch or (416 if cpu else 2048)
    args.layers = args.layers or (7 if cpu else 9)
    args.rounds = args.rounds or (4 if args.quick else 7)
    args.warmup = 1 if args.quick else args.warmup
    args.optimizers = args.optimizers or (list(OPTIMIZERS) if args.quick else ["adamw", "sgd"])
    args.flavours = args.flavours or (["foreach", "fused"] if args.quick else ["default"])
    args.kernels = args.kernels or ["torch"] + (["onepass"] if backend.master_update_onepass else []) + (
        ["triton"] if triton_unavailable(torch.device(args.device)) is None else []
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    warnings.simplefilter("ignore")  # bf16 runs emulated on CPUs without bf16 instructions
    low = backend.default_dtype
    name = backend.device_name(0) if backend.is_available else backend.name
    print(
        f"\n{args.layers} x Linear({args.width}), batch {args.batch}, {str(low).removeprefix('torch.')}, on {name}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.rounds} rounds, "
        f"load average {os.getloadavg()[0]:.2f}, master update chunk {backend.master_update_chunk_elements}, "
        f"O2 update kernels {' '.join(args.kernels)}\n"
    )
    if args.memory:  # first: the CPU's measure, the resident set's high-water mark, cannot go down
        memory_row(args, backend, low)
        print()
    if args.check:  # before the timed rows: small, and what a cut-short run must keep
        check_rows(args, backend, low)
        print()
    if not args.skip_time:
        time_rows(args, backend, low)
        print(f"\nload average after the timed rows {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
