"""``ampcore bench``: the AMP guide's table (fp32, torch.autocast, AMP-O1, AMP-O2) on any backend."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Final, TextIO

from .._dtypes import parse_dtype
from .._errors import AmpcoreError
from .._table import format_table
from .experiment import (
    EXTRA_MODES,
    MODES,
    BenchResult,
    BenchSettings,
    ModeResult,
    run_bench,
    unreliable_reasons,
)

__all__ = ["add_parser", "check_output_path", "format_result", "plot_result", "time_note"]


class ProgressBar:
    """A one-line progress bar on a terminal stream (silent when it is not a terminal)."""

    def __init__(self, stream: TextIO, modes: int, width: int = 30) -> None:
        self.stream, self.modes, self.width, self.done = stream, modes, width, 0
        self.enabled = stream.isatty()

    def __call__(self, mode: str, step: int, total: int) -> None:
        if not self.enabled:  # logs and CI: one line per finished mode
            if step == total:
                self.done += 1
                self.stream.write(f"ampcore bench: {mode} done ({self.done}/{self.modes})\n")
            return
        fraction = (self.done + step / total) / self.modes
        filled = int(fraction * self.width)
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (self.width - filled)}] {fraction:4.0%} {mode:<15} step {step}/{total}"
        )
        self.stream.flush()
        if step == total:
            self.done += 1
            if self.done == self.modes:
                self.stream.write("\r" + " " * (self.width + 45) + "\r")


def _memory(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


#: The width the notes under the table are wrapped to.
WIDTH: Final = 100
#: What AMP-O1 adds over the torch.autocast baseline (the guide's settings).
O1_NOTE: Final = (
    "Each layer is Paddle's Linear: matmul, then a separate bias add (Xavier-uniform weights, zero "
    "bias, as Paddle initialises them). AMP-O1 is torch.autocast plus the guide's "
    "custom_white_list={{'elementwise_add'}}: the bias adds, which torch.autocast runs in float32 "
    "(their widest input, the float32 bias), run in {dtype}; and ampcore.GradScaler (loss "
    "scaling where {dtype} needs it). AMP-O2 adds ampcore.decorate: {dtype} weights with fp32 "
    "master weights."
)


def _relative(value: float) -> str:
    """A relative difference, with no ``-0.000%`` noise: below 0.001% it reads ``<0.001%``."""
    return "<0.001%" if abs(value) < 5e-6 else f"{value:+.3%}"


def _speedup(r: ModeResult) -> str:
    if r.speedup is None:  # no fp32 run to compare with
        return "-"
    if r.speedup_range is None:
        return f"{r.speedup:.2f}x"
    return f"{r.speedup:.2f}x ({r.speedup_range[0]:.2f}-{r.speedup_range[1]:.2f})"


def format_result(result: BenchResult) -> str:
    """The guide's table and more, as text (the notes wrapped to :data:`WIDTH` columns)."""
    runs = f"{result.steps} steps" + (f" x {result.repeats} repeats" if result.repeats > 1 else "")
    head = (
        f"ampcore bench: 9 x Linear({result.size}, {result.size}), batch {result.batch}, MSE, "
        f"SGD lr {result.lr:g}, {runs}" + (f" (+{result.warmup} warm-up)" if result.warmup else "") + "\n"
        f"backend {result.backend} ({result.device_name}), low precision {result.dtype}\n"
    )
    fp32 = next((r for r in result.results if r.mode == "fp32"), None)
    rows = [("mode", "ms/step", "min-max", "speed-up", "final loss", "vs fp32", "peak memory", "loss scale")]
    for r in result.results:
        delta = "-" if fp32 is None or r is fp32 else _relative((r.final_loss - fp32.final_loss) / abs(fp32.final_loss))
        rows.append(
            (
                r.mode,
                f"{r.ms_per_step:.1f}",
                f"{min(r.step_ms):.0f}-{max(r.step_ms):.0f}",
                _speedup(r),
                f"{r.final_loss:.6f}",
                delta,
                _memory(r.peak_memory),
                "-" if r.loss_scale is None else f"{r.loss_scale:g}",
            )
        )
    lines = format_table(rows, "l" + "r" * (len(rows[0]) - 1))
    wrapped = [textwrap.fill(note, WIDTH, break_on_hyphens=False) for note in _notes(result)]
    return head + "\n" + "\n".join(lines) + "\n\n" + "\n".join(wrapped)


