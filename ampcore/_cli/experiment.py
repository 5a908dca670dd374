"""The experiment of Paddle's AMP guide, on any backend: 9 Linear layers, MSE, SGD.

The layers are Paddle's Linear (:class:`GuideLinear`: matmul + a separate bias add,
Xavier-uniform weights, zero bias), so the guide's losses (about 0.65 at the start) and its
``custom_white_list={"elementwise_add"}`` (the bias adds run in low precision) both show.

Each mode trains the same network from the same initial weights on the same random batch:
``fp32``, the native ``torch.autocast`` baseline, ``AMP-O1`` (ampcore autocast with the
guide's ``custom_white_list={"elementwise_add"}`` and a GradScaler) and ``AMP-O2``
(``ampcore.decorate`` with fp32 master weights, O2 autocast and a GradScaler).  Modes run one
after the other so that each one's peak memory is its own.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

import torch
from torch import nn

from .._backends.backend import Backend, dtype_name
from .._backends.memory import (
    device_memory,
    memory_in_use,
    peak_memory,
    reset_peak_memory,
    synchronize,
)
from .._backends.registry import resolve_device
from .._backends.support import resolve_dtype
from .._errors import AmpcoreError
from .._policy.executor import executor
from .._policy.registration import has_native_autocast
from .bench_limits import check_sizes
from .results import BenchResult, ModeResult, add_speedups, load_average, merge_repeats, unreliable_reasons

__all__ = [
    "EXTRA_MODES",
    "MODES",
    "GuideLinear",
    "SeedNet",
    "BenchResult",
    "BenchSettings",
    "ModeResult",
    "default_sizes",
    "run_bench",
    "unreliable_reasons",
]

MODES: Final = ("fp32", "torch.autocast", "AMP-O1", "AMP-O2")
#: Modes run only when asked for (``--modes``): ``AMP-auto`` is ``level="auto"`` with a GradScaler.
EXTRA_MODES: Final = ("AMP-auto",)
#: The guide's sizes, used where the device has the memory for them.
GUIDE_SIZES: Final = (8192, 2048)
#: Scaled-down sizes for host-memory backends (CPU): a few minutes for all modes.
HOST_SIZES: Final = (2048, 512)
_GUIDE_NEEDS: Final = 16 * 2**30

StepCallback = Callable[[str, int, int], None]


@dataclass
class BenchSettings:
    """What to run; ``size``/``batch`` None picks :func:`default_sizes`."""

    device: str | None = None
    dtype: torch.dtype | None = None
    size: int | None = None
    batch: int | None = None
    steps: int = 20
    warmup: int = 0
    batches: int = 10
    lr: float = 1e-4
    seed: int = 0
    modes: tuple[str, ...] = MODES
    #: run each mode in a fresh process (clean peak memory, no allocator cross-talk)
    isolate: bool = True
    #: run all modes this many times, interleaved (spread of the speed-ups)
    repeats: int = 1


class GuideLinear(nn.Module):
    """Paddle's ``nn.Linear`` as the guide runs it: ``matmul`` then a separate bias add
    (Paddle's ``elementwise_add``), weight ``[in, out]``, Xavier-uniform weight and zero bias
    (Paddle's default initialisers).  torch's ``nn.Linear`` fuses the add into ``addmm``, so
    a custom list naming ``add`` would change nothing there."""

    def __init__(self, in_features: int, out_features: int, device: torch.device | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(nn.init.xavier_uniform_(torch.empty(in_features, out_features, device=device)))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight) + self.bias


class SeedNet(nn.Module):
    """The guide's network: 9 :class:`GuideLinear` ``(size, size)`` layers in a row."""

    def __init__(self, size: int, device: torch.device | None = None) -> None:
        super().__init__()
        self.linears = nn.ModuleList(GuideLinear(size, size, device) for _ in range(9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.linears:
            x = linear(x)
        return x


def default_sizes(backend: Backend, device_index: int = 0) -> tuple[int, int]:
    """(size, batch): the guide's where the device has >= 16 GiB, else the host sizes."""
    memory = device_memory(backend, device_index)
    return GUIDE_SIZES if memory is not None and memory >= _GUIDE_NEEDS else HOST_SIZES


#: A mode's model, optimizer, region (a context-manager factory) and scaler (None: no scaling).
Prepared = tuple[nn.Module, torch.optim.Optimizer, Callable[[], contextlib.AbstractContextManager[Any]], Any]


def _setup(
    mode: str,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    settings: BenchSettings,
    dtype: torch.dtype,
    backend: Backend,
) -> Prepared:
    import ampcore

    device = settings.device
    if mode == "fp32":
        return model, opt, contextlib.nullcontext, None
    if mode == "torch.autocast":
        native = torch.amp.GradScaler(backend.device_type) if backend.needs_loss_scaling(dtype) else None
        if not has_native_autocast(backend.device_type):
            # the device registers no autocast kernels: torch.autocast alone would fail or
            # cast nothing; ampcore provides its autocast (the backend's O1 lists)
            provided = ampcore.autocast(device, dtype=dtype, level="O1")
            return model, opt, lambda: provided, native
        return model, opt, lambda: torch.autocast(backend.device_type, dtype=dtype), native
    scaler = ampcore.GradScaler(device, dtype=dtype, init_scale=1024.0)
    # the policy kernels' executor is chosen (the compiled one built: 20-60 s at its first use
    # per torch) in set-up: the GPU run of 2026-11-27 paid an 18.7 s build in AMP-O1's first step
    executor()
    if mode == "AMP-O1":
        region = ampcore.autocast(device, dtype=dtype, level="O1", custom_white_list={"elementwise_add"})
        return model, opt, lambda: region, scaler
    if mode == "AMP-auto":
        region = ampcore.autocast(device, dtype=dtype, level="auto")
        return model, opt, lambda: region, scaler
    if mode == "AMP-O2":
        model, opt = ampcore.decorate(model, opt, level="O2", dtype=dtype, device=device)
        region = ampcore.autocast(device, dtype=dtype, level="O2")
        return model, opt, lambda: region, scaler
    raise AmpcoreError(f"ampcore bench: unknown mode {mode!r}; valid modes: {', '.join(MODES + EXTRA_MODES)}")


def _run_mode(
    mode: str,
    settings: BenchSettings,
    backend: Backend,
    index: int,
    dtype: torch.dtype,
    size: int,
    batch: int,
    on_step: StepCallback | None,
) -> ModeResult:
    began = time.perf_counter()
    device = torch.device(backend.device_type, index)
    torch.manual_seed(settings.seed)  # every device's generator: the same data and weights per mode
    # the guide's data: uniform [0, 1) inputs and labels, `batches` distinct batches cycled
    data = torch.rand(settings.batches, batch, size, device=device)
    label = torch.rand(settings.batches, batch, size, device=device)
    synchronize(backend, index)
    reset_peak_memory(backend, index)
    base = memory_in_use(backend, index)  # peak growth: weights, masters, grads, activations
    # built and initialised on the device (its generator): no host-side init and copy of 9 x size^2
    model: nn.Module = SeedNet(size, device)
    opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr)
    model, opt, region, scaler = _setup(mode, model, opt, settings, dtype, backend)
    synchronize(backend, index)
    stepping = time.perf_counter()
    times, losses = _train(mode, settings, (model, opt, region, scaler), (data, label), backend, index, on_step)
    steps_s = time.perf_counter() - stepping
    peak = peak_memory(backend, index)
    scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None  # None: no scaling
    del model, opt, data, label
    return ModeResult(
        mode=mode,
        ms_per_step=statistics.median(times),
        step_ms=times,
        losses=losses,
        final_loss=losses[-1],
        peak_memory=None if peak is None or base is None else max(peak - base, 0),
        loss_scale=scale,
        repeat_ms=[statistics.median(times)],
        setup_s=stepping - began,
        steps_s=steps_s,
    )


def _train(
    mode: str,
    settings: BenchSettings,
    prepared: Prepared,
    batches: tuple[torch.Tensor, torch.Tensor],
    backend: Backend,
    index: int,
    on_step: StepCallback | None,
) -> tuple[list[float], list[float]]:
    """The warm-up and measured steps of one mode: the measured steps' times (ms) and every
    step's loss (read on the host, which synchronises, as the guide's loop does)."""
    model, opt, region, scaler = prepared
    data, label = batches
    total = settings.warmup + settings.steps
    times: list[float] = []
    losses: list[float] = []
    for step in range(total):
        start = time.perf_counter()
        with region():
            loss = nn.functional.mse_loss(model(data[step % settings.batches]), label[step % settings.batches])
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronises
        synchronize(backend, index)
        if step >= settings.warmup:
            times.append((time.perf_counter() - start) * 1e3)
        if on_step is not None:
            on_step(mode, step + 1, total)
    return times, losses


def _worker(
    queue: Any, mode: str, settings: BenchSettings, device: str, dtype: torch.dtype, size: int, batch: int
) -> None:
    """Entry point of an isolated mode's process: streams progress, then the result."""
    try:
        resolved = resolve_device(device)
        result = _run_mode(
            mode,
            settings,
            resolved.backend,
            resolved.index or 0,
            dtype,
            size,
            batch,
            lambda m, step, total: queue.put(("step", m, step, total)),
        )
        queue.put(("result", asdict(result)))
    except BaseException as exc:  # reported to the parent, which raises
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


#: What the fork server imports once, so that each mode's process starts without importing
#: torch and ampcore again (and without torch._dynamo, which an optimizer imports).
_PRELOAD: Final = ("ampcore._cli.experiment", "torch._dynamo")


def _process_context() -> Any:
    """The multiprocessing context of the modes' processes: a fork server that has imported
    :data:`_PRELOAD` (it never touches a device, so each forked child initialises its own
    device runtime), or ``spawn`` where there is no fork server (Windows) or
    ``AMPCORE_BENCH_START_METHOD=spawn`` asks for it."""
    import multiprocessing

    method = os.environ.get("AMPCORE_BENCH_START_METHOD", "forkserver")
    if method != "forkserver" or method not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(_PRELOAD))
    return context


def _run_isolated(
    mode: str,
    settings: BenchSettings,
    device: str,
    dtype: torch.dtype,
    size: int,
    batch: int,
    on_step: StepCallback | None,
) -> ModeResult:
    import queue as queues

    context = _process_context()
    channel = context.Queue()
    process = context.Process(target=_worker, args=(channel, mode, settings, device, dtype, size, batch), daemon=True)
    began = time.perf_counter()
    process.start()
    try:
        while True:
            try:
                kind, *payload = channel.get(timeout=1.0)
            except queues.Empty:
                if not process.is_alive():
                    raise AmpcoreError(
                        f"ampcore bench: the process running mode {mode!r} died (exit code {process.exitcode}); "
                        "out of memory? try smaller --size/--batch"
                    ) from None
                continue
            if kind == "step" and on_step is not None:
                on_step(*payload)
            elif kind == "error":
                raise AmpcoreError(f"ampcore bench: mode {mode!r} failed: {payload[0]}")
            elif kind == "result":
                result = ModeResult(**payload[0])
                process.join(timeout=30)
                # the rest of the process's life: interpreter, imports, plugin loading, exit
                result.start_s = max(time.perf_counter() - began - result.setup_s - result.steps_s, 0.0)
                return result
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()


def run_bench(settings: BenchSettings, on_step: StepCallback | None = None) -> BenchResult:
    """Run every mode of ``settings`` and return their measurements.

    Example::

        >>> result = run_bench(BenchSettings(device="cpu", size=64, batch=8, steps=2, isolate=False))
        >>> [r.mode for r in result.results]
        ['fp32', 'torch.autocast', 'AMP-O1', 'AMP-O2']
    """
    import platform

    from .._version import __version__

    began = time.perf_counter()
    _check_settings(settings)
    resolved = resolve_device(settings.device)
    backend, index = resolved.backend, resolved.index or 0
    dtype = resolve_dtype(backend, settings.dtype, index, "ampcore bench")
    size, batch = default_sizes(backend, index)
    size, batch = settings.size or size, settings.batch or batch
    check_sizes(backend, index, size, batch, settings.batches)  # before anything is allocated
    result = BenchResult(
        backend=backend.name,
        device_name=backend.device_name(index),
        dtype=dtype_name(dtype),
        size=size,
        batch=batch,
        steps=settings.steps,
        warmup=settings.warmup,
        lr=settings.lr,
        versions={"ampcore": __version__, "torch": torch.__version__, "python": platform.python_version()},
    )
    result.repeats, result.load_average, result.cpus = settings.repeats, load_average(), os.cpu_count()
    result.autocast_provider = "native" if has_native_autocast(backend.device_type) else "ampcore"
    flag_hook = backend.hook("ampcore_device_overflow_flag")
    if flag_hook is not None:  # torch's GradScaler (the torch.autocast row) cannot read it
        result.overflow_flag = flag_hook(device=torch.device(backend.device_type, index)) is not None
    runs: dict[str, list[ModeResult]] = {mode: [] for mode in settings.modes}
    for _ in range(settings.repeats):  # interleaved: a slow spell of the machine hits every mode
        for mode in settings.modes:
            if settings.isolate:
                device = backend.name if resolved.index is None else f"{backend.name}:{index}"
                runs[mode].append(_run_isolated(mode, settings, device, dtype, size, batch, on_step))
            else:
                runs[mode].append(_run_mode(mode, settings, backend, index, dtype, size, batch, on_step))
    result.results = [merge_repeats(runs[mode]) for mode in settings.modes]
    add_speedups(result.results, settings.repeats)
    result.wall_s = time.perf_counter() - began
    return result


def _check_settings(settings: BenchSettings) -> None:
    bad = [m for m in settings.modes if m not in MODES + EXTRA_MODES]
    if bad:
        raise AmpcoreError(f"ampcore bench: unknown mode(s) {bad}; valid modes: {', '.join(MODES + EXTRA_MODES)}")
    if settings.steps < 1 or settings.warmup < 0 or settings.batches < 1:
        raise AmpcoreError(
            f"ampcore bench: steps and batches must be >= 1 and warmup >= 0 "
            f"(got steps={settings.steps}, batches={settings.batches}, warmup={settings.warmup})"
        )
    if settings.repeats < 1:
        raise AmpcoreError(f"ampcore bench: --repeats must be a positive integer (got {settings.repeats})")
    for name in ("size", "batch"):
        value = getattr(settings, name)
        if value is not None and value < 1:
            raise AmpcoreError(f"ampcore bench: --{name} must be a positive integer (got {value})")
