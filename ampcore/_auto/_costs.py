"""The cost model of ``level="auto"``: measured costs of one shape class and the decision.

:func:`decide` is a pure function of :class:`Costs`; :func:`measure` takes them with short
micro-benchmarks of the module call the model actually made (same module, same inputs),
forward and backward:

* ``fp32_ms``: the call with autocast off and float32 inputs;
* ``low_ms``: the call under autocast in the low-precision dtype, *including* the casts it
  needs: inputs and weights to low precision (weights re-cast every call, as every step
  does), the output back to float32 for a float32 consumer, and the gradients' casts;
* ``cast_ms``: the casts alone (part of ``low_ms``), to explain the decision.

Bounded: each path runs once untimed (the first call of a shape pays one-time set-up: up
to seconds for a process's first matrix product) and then repeats only while its share of
the budget lasts (best time kept, at least one timed run).  A low-precision path that is
clearly slower (more than twice float32) on a probe of an eighth of the batch is not run
in full (``estimated``: the probe's time times eight); one whose first run is clearly slower
and over its share is not repeated (``estimated``: float32 is the safe side to err on).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

import torch
from torch import nn

__all__ = ["MARGIN", "Costs", "Decision", "decide", "measure"]

Decision = Literal["low", "fp32"]

#: Low precision must save at least this fraction of the float32 cost to be chosen (ties and
#: noise keep float32: better numerics at no cost).
MARGIN: Final = 0.05
#: A probe on 1/PROBE of the rows that already costs this many times float32 decides fp32.
PROBE: Final = 8
_CLEARLY_SLOWER: Final = 2.0
#: Only calls whose float32 path takes this long are probed (a probe's fixed costs would
#: weigh too much on small ones).
_PROBE_ABOVE_MS: Final = 20.0


@dataclass(frozen=True)
class Costs:
    """Measured milliseconds of one call of a shape class, forward and backward."""

    fp32_ms: float
    low_ms: float  # including cast_ms
    cast_ms: float
    estimated: bool = False  # low_ms extrapolated from a probe on part of the batch

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(costs: Costs, margin: float = MARGIN) -> Decision:
    """``"low"`` when the low-precision path (casts included) saves more than ``margin`` of
    the float32 cost, else ``"fp32"``.

    Example::

        >>> decide(Costs(fp32_ms=10.0, low_ms=6.0, cast_ms=1.0))
        'low'
        >>> decide(Costs(fp32_ms=10.0, low_ms=9.8, cast_ms=2.0))
        'fp32'
    """
    return "low" if costs.low_ms < costs.fp32_ms * (1.0 - margin) else "fp32"


def _timed(run: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    run()
    sync()
    return (time.perf_counter() - start) * 1e3


def _best(run: Callable[[], None], sync: Callable[[], None], budget_ms: float, first: float | None = None) -> float:
    """Best time of ``run`` after a warm-up run, repeating while ``budget_ms`` lasts (>= 1 timed run)."""
    first = _timed(run, sync) if first is None else first
    best = _timed(run, sync)
    spent = first + best
    while spent + best < budget_ms and spent < 50 * max(best, 1e-3):
        t = _timed(run, sync)
        spent += t
        best = min(best, t)
    return best


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
    """One timed call of ``module`` (forward, and backward with ``grad``) on fresh leaves of
    the arguments: in float32, or under torch's autocast in ``low``."""
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
                torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=True)

    return run


def _cast_work(args: tuple[Any, ...], params: Sequence[torch.Tensor], dtype: torch.dtype) -> Callable[[], None]:
    """The casts a low-precision call adds: inputs and parameters to ``dtype``, and about as
    much again for the output's cast and, in backward, the gradients'."""

    def casts() -> None:
        for t in (*[a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()], *params):
            t.detach().to(dtype)
        for t in (*[a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()], *params):
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


def _rows(args: tuple[Any, ...], kwargs: dict[str, Any], keep: int) -> tuple[tuple[Any, ...], bool]:
    """``args`` with every tensor's first dimension cut to ``keep`` rows (False: not possible)."""
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return args, False
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or any(t.dim() == 0 or t.shape[0] != tensors[0].shape[0] for t in tensors):
        return args, False
    return tuple(a[:keep] if isinstance(a, torch.Tensor) else a for a in args), True


def _fork_rng(device_type: str) -> Any:
    """Restore the CPU's and (where the device module keeps one) the device's RNG state after."""
    try:
        keeps = hasattr(torch.get_device_module(device_type), "get_rng_state")
    except (RuntimeError, AttributeError):
        keeps = False
    return torch.random.fork_rng(devices=None if keeps else [], device_type=device_type)


def measure(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device_type: str,
    dtype: torch.dtype,
    sync: Callable[[], None],
    budget_ms: float = 400.0,
) -> Costs:
    """Measure one call of ``module`` (``module.forward(*args, **kwargs)``) in float32 and in
    ``dtype``; the module's parameters, gradients and hooks are left untouched (gradients are
    taken with :func:`torch.autograd.grad`) and the RNG state is restored.
    """
    grad = torch.is_grad_enabled()
    params = [p for p in module.parameters() if p.requires_grad] if grad else []

    def path(low: bool, call_args: tuple[Any, ...]) -> Callable[[], None]:
        return _one_call(module, call_args, kwargs, params, grad, device_type, dtype if low else None)

    casts = _cast_work(args, params, dtype)

    with _fork_rng(device_type), torch.enable_grad() if grad else torch.no_grad():
        share = budget_ms / 3
        fp32 = _best(path(False, args), sync, share)
        cast = _best(casts, sync, share / 4)
        rows = next((a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.dim()), 0)
        if rows >= 2 * PROBE and fp32 >= _PROBE_ABOVE_MS:  # small calls are cheap to run in full
            part, ok = _rows(args, kwargs, rows // PROBE)
            if ok:
                probe = _best(path(True, part), sync, 0.0)
                if probe * PROBE > _CLEARLY_SLOWER * fp32:
                    return Costs(fp32, probe * PROBE, cast, estimated=True)
        run_low = path(True, args)
        first = _timed(run_low, sync)
        if first > _CLEARLY_SLOWER * fp32 and first > share:
            return Costs(fp32, first, cast, estimated=True)  # expensive and clearly slower: one run
        low = _best(run_low, sync, share, first)
    return Costs(fp32, low, cast)
