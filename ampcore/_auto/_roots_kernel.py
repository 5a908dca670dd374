"""Putting the compiled settled path of auto root calls (:mod:`._kernel`,
``roots_kernel.cpp``) in place of :mod:`._roots`' Python sentinel, root post-hook and
region entry and exit (the level hooks ``ampcore.autocast`` calls: attributes of the
module), and back; and telling torch.compile to trace the Python hooks in their place.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from . import _hooks, _roots
from ._cache import plans as _plans
from ._program import local as _prog
from ._roots import _hook_public, _root_post, _sentinel, _sentinel_off, _sentinel_on
from ._roots_state import (
    _GLOBAL_PRE,
    _autocast_enabled,
    _compiler,
    _hooks_now,
    _Last,
    _local,
    _Module,
    _num_threads,
    _set_autocast,
    _thread,
)

__all__ = ["dynamo_ready", "paths", "use_compiled", "use_paths", "use_python"]

#: the Python region entry and exit (``_roots``' attributes are the compiled ones while in use)
_ENTERED: Any = _roots.region_entered
_EXITED: Any = _roots.region_exited


def paths() -> tuple[Any, ...]:
    """The hooks in use (for :func:`use_paths`: tests, benchmarks)."""
    return (_hooks_now.pre, _hooks_now.post, _roots.region_entered, _roots.region_exited, _hooks_now.watch)


def use_paths(kept: tuple[Any, ...]) -> None:
    """Put back the hooks :func:`paths` gave."""
    _hooks_now.pre, _hooks_now.post, _roots.region_entered, _roots.region_exited, _hooks_now.watch = kept


def use_compiled(module: Any) -> None:
    """Put the compiled settled path (the built extension ``module``) in place of the Python one."""
    module.configure(
        _prog, _local, _thread, _plans, _compiler, _GLOBAL_PRE, _sentinel, _root_post, _sentinel_off,
        _sentinel_on, torch.is_grad_enabled, _num_threads, _autocast_enabled, _set_autocast, torch.Tensor,
        torch.float32, _Last, _hooks._process, dynamo_ready, _ENTERED, _EXITED, _hook_public, _Module,
        _hooks.region_threads,
    )  # fmt: skip
    _hooks_now.pre, _hooks_now.post = module.sentinel, module.post
    _roots.region_entered, _roots.region_exited = module.region_entered, module.region_exited
    _hooks_now.watch = _hooks_now.traced is not module.sentinel
    if _hooks_now.watch and "torch._dynamo" in sys.modules:
        dynamo_ready()


def use_python() -> None:
    """The Python settled path again (tests, benchmarks)."""
    _hooks_now.pre, _hooks_now.post = _sentinel, _root_post
    _roots.region_entered, _roots.region_exited = _ENTERED, _EXITED
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
