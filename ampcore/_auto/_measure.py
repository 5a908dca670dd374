"""How ``level="auto"`` measures :class:`~._costs.Costs`: short micro-benchmarks of the
module call the model actually made (same module, same inputs), forward and backward.

* ``fp32_ms``: the call with autocast off and float32 inputs;
* ``low_ms``: the call under autocast in the low-precision dtype, *including* the casts it
  needs: inputs and weights to low precision (weights re-cast every call, as every step
  does), the output back to float32 for a float32 consumer, and the gradients' casts;
* ``cast_ms``: the casts alone (part of ``low_ms``), to explain the decision.

Measurements that cannot poison a plan: every candidate runs once untimed first (the first
call of a shape pays one-time set-up: oneDNN's kernel creation, autotuning, the
allocator's growth), then the two sides are timed in alternation (drift and interference
hit both) and each keeps the median of its runs and their spread (the range of the runs
without the highest and lowest, over the median).  Rounds go on while the class's share of
the budget lasts, at most :data:`MAX_RUNS`; no round starts past the share once two rounds
are timed (one, when the warm-up and the first round already used it up: a slow class
stays within about its share plus one round), and two rounds suffice when one side is
clearly slower (every run of it over twice every run of the other).  Rounds hit by other
work (a spike on either side, :mod:`._spikes`) are left out of the figures, and where the
two sides still differ by more than the margin but not by more than the noise, rounds go on
past :data:`MAX_RUNS` (up to :data:`MAX_ROUNDS`, within the same share): a busy machine's
noise is narrowed, not turned into a tie; the verdict is looked at after each block of
:data:`MAX_RUNS` rounds only, not after every round (each look is a chance for noise to pass
the band).  Figures from fewer than :data:`MIN_RUNS` rounds are marked estimated.

The clock is the adapter's: :func:`device_clock` times on the device with events where the
device supports timing events, else on the host after the adapter's synchronisation, by the
adapter's ``ampcore_auto_timer`` where it offers one (the CPU adapter: the calling thread's
CPU time while torch computes on one thread, which the time other processes hold the core
does not reach) and the wall clock otherwise, a run pre-empted by other work timed again
where the adapter's ``ampcore_auto_waited`` counts the time its threads waited for the
device (the CPU adapter with more than one thread: the threads' run delay, :mod:`._hostclock`;
the time of the tries left out counts against the share); a device that can be neither timed nor
synchronised gives ``None`` (nothing is measured: ``level="auto"`` runs as torch.autocast
there).  Tests inject a clock.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal

import torch
from torch import nn

from ._costs import MARGIN, Costs, band
from ._hostclock import HostClock, Timer, lost
from ._kept import muted_hooks
from ._spikes import ambiguous, kept

__all__ = ["Clock", "device_clock", "measure"]

Label = Literal["fp32", "low", "casts", "root-plan", "root-low", "root-fp32"]
#: Times one run: ``clock(run, label) -> milliseconds`` (``label`` says which candidate;
#: ``root-*``: a whole root call under its program or a fixed choice, :mod:`._verify`).
Clock = Callable[[Callable[[], None], Label], float]

MIN_RUNS: Final = 3
MAX_RUNS: Final = 7
#: rounds at most where the sides are still ambiguous after :data:`MAX_RUNS` (:mod:`._spikes`)
MAX_ROUNDS: Final = 3 * MAX_RUNS
_CLEARLY_SLOWER: Final = 2.0


def _host_clock(
    sync: Callable[[], None],
    timer: Callable[[], Timer | None] = lambda: None,
    waited: Callable[[], Timer | None] = lambda: None,
) -> Clock:
    """The host's clock around ``sync`` (:class:`~._hostclock.HostClock`): ``timer()``'s
    (asked at each run: it may depend on the thread count) or, where it gives None, the
    wall clock; runs pre-empted by other work (``waited()``'s count grew) timed again."""
    return HostClock(sync, timer, waited)


def _event_clock(device_type: str, sync: Callable[[], None]) -> Clock | None:
    """Device-side timing with ``torch.Event`` (``None``: the device has no timing events).
    The end event is recorded after the last launch, so the time includes launch gaps
    where the host, not the device, is the bottleneck."""
    try:
        probe = torch.Event(device=device_type, enable_timing=True)
        probe.record()
        probe.synchronize()
    except (RuntimeError, TypeError, ValueError, NotImplementedError, AttributeError):
        return None

    def clock(run: Callable[[], None], label: Label) -> float:
        start = torch.Event(device=device_type, enable_timing=True)
        end = torch.Event(device=device_type, enable_timing=True)
        sync()
        start.record()
        run()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    return clock


def device_clock(backend: Any, device_index: int = 0) -> Clock | None:
    """The clock for ``backend``'s device ``device_index`` (``None``: cannot be timed).

    Events where the device type supports timing events; else the host's clock around the
    adapter's synchronisation (:func:`ampcore._backends.memory.synchronize`), for host
    backends and devices that can be synchronised: the adapter's ``ampcore_auto_timer``
    where it gives one, else the wall clock, and runs pre-empted by other work timed again
    where the adapter's ``ampcore_auto_waited`` gives a count of the time waited
    (:mod:`._hostclock`; its readings are checked: no count of seconds is a
    :class:`~ampcore.PluginError`)."""
    from .._backends.memory import can_synchronize, synchronize

    if not can_synchronize(backend):
        return None

    def sync() -> None:
        synchronize(backend, device_index)

    hook = backend.hook("ampcore_auto_timer")
    waits = backend.hook("ampcore_auto_waited")

    def timer() -> Timer | None:
        return None if hook is None else hook(device_index=device_index)

    def waited() -> Timer | None:
        return None if waits is None else waits(device_index=device_index)

    def read(reader: Timer) -> float:  # the adapter's count of seconds waited, checked
        try:
            value: object = reader()
        except Exception as exc:
            raise backend.broken(f"ampcore_auto_waited()'s function raised {type(exc).__name__}: {exc}") from exc
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf:
            return float(value)
        raise backend.broken(
            f"ampcore_auto_waited()'s function returned {value!r}; expected the seconds waited so far (a float >= 0)"
        )

    return _event_clock(backend.device_type, sync) or HostClock(sync, timer, waited, read)


def _leaf(value: Any, grad: bool, seen: dict[int, torch.Tensor]) -> Any:
    """A floating tensor as a new autograd leaf (the same leaf for the same tensor: modules
    such as MultiheadAttention take another path when ``query is key``)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        found = seen.get(id(value))
        if found is None:
            found = seen[id(value)] = value.detach().requires_grad_(grad)
        return found
    return value


def _one_call(
    module: nn.Module,
    call_args: tuple[Any, ...],
    kwargs: dict[str, Any],
    params: Sequence[torch.Tensor],
    grad: bool,
    device_type: str,
    low: torch.dtype | None,
) -> Callable[[], None]:
    """One call of ``module`` (forward, and backward with ``grad``) on fresh leaves of the
    arguments: in float32, or under torch's autocast in ``low``."""
    seen: dict[int, torch.Tensor] = {}
    inputs = tuple(_leaf(a, grad, seen) for a in call_args)
    kw = {k: _leaf(v, False, {}) for k, v in kwargs.items()}
    leaves = [*{id(t): t for t in seen.values() if t.requires_grad}.values(), *params]

    def run() -> None:
        # autocast off around the whole run: backward runs outside the region, as in training
        with torch.autocast(device_type, enabled=False):
            if low is not None:
                with torch.autocast(device_type, dtype=low, cache_enabled=False):
                    out = _first_tensor(module.forward(*inputs, **kw))
                if out is not None and out.is_floating_point():
                    out = out.float()  # a float32 consumer's cast
            else:  # low-precision inputs are cast to float32 inside the timed call, as the hook does
                out = _first_tensor(module.forward(*_to_float32(inputs), **_to_float32(kw)))
            if grad and out is not None and out.requires_grad and leaves:
                # the graph kept: a weight computed before the forward (a pre-hook's, as
                # torch.nn.utils.weight_norm's) is a non-leaf whose graph the real step's backward needs
                torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=True, retain_graph=True)

    return run


