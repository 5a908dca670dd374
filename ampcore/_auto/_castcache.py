"""The region's autocast weight cache around the whole-call check's runs (:mod:`._verify`).

A torch.autocast step casts each float32 weight to the low dtype once: autocast's cache
keeps the cast for the rest of the region (a layer applied in a loop, an RNN cell stepped
T times, a weight-tied embedding and head use one cast).  The check's timed runs must cost
what such a step costs, so each runs with the cache on, cleared before it (as a step's
region starts without cast weights) and after the last (the real call casts its own).

Clearing drops every cast in the thread's cache, also those of a call *before* the check
in the same region (the root at another batch size, gradient accumulation in one region,
a generator's earlier step): a later call would then cast again and its gradients would
sum in float32, not in the low dtype before one cast's backward as torch.autocast's do.
So where the cache may hold such a cast the check's runs go without the cache (a cast per
use: dearer than the step on looped weights, but the region's casts kept).  A cast in the
cache with gradients holds its weight's gradient accumulator alive (the cast's backward
node points to it): :func:`may_hold_casts` looks whether any known root's weight has one
(the accumulator is marked, dropped and looked up again: the mark survives only where
something else holds it), a look of a few microseconds per weight, once per check; a held
one is probed (:func:`_cached`: an op of autocast's list casts it again unless the cast is
cached), so accumulators held by a graph the user keeps or by DDP's reducer do not send the
check down the cache-off path (tested).  It errs toward "may hold" only where the probe
cannot tell (the op raises, or the device's list lacks it): then the check runs as before
the fourteenth stop.  Weights used by code in the region outside its roots are not looked
at (the cache's keys cannot be listed): their casts go with the check's clearing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, Final

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["kept_cache", "known_roots", "may_hold_casts"]

_MARK: Final = "ampcore-cast-probe"
_TO_COPY: Final = torch.ops.aten._to_copy.default


def _cacheable(p: torch.Tensor, device_type: str) -> bool:
    """Whether autocast's cache may hold a cast of ``p`` (a float32 leaf of the region's
    device type that requires grad and is no view)."""
    return (
        p.requires_grad and p.is_leaf and p.dtype == torch.float32 and p.device.type == device_type and not p._is_view()
    )


def _held(p: torch.Tensor) -> bool:
    """Whether something besides this look holds ``p``'s gradient accumulator."""
    marks: dict[str, Any] = get_gradient_edge(p).node.metadata  # type: ignore[assignment]  # (a property)
    marks[_MARK] = True
    del marks  # the last reference where nothing else holds it: the accumulator goes
    again: dict[str, Any] = get_gradient_edge(p).node.metadata  # type: ignore[assignment]
    return again.pop(_MARK, False) is True


class _Casts(TorchDispatchMode):
    """The storages of the float32 tensors cast while it is on."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.cast: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is _TO_COPY and args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float32:
            self.cast.add(args[0].data_ptr())
        return func(*args, **kwargs)


def _cached(params: list[torch.Tensor]) -> bool:
    """Whether autocast's cache holds a cast of one of ``params``: each goes through an op
    of autocast's low-precision list (``prelu``, in the region's autocast state) and one
    whose cast is not seen was cached (or the op casts nothing there: the same answer, the
    safe one).  The casts it makes stay in the cache where one was found (the same casts,
    with their graphs, a later call of the region would make) and go with the check's
    clearing where none was."""
    mode = _Casts()
    try:
        with torch.enable_grad(), mode:
            for p in params:
                torch.prelu(p, torch.ones(1, device=p.device))
    except Exception:  # a shape or device prelu refuses: what the cache holds is not known
        return True
    return any(p.data_ptr() not in mode.cast for p in params)


def may_hold_casts(modules: Iterable[nn.Module], device_type: str) -> bool:
    """Whether autocast's cache may hold a cast of a weight of ``modules``: a weight whose
    gradient accumulator something holds (a cast's graph, or another: the previous step's
    output, a DDP reducer) and whose cast an op of autocast's list does not make again.

    Example::

        >>> lin = torch.nn.Linear(2, 2)
        >>> may_hold_casts([lin], "cpu")
        False
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     out = lin(torch.ones(1, 2))
        ...     may_hold_casts([lin], "cpu")
        True
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):  # out's graph holds it, the cache not
        ...     may_hold_casts([lin], "cpu")
        False
    """
    seen: set[int] = set()
    held: list[torch.Tensor] = []
    with torch.enable_grad():
        for module in modules:
            for p in module.parameters():
                if id(p) not in seen and _cacheable(p, device_type):
                    seen.add(id(p))
                    if _held(p):
                        held.append(p)
    return bool(held) and _cached(held)


def known_roots(root: nn.Module) -> list[nn.Module]:
    """``root`` and the roots this thread's regions met (those a call before the check, in
    the same region, may have cast weights of)."""
    from ._roots_state import _local

    refs = [last.ref for last in list(_local.last.values())]
    refs += list(_local.called.values())
    for _, site, _ in _local.entered:
        refs += site.roots if site is not None else []
    found = {id(root): root}
    for ref in refs:
        module = ref()
        if module is not None:
            found.setdefault(id(module), module)
    return list(found.values())


@contextlib.contextmanager
def kept_cache(root: nn.Module, device_type: str) -> Iterator[None]:
    """Around the whole-call check of ``root``: autocast's cache as the region had it.  The
    runs use it (each clears it first, :class:`~._verify._Run`) and it is cleared after
    them, unless it may hold a cast made before the check (:func:`may_hold_casts` of the
    roots this thread knows): then the runs go without it, the region's casts kept."""
    if not torch.is_autocast_cache_enabled():
        yield
        return
    if torch.is_grad_enabled() and may_hold_casts(known_roots(root), device_type):
        torch.set_autocast_cache_enabled(False)
        try:
            yield
        finally:
            torch.set_autocast_cache_enabled(True)
        return
    try:
        yield
    finally:
        torch.clear_autocast_cache()  # the check's casts (their graphs the check's) not left for the real call
