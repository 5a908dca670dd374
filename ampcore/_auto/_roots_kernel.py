"""Putting the compiled settled path of auto root calls (:mod:`._kernel`,
``roots_kernel.cpp``) in place of :mod:`._roots`' Python sentinel and root post-hook, and
back; and telling torch.compile to trace the Python ones in their place.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from . import _hooks
from ._cache import plans as _plans
from ._program import local as _prog
from ._roots import _root_post, _sentinel, _sentinel_off, _sentinel_on
from ._roots_state import (
    _GLOBAL_PRE,
    _autocast_enabled,
    _compiler,
    _hooks_now,
    _Last,
    _local,
    _num_threads,
    _set_autocast,
    _thread,
)

__all__ = ["dynamo_ready", "use_compiled", "use_python"]


def use_compiled(module: Any) -> None:
    """Put the compiled settled path (the built extension ``module``) in place of the Python one."""
    module.configure(
        _prog, _local, _thread, _plans, _compiler, _GLOBAL_PRE, _sentinel, _root_post, _sentinel_off,
        _sentinel_on, torch.is_grad_enabled, _num_threads, _autocast_enabled, _set_autocast, torch.Tensor,
        torch.float32, _Last, _hooks._process, dynamo_ready,
    )  # fmt: skip
    _hooks_now.pre, _hooks_now.post = module.sentinel, module.post
    _hooks_now.watch = _hooks_now.traced is not module.sentinel
    if _hooks_now.watch and "torch._dynamo" in sys.modules:
        dynamo_ready()


def use_python() -> None:
    """The Python settled path again (tests, benchmarks)."""
    _hooks_now.pre, _hooks_now.post = _sentinel, _root_post
    _hooks_now.watch = False


def dynamo_ready() -> None:
    """torch._dynamo was imported (the compiled hooks and region entries check): its traces
    inline the Python hooks in place of the compiled ones, which it cannot trace (a graph
    break at every module call), as they did before there were compiled ones."""
    pre, post = _hooks_now.pre, _hooks_now.post
    _hooks_now.watch = False
    if pre is _sentinel or _hooks_now.traced is pre:
        return
    try:
        from torch.compiler import substitute_in_graph

        substitute_in_graph(pre, skip_signature_check=True)(_sentinel)
        substitute_in_graph(post, skip_signature_check=True)(_root_post)
        _hooks_now.traced = pre
    except Exception:  # noqa: BLE001 - a torch that cannot take them: the Python hooks
        use_python()