def _cast_work(args: tuple[Any, ...], params: Sequence[torch.Tensor], dtype: torch.dtype) -> Callable[[], None]:
    """The casts a low-precision call adds: inputs and parameters to ``dtype``, and about as
    much again for the output's cast and, in backward, the gradients'."""
    tensors = [*[a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()], *params]

    def casts() -> None:
        for t in tensors:
            t.detach().to(dtype)
        for t in tensors:
            t.detach().to(dtype).float()

    return casts


def _to_float32(values: Any) -> Any:
    if isinstance(values, dict):
        return {k: _to_float32(v) for k, v in values.items()}
    if isinstance(values, tuple):
        return tuple(_to_float32(v) for v in values)
    if isinstance(values, torch.Tensor) and values.dtype in (torch.bfloat16, torch.float16):
        return values.float()
    return values


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor)), None)
    return None


def _fork_rng(device_type: str) -> Any:
    """Restore the CPU's and (where the device module keeps one) the device's RNG state after."""
    try:
        keeps = hasattr(torch.get_device_module(device_type), "get_rng_state")
    except (RuntimeError, AttributeError):
        keeps = False
    return torch.random.fork_rng(devices=None if keeps else [], device_type=device_type)


@contextlib.contextmanager
def kept_buffers(module: nn.Module) -> Iterator[None]:
    """The buffers of ``module`` (and of its submodules and parametrizations) as they were,
    after the measurement's extra calls: a forward may update them in place (BatchNorm's
    running statistics, spectral norm's power iteration) or put a new tensor in their place
    (``self.center = 0.9 * self.center + ...``): the same tensors, with their values, are put
    back.  A buffer no call changed is not written (its version stays: the real call's graph
    may hold it, as pruning's mask does, and autograd refuses a tensor changed in place)."""
    saved = [
        (owner, name, b, b._version, b.detach().clone())
        for owner in module.modules()
        for name, b in owner._buffers.items()
        if b is not None
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for owner, name, buffer, version, value in saved:
                if owner._buffers.get(name) is not buffer:
                    owner._buffers[name] = buffer
                if buffer._version != version or not torch.equal(buffer, value):  # (kernels' own writes:
                    buffer.copy_(value)  # BatchNorm's statistics move no version)


def summary(times: Sequence[float]) -> tuple[float, float]:
    """The median of ``times`` and their spread: the range without the highest and lowest
    run (with four runs or more; without the highest and lowest quarter with eight or
    more), over the median.

    Example::

        >>> summary([10.0, 11.0, 10.5, 90.0])
        (10.75, 0.046511627906976744)
        >>> summary([10.0, 10.2, 10.1, 10.0, 10.1, 10.2, 90.0, 95.0])[1]
        0.00985221674876844
    """
    ordered = sorted(times)
    median = statistics.median(ordered)
    cut = max(1, len(ordered) // 4)
    kept = ordered[cut:-cut] if len(ordered) >= 4 else ordered
    return median, (kept[-1] - kept[0]) / median if median > 0 else 0.0


def _rounds(
    clock: Clock, fp32: Callable[[], None], low: Callable[[], None], budget_ms: float
) -> tuple[list[float], list[float]]:
    """Warm both candidates, then time them in alternation (see the module docstring); the
    tries a host clock timed again (:func:`~._hostclock.lost`) count against the share once
    :data:`MIN_RUNS` rounds are timed (before, the rounds' own time only: a busy machine
    cannot leave a class with fewer rounds than a figure needs)."""
    lost_from = lost(clock)
    spent = clock(fp32, "fp32") + clock(low, "low")  # warm-up: one-time set-up, not timed
    a: list[float] = []
    b: list[float] = []
    while len(a) < MAX_ROUNDS:
        a.append(clock(fp32, "fp32"))
        b.append(clock(low, "low"))
        spent += a[-1] + b[-1]
        clear = min(b) > _CLEARLY_SLOWER * max(a) or min(a) > _CLEARLY_SLOWER * max(b)
        over = spent + a[-1] + b[-1] > budget_ms  # the next round would pass the class's share
        retried = spent + lost(clock) - lost_from + a[-1] + b[-1] > budget_ms  # ... with the tries timed again
        if (len(a) >= 2 and (clear or over)) or (over and spent > budget_ms) or (len(a) >= MIN_RUNS and retried):
            break
        if len(a) % MAX_RUNS == 0 and not _unsettled(a, b):  # looks after 7, 14 rounds (few looks)
            break
    return a, b


def figures(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float, float, int]:
    """``(fp32, fp32 spread, low, low spread, rounds)`` of paired runs ``a`` (float32) and
    ``b`` (low precision), of the rounds no spike hit (:func:`~._spikes.kept`).

    Example::

        >>> figures([10.0, 10.0, 16.0, 10.0], [8.0, 8.0, 8.0, 8.0])  # a spike in the third round
        (10.0, 0.0, 8.0, 0.0, 3)
    """
    rounds = kept({"fp32": a, "low": b})
    fp32, fp32_spread = summary(rounds["fp32"])
    low, low_spread = summary(rounds["low"])
    return fp32, fp32_spread, low, low_spread, len(rounds["fp32"])


def _unsettled(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether float32 looks faster beyond the margin but within the noise (more rounds
    would say, :func:`~._spikes.ambiguous`)."""
    fp32, fp32_spread, low, low_spread, runs = figures(a, b)
    return fp32 > 0 and ambiguous(low / fp32 - 1.0, band(max(fp32_spread, low_spread), runs), MARGIN)


def measure(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device_type: str,
    dtype: torch.dtype,
    clock: Clock,
    budget_ms: float = 400.0,
) -> Costs:
    """Measure one call of ``module`` (``module.forward(*args, **kwargs)``) in float32 and in
    ``dtype`` with ``clock``; the module's parameters, gradients and hooks are left
    untouched (gradients are taken with :func:`torch.autograd.grad`, the parameters' own
    hooks silent: :func:`~._kept.muted_hooks`), the RNG state and the buffers are restored.
    """
    grad = torch.is_grad_enabled()
    params = [p for p in module.parameters() if p.requires_grad] if grad else []
    with (
        _fork_rng(device_type),
        kept_buffers(module),
        muted_hooks(params),
        torch.enable_grad() if grad else torch.no_grad(),
    ):
        fp32_run = _one_call(module, args, kwargs, params, grad, device_type, None)
        low_run = _one_call(module, args, kwargs, params, grad, device_type, dtype)
        a, b = _rounds(clock, fp32_run, low_run, budget_ms)
        casts = _cast_work(args, params, dtype)
        clock(casts, "casts")
        cast = statistics.median(clock(casts, "casts") for _ in range(MIN_RUNS))
    fp32, fp32_spread, low, low_spread, runs = figures(a, b)
    estimated = len(a) < MIN_RUNS
    return Costs(fp32, low, min(cast, low), estimated, fp32_spread, low_spread, runs, spikes=len(a) - runs)
