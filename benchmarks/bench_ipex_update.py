"""The O2 master update alone against IPEX's fused optimizer step (issue 31's IPEX row).

Needs Intel Extension for PyTorch, in an environment of its own (see ``bench_ipex_o2.py``)::

    /tmp/venv28/bin/python benchmarks/bench_ipex_update.py --optimizers sgd sgd-momentum adam

The tensors of ``bench_ipex_o2.py``'s model (7 x ``Linear(1664)``: 19.4M parameters), one
intra-op thread, each row's update over all of them, medians of interleaved rounds in this
thread's CPU time.  Bytes per parameter are what the update must read and write:

* ``onepass``: ampcore's one-pass kernel as the O2 step runs it: float32 master and bf16
  gradient in, master and the rounded bf16 parameter out (SGD 12 B, with momentum 20, Adam
  28); ``onepass, not streamed``: the same with the parameter written by ordinary stores,
  which read each cache line first (2 B more);
* ``ipex``: ``torch.ops.torch_ipex.*_fused_step`` on IPEX's split master (the bf16 weight is
  the float32 master's top half, a second bf16 tensor its bottom half; 10, 18, 26 B);
* ``pure bf16``: torch's fused optimizer on bf16 parameters and states (6, 10, 14 B);
* ``float32 a += b`` and ``float32 c = a + b``: this core's single-thread bandwidth on the same
  sizes (12 B each; the second writes a tensor it does not read, like the bf16 parameter);
* with ``--baseline-source FILE``, ``onepass, FILE``: the kernel built from another version of
  ``onepass_kernel.cpp`` (before/after in one process), e.g.
  ``git show 17e1964:ampcore/_o2/onepass_kernel.cpp > /tmp/base.cpp``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Final

import torch

from ampcore._cpp_build import build_extension, extension_name
from ampcore._o2 import onepass

SHAPES: Final = [shape for _ in range(7) for shape in ((1664, 1664), (1664,))]
#: bytes per parameter each row's update must move
BYTES: Final[dict[str, dict[str, int]]] = {
    "sgd": {"onepass": 12, "onepass, not streamed": 12, "ipex": 10, "pure bf16": 6},
    "sgd-momentum": {"onepass": 20, "onepass, not streamed": 20, "ipex": 18, "pure bf16": 10},
    "adam": {"onepass": 28, "onepass, not streamed": 28, "ipex": 26, "pure bf16": 14},
}
HYPER: Final = {"lr": 1e-4, "momentum": 0.9, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}


def tensors(dtype: torch.dtype, fill: str = "zeros") -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(len(fill))
    if fill == "zeros":
        return [torch.zeros(shape, dtype=dtype) for shape in SHAPES]
    return [(torch.randn(shape, generator=generator) * 0.02).to(dtype) for shape in SHAPES]


def baseline(source: Path) -> ModuleType:
    """The one-pass kernel built from ``source`` (another version of it), for this CPU."""
    capability = torch.backends.cpu.get_cpu_capability()
    flags = [*onepass.BASE_FLAGS, *onepass.ISA_FLAGS.get(capability, ())]
    return build_extension(extension_name("ampcore_o2_onepass_baseline", source), source, flags)


def rows(kind: str, base: ModuleType | None = None) -> dict[str, Callable[[], object]]:
    """Each row's update of every tensor, once (``base``: a baseline build of the kernel)."""
    import intel_extension_for_pytorch  # noqa: F401  (registers torch.ops.torch_ipex)

    built = onepass._module()
    if built is None:
        sys.exit(f"bench_ipex_update: the one-pass kernel is not used here: {onepass.choice().reason}")
    module, layout = built
    default_min = module.set_stream_min(0)
    module.set_stream_min(default_min)
    masters, grads = tensors(torch.float32, "randn"), tensors(torch.bfloat16, "randn!")
    lows = [master.bfloat16() for master in masters]
    tops, trails = zip(*(torch.ops.torch_ipex.split_float_bfloat16(master.clone()) for master in masters), strict=True)
    pure = [master.bfloat16() for master in masters]
    states = {name: tensors(torch.float32) for name in ("buf", "m", "v", "ipex buf", "ipex m", "ipex v")}
    pure_states = {name: tensors(torch.bfloat16) for name in ("buf", "m", "v")}
    steps, pure_steps = [torch.ones(()) for _ in SHAPES], [torch.ones(()) for _ in SHAPES]
    momentum = HYPER["momentum"] if kind == "sgd-momentum" else 0.0

    def ours(stream_min: int, kernel: ModuleType = module) -> Callable[[], object]:
        def run() -> object:
            if kernel is module:
                module.set_stream_min(stream_min)
            if kind == "adam":
                return kernel.adam(masters, grads, lows, states["m"], states["v"], [], steps, HYPER["lr"],
                                   HYPER["beta1"], HYPER["beta2"], 0.0, HYPER["eps"], False, False, False, None,
                                   None, *layout)  # fmt: skip
            bufs = states["buf"] if momentum else []
            return kernel.sgd(masters, grads, lows, bufs, 0.0, momentum, HYPER["lr"], 0.0, False, False, False,
                              None, None, *layout)  # fmt: skip

        return run

    def ipex() -> None:
        for i, (top, grad, trail) in enumerate(zip(tops, grads, trails, strict=True)):
            if kind == "adam":
                torch.ops.torch_ipex.adam_fused_step(top, states["ipex m"][i], states["ipex v"][i], torch.Tensor(),
                                                     grad, trail, False, 2.0, HYPER["beta1"], HYPER["beta2"],
                                                     HYPER["lr"], 0.0, HYPER["eps"])  # fmt: skip
            else:
                buf = states["ipex buf"][i] if momentum else None
                torch.ops.torch_ipex.sgd_fused_step(top, grad, buf, trail, momentum, HYPER["lr"], 0.0, 0.0, False)

    def torch_bf16() -> None:
        if kind == "adam":
            torch._fused_adam_(pure, list(grads), pure_states["m"], pure_states["v"], [], pure_steps, lr=HYPER["lr"],
                               beta1=HYPER["beta1"], beta2=HYPER["beta2"], weight_decay=0.0, eps=HYPER["eps"],
                               amsgrad=False, maximize=False)  # fmt: skip
        else:
            torch._fused_sgd_(pure, list(grads), pure_states["buf"] if momentum else [], weight_decay=0.0,
                              momentum=momentum, lr=HYPER["lr"], dampening=0.0, nesterov=False, maximize=False,
                              is_first_step=False)  # fmt: skip

    a, b, c = tensors(torch.float32, "randn"), tensors(torch.float32, "randn"), tensors(torch.float32)
    return {
        **({} if base is None else {"onepass, baseline": ours(0, base)}),
        "onepass": ours(default_min),
        "onepass, not streamed": ours(2**62),
        "ipex": ipex,
        "pure bf16": torch_bf16,
        "float32 a += b": lambda: [x.add_(y) for x, y in zip(a, b, strict=True)],
        "float32 c = a + b": lambda: [torch.add(x, y, out=z) for x, y, z in zip(a, b, c, strict=True)],
    }


