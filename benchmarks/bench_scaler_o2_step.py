"""``GradScaler.step`` on O2 master weights: the copying path against the deferred unscale
(issue 31).

Before issue 31, ``scaler.step(opt)`` on an optimizer decorated at O2 gave every master a
float32 copy of its gradient (to unscale it and check it for inf/nan); now the update of
momentum-free SGD, Adam and AdamW unscales the low-precision gradients as it widens them
(``ampcore/_o2/scaled_update.py``).  An explicit ``scaler.unscale_(opt)`` before the step
still runs the copying path, so both run in one process, interleaved round by round:

* ``copying``: ``scaler.unscale_(opt); scaler.step(opt); scaler.update()`` (what
  ``scaler.step`` did before);
* ``deferred``: ``scaler.step(opt); scaler.update()``.

The optimizers: momentum-free SGD, AdamW, and ``adamw-fused`` (``AdamW(fused=True)``, whose
kernel unscales and skips on the device: GradScaler hands it ``grad_scale``/``found_inf``,
and its ``deferred`` path checks the low-precision gradients read-only, so no float32
gradient copies; its ``copying`` path is the explicit ``unscale_``, which makes them).

Per case: the median time of the scaler calls (forward and backward are outside the timed
span) and the peak bytes allocated during them: on a device with a memory allocator that
counts (CUDA), the allocator's peak above what was allocated before; on the host, the
largest sum of the storages created during the calls that were alive at once (counted by a
dispatch mode, in a separate untimed round; views allocate nothing and are not counted).

    python benchmarks/bench_scaler_o2_step.py                        # the CPU, fp16 + bf16, every optimizer
    python benchmarks/bench_scaler_o2_step.py --optimizers adamw-fused --dtypes float16 --threads 1
    python benchmarks/bench_scaler_o2_step.py --device cuda --size 8192 --batch 64
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Final

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ampcore
from ampcore._cli.experiment import SeedNet
from ampcore._o2.master import master_weights_of
from ampcore._o2.update_walk import UpdateWalk

OPTIMIZERS: Final[dict[str, Callable[..., torch.optim.Optimizer]]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=1e-4),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-4),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=1e-4, fused=True),
}
PATHS: Final = ("copying", "deferred")


class LiveBytes(TorchDispatchMode):
    """The largest sum of bytes of storages created inside the mode and alive at once (a
    view of an input, or of a tensor already counted, allocates nothing and is not counted;
    a storage counts until the tensor that created it is freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: set[int] = set()

    def _gone(self, pointer: int, size: int) -> None:
        self._storages.discard(pointer)
        self.live -= size

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        inputs = {t.untyped_storage().data_ptr() for t in leaves if isinstance(t, torch.Tensor)}
        for tensor in out if isinstance(out, (list, tuple)) else [out]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            pointer, size = storage.data_ptr(), storage.nbytes()
            if size and pointer not in inputs and pointer not in self._storages:
                self._storages.add(pointer)
                self.live += size
                weakref.finalize(tensor, self._gone, pointer, size)
        self.peak = max(self.peak, self.live)
        return out


class Case:
    """One decorated seed network, optimizer and scaler; :meth:`iteration` runs backward and
    the scaler's calls of one path, returning their seconds and peak bytes."""

    def __init__(self, args: argparse.Namespace, dtype: torch.dtype, optimizer: str) -> None:
        torch.manual_seed(0)
        self.device = torch.device(args.device)
        model = SeedNet(args.size, self.device)
        opt = OPTIMIZERS[optimizer](model.parameters())
        self.model, self.opt = ampcore.decorate(model, opt, level="O2", dtype=dtype, device=args.device)
        self.scaler = ampcore.GradScaler(args.device, dtype=dtype, init_scale=1024.0)
        self.region = ampcore.autocast(args.device, dtype=dtype, level="O2")
        self.x = torch.rand(args.batch, args.size, device=self.device)
        self.cuda = self.device.type == "cuda"
        self.weights = master_weights_of(self.opt)
        if self.weights is not None and args.walk != "adaptive":  # pinned: "chunks" keeps the backend's chunk
            chunk = self.weights.walk.chunk if args.walk == "chunks" else None
            self.weights.walk = UpdateWalk(chunk, adaptive=False)

    def walk(self) -> str:
        """The walk of the coming update (its choice is deterministic between updates)."""
        if self.weights is None:
            return "-"
        chunk = self.weights.walk.next_chunk()
        return "whole" if chunk is None else f"chunks of {chunk}"

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def iteration(self, path: str, count_bytes: bool) -> tuple[float, int]:
        self.opt.zero_grad(set_to_none=True)
        with self.region:
            loss = self.model(self.x).float().pow(2).mean()
        self.scaler.scale(loss).backward()
        self._sync()
        mode = LiveBytes() if count_bytes and not self.cuda else None
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device) if self.cuda else 0
        start = time.perf_counter()
        if mode is not None:
            mode.__enter__()
        try:
            if path == "copying":
                self.scaler.unscale_(self.opt)
            self.scaler.step(self.opt)
            self.scaler.update()
        finally:
            if mode is not None:
                mode.__exit__(None, None, None)
        self._sync()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(self.device) - before if self.cuda else (mode.peak if mode else 0)
        return seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=2048, help="width of the 9 Linear layers (default 2048)")
    parser.add_argument("--batch", type=int, default=16, help="batch of the (untimed) forward/backward")
    parser.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument(
        "--walk",
        choices=("adaptive", "chunks", "whole"),
        default="adaptive",
        help="O2's update walk: timed per step as in training (default), or pinned",
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=ampcore.AmpcoreWarning)
    print(
        f"9 x Linear({args.size}) on {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{args.rounds} rounds (+{args.warmup})"
    )
    print(
        "case | path | walk | scaler calls ms (median) | peak bytes during them | ratio deferred / copying (ms, bytes)"
    )
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for optimizer in args.optimizers:
            cases = {path: Case(args, dtype, optimizer) for path in PATHS}
            times: dict[str, list[float]] = {path: [] for path in PATHS}
            peaks: dict[str, int] = {}
            for index in range(args.warmup + args.rounds):
                order = PATHS if index % 2 == 0 else PATHS[::-1]
                for path in order:
                    seconds, _ = cases[path].iteration(path, count_bytes=False)
                    if index >= args.warmup:
                        times[path].append(seconds * 1e3)
            walks = {path: cases[path].walk() for path in PATHS}
            for path in PATHS:
                peaks[path] = cases[path].iteration(path, count_bytes=True)[1]
            medians = {path: statistics.median(times[path]) for path in PATHS}
            for path in PATHS:
                ratio = (
                    f" | {medians[path] / medians['copying']:.3f}, {peaks[path] / max(peaks['copying'], 1):.3f}"
                    if path == "deferred"
                    else ""
                )
                print(
                    f"{dtype_name} {optimizer} | {path} | {walks[path]} | {medians[path]:.1f} | "
                    f"{peaks[path] / 2**20:.1f} MiB{ratio}"
                )


if __name__ == "__main__":
    main()
