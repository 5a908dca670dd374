"""Activation checkpointing under ampcore's policies.

``torch.utils.checkpoint`` recomputes a checkpointed function during backward, with the
``torch.autocast`` flags it saved in the forward pass restored, but nothing else of the
forward's thread state: an ampcore policy (custom lists, OD, O2) would be missing, and the
recomputation would produce other dtypes (non-reentrant checkpoints raise CheckpointError;
reentrant ones silently compute other gradients).

So the first enabled region wraps the two entry points torch's ``checkpoint`` (and
every caller of it: Hugging Face's gradient checkpointing, selective activation
checkpointing) goes through, ``_checkpoint_without_reentrant_generator`` and
``CheckpointFunction.apply``: while a policy is active, the checkpointed function is
wrapped so that, when it runs again without that policy (the recomputation), the policy
and its shadow keys are put back around it, exactly as in the forward pass; and a
reentrant recomputation's inputs are kept out of the weight-cast caches (see
:func:`_uncached`), at every level.  Outside ampcore's regions the wrappers pass everything
through untouched.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint

from .._forklock import LOCK
from .key_tables import dispatch_key
from .registration import routes
from .thread_state import thread_state

__all__ = ["install"]

_installed = False


def _snapshot() -> dict[str, Any]:
    """The policies in force in this thread, by device type (empty: none)."""
    return {device_type: policy for device_type, policy in thread_state().policies.items() if policy is not None}


@contextlib.contextmanager
def _restored(policies: dict[str, Any]) -> Iterator[None]:
    state = thread_state()
    previous = dict(state.policies)
    keys = {routes()[device_type].key for device_type in policies if not routes()[device_type].resident}
    saved = []
    for name in keys:
        key = dispatch_key(name)
        included = torch._C._dispatch_tls_is_dispatch_key_included(key)
        saved.append((key, included, torch._C._dispatch_tls_is_dispatch_key_excluded(key)))
        torch._C._dispatch_tls_set_dispatch_key_included(key, True)
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    state.replace_policies({**previous, **policies})
    # a recomputation has its own weight-cast cache: one filled here (typically in backward,
    # outside any region) would otherwise outlive it and hand the next step's forward the
    # previous step's cast weights
    outer_cache, state.cast_cache = state.cast_cache, {}
    try:
        yield
    finally:
        state.cast_cache = outer_cache
        state.replace_policies(previous)
        for key, included, excluded in saved:
            torch._C._dispatch_tls_set_dispatch_key_included(key, included)
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)


def _carry(function: Callable[..., Any], reentrant: bool) -> Callable[..., Any]:
    """``function``, made to run under the current policies wherever it runs again (and, for
    a ``reentrant`` checkpoint, from inputs the cast caches skip)."""
    policies = _snapshot()
    if not policies and not thread_state().stack:
        return function  # outside ampcore's regions: untouched
    leaves: list[bool] = []  # per positional argument: a leaf in the forward pass

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        state = thread_state()
        current = state.policies
        # the forward pass: inside the region (at O1, with no policy: inside any region)
        if (policies or state.stack) and all(current.get(d) is policy for d, policy in policies.items()):
            leaves[:] = [isinstance(a, torch.Tensor) and a.is_leaf for a in args]
            return function(*args, **kwargs)  # the forward pass, inside the region
        with _restored(policies):  # the recomputation
            return function(*_uncached(args, leaves), **kwargs) if reentrant else function(*args, **kwargs)

    return run


def _uncached(args: tuple[Any, ...], leaves: list[bool]) -> tuple[Any, ...]:
    """The recomputation's arguments, kept out of the weight-cast caches (torch's and ampcore's).

    A reentrant checkpoint recomputes from detached copies of its inputs: leaves that require
    grad, which the caches take for weights.  An input that was computed in the forward pass
    (a block's float32 input feeding two convolutions) would then be cast once and shared,
    its gradients summed in low precision, where the forward pass cast it per use.  An
    identity view (the caches skip views; its gradient is exact) restores the forward's casts.
    """
    return tuple(
        arg.view_as(arg)
        if isinstance(arg, torch.Tensor) and arg.is_leaf and arg.requires_grad and not (i < len(leaves) and leaves[i])
        else arg
        for i, arg in enumerate(args)
    )


def install() -> None:
    """Wrap torch's checkpoint entry points (once per process; idempotent)."""
    global _installed
    if _installed:
        return
    with LOCK:
        if _installed:
            return
        generator = torch_checkpoint._checkpoint_without_reentrant_generator

        @functools.wraps(generator)
        def without_reentrant(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return generator(_carry(fn, reentrant=False), *args, **kwargs)

        function_class = torch_checkpoint.CheckpointFunction

        class CheckpointFunction(function_class):  # type: ignore[misc, valid-type]
            @classmethod
            def apply(cls, run_function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
                return function_class.apply(_carry(run_function, reentrant=True), *args, **kwargs)

        torch_checkpoint._checkpoint_without_reentrant_generator = without_reentrant
        torch_checkpoint.CheckpointFunction = CheckpointFunction  # type: ignore[misc]
        _installed = True