def run(kind: str, args: argparse.Namespace, base: ModuleType | None) -> None:
    table = rows(kind, base)
    names = list(table)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.warmup + args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.thread_time()
            table[name]()
            if round_ >= args.warmup:
                times[name].append(time.thread_time() - start)
    params = sum(torch.Size(shape).numel() for shape in SHAPES)
    median = {name: statistics.median(got) for name, got in times.items()}
    print(f"\n{kind}: {params / 1e6:.1f}M parameters, 1 thread, {args.rounds} rounds, thread CPU time")
    print("| update | ms | bytes / param | GB/s | / ipex |")
    print("|---|---:|---:|---:|---:|")
    ipex = median["ipex"]
    moved = {name: BYTES[kind].get(name.replace(", baseline", ""), 12) for name in names}
    lines = (
        (name, f"{1e3 * took:.2f}", moved[name], f"{moved[name] * params / took / 1e9:.1f}", f"{took / ipex:.3f}")
        for name, took in median.items()
    )
    print("\n".join("| " + " | ".join(map(str, line)) + " |" for line in lines), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--optimizers", nargs="+", choices=tuple(BYTES), default=list(BYTES))
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--baseline-source", type=Path, help="another onepass_kernel.cpp, timed as a row of its own")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    base = None if args.baseline_source is None else baseline(args.baseline_source)
    if base is not None:
        print(f"baseline: {args.baseline_source} ({base.__name__})")
    for kind in args.optimizers:
        run(kind, args, base)


if __name__ == "__main__":
    main()