def _notes(result: BenchResult) -> list[str]:
    """The notes under the table: what its columns mean, then what the run's backend and
    spread say about reading it (unwrapped)."""
    notes = [
        "ms/step: median step time over the measured steps"
        + (" of all repeats" if result.repeats > 1 else "")
        + "; min-max: the fastest and slowest step"
        + "; speed-up: fp32's ms/step over the mode's"
        + (" (in brackets: its range over the repeats)" if result.repeats > 1 else "")
        + ". peak memory: growth of the device's peak use (host backends: resident set) during training "
        "('-': unavailable, the backend cannot measure it). "
        "loss scale: '-' where no loss scaling runs.",
        O1_NOTE.format(dtype=result.dtype),
    ]
    if result.autocast_provider == "ampcore":
        notes.append(
            f"{result.backend} registers no autocast kernels of its own: its torch.autocast row is "
            "ampcore.autocast at O1, whose kernels provide the backend's lists (~3 us per op)."
        )
    if result.overflow_flag and any(r.mode == "torch.autocast" and r.loss_scale is not None for r in result.results):
        notes.append(
            f"{result.backend} reports overflow through a device flag (its arithmetic saturates instead of "
            "producing inf): torch.autocast's row uses torch's GradScaler, which is blind to that flag and "
            "takes steps whose values saturated; the AMP rows (ampcore.GradScaler) read it."
        )
    reasons = unreliable_reasons(result)
    if reasons:
        notes.append(
            "WARNING: these speed-ups are unreliable: "
            + "; ".join(reasons)
            + (
                ". Re-run on a quiet machine, or with --repeats 3 to see the spread."
                if result.repeats < 3
                else f". Re-run on a quiet machine (this run already had {result.repeats} repeats)."
            )
        )
    notes.append(time_note(result))
    return notes


def time_note(result: BenchResult) -> str:
    """Where the run's wall time went: per mode its process start (fresh processes only),
    set-up (data, model built on the device, decorate) and steps, then the total."""
    parts = []
    for r in result.results:
        start = f"start {r.start_s:.1f} + " if r.start_s else ""
        parts.append(f"{r.mode} {start}set-up {r.setup_s:.1f} + steps {r.steps_s:.1f}")
    return f"time: wall {result.wall_s:.1f} s; {'; '.join(parts)} (seconds)."


def plot_result(result: BenchResult, path: str) -> None:
    """Draw step times, loss curves and each curve's difference to fp32 to ``path`` (needs
    matplotlib).  Curves that coincide stay apart: each mode has its own line style and
    marker, and the difference panel shows what the loss panel cannot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise AmpcoreError(
            "ampcore bench --plot needs matplotlib, which is not installed: pip install 'ampcore[plot]' (or matplotlib)"
        ) from exc
    fig, (times, losses, deltas) = plt.subplots(1, 3, figsize=(15, 4.2))
    fp32 = next((r for r in result.results if r.mode == "fp32"), None)
    for r, (style, marker) in zip(result.results, _STYLES, strict=False):
        kwargs = {"linestyle": style, "marker": marker, "markersize": 4, "label": r.mode}
        times.plot(range(result.warmup + 1, result.warmup + 1 + result.steps), r.step_ms[: result.steps], **kwargs)
        losses.plot(range(1, len(r.losses) + 1), r.losses, **kwargs)
        if fp32 is not None:
            delta = [a - b for a, b in zip(r.losses, fp32.losses, strict=False)]
            deltas.plot(range(1, len(r.losses) + 1), delta, **kwargs)
    times.set(title="step time" + (" (first repeat)" if result.repeats > 1 else ""), xlabel="step", ylabel="ms")
    losses.set(title="loss", xlabel="step", ylabel="MSE")
    deltas.set(title="loss minus fp32's loss", xlabel="step", ylabel="difference")
    for axis in (times, losses, deltas):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend()
        axis.grid(alpha=0.3)
    fig.suptitle(
        f"ampcore bench: {result.backend} ({result.device_name}), {result.dtype}, "
        f"9 x Linear({result.size}), batch {result.batch}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: Line style and marker per mode, so that coinciding curves can be told apart.
_STYLES: Final = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "x"), ("-", "d"), ("--", "v"))


def check_output_path(option: str, path: str) -> None:
    """Raise :class:`ampcore.AmpcoreError` unless ``path`` can be written (checked before
    minutes of training, and without creating the file)."""
    target = Path(path)
    where = f"ampcore bench {option} {path}"
    if target.is_dir():
        raise AmpcoreError(f"{where}: is a directory; give a file name, e.g. {target / 'bench.json'}")
    parent = target.parent
    if not parent.exists():
        raise AmpcoreError(
            f"{where}: the directory {str(parent)!r} does not exist; create it first or choose another path"
        )
    if not parent.is_dir():
        raise AmpcoreError(f"{where}: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise AmpcoreError(f"{where}: cannot write there (permission denied); choose another path")


def _run(args: argparse.Namespace) -> int:
    settings = BenchSettings(
        device=args.device,
        dtype=parse_dtype(args.dtype, "ampcore bench", "--dtype") if args.dtype else None,
        size=args.size,
        batch=args.batch,
        steps=args.steps,
        warmup=args.warmup,
        modes=tuple(args.modes),
        isolate=not args.in_process,
        repeats=args.repeats,
    )
    for option, path in (("--json", args.json), ("--plot", args.plot)):  # fail before the run, not after
        if path:
            check_output_path(option, path)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise AmpcoreError(
                "ampcore bench --plot needs matplotlib, which is not installed: pip install 'ampcore[plot]'"
            ) from exc
    progress = None if args.no_progress else ProgressBar(sys.stderr, len(settings.modes))
    result = run_bench(settings, on_step=progress)
    print(format_result(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result.as_dict(), handle, indent=2)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot_result(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="train the AMP guide's 9-Linear network in fp32, torch.autocast, AMP-O1 and AMP-O2",
        description=(
            "Reproduce the table of Paddle's AMP guide on any backend: 9 Linear(size, size) layers, MSE "
            "loss, SGD lr 1e-4, random data. Sizes default to the guide's (8192, batch 2048) on devices "
            "with >= 16 GiB of memory and to 2048, batch 512 on host-memory backends (CPU)."
        ),
    )
    parser.add_argument("--device", default=None, help="backend name or name:index (default: best available)")
    parser.add_argument(
        "--dtype", default=None, metavar="DTYPE",
        help="bfloat16/bf16 or float16/fp16 (default: the first the backend's device runs)",
    )  # fmt: skip
    parser.add_argument("--size", type=int, default=None, help="input and output size of each Linear")
    parser.add_argument("--batch", type=int, default=None, help="batch size")
    parser.add_argument(
        "--steps",
        type=int,
        default=20,
        help="measured training steps per mode (default 20: the guide's 2 epochs of 10 batches)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="unmeasured warm-up steps before the measured ones (default 0, as the guide)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1,
        help="run all modes this many times, interleaved, and report the spread of the speed-ups (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES + EXTRA_MODES,
        default=list(MODES),
        help="modes to run (default: all but AMP-auto, level='auto', which runs when named)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write all measurements as JSON")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw step times, loss curves and their difference to fp32 (needs matplotlib)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every mode in this process (default: a fresh process per mode, for clean peak memory)",
    )
    parser.set_defaults(func=_run)
