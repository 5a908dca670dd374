"""Thread-local region state: the stack of active ``ampcore.autocast`` regions of a thread.

ampcore's mutable state is of two kinds, and this module holds the first:

* per thread (here): the active regions, the op policy in force per device type (read by
  every policy kernel) and the weight-cast cache of the thread's regions.  torch keeps its
  autocast flags thread-local too, so a region entered in one thread changes nothing in
  another;
* per process: the dispatcher, where ampcore's kernels are registered once and never
  removed (:mod:`ampcore._policy.registration` owns that state and says why).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from .._backends.backend import Backend
    from .levels import Level

__all__ = ["MIRRORS", "ActiveRegion", "RegionSpec", "ThreadState", "current_region", "thread_state"]


class RegionSpec(NamedTuple):
    """What a region runs with (immutable).

    ``custom_white`` / ``custom_black`` are the region's custom lists merged with those of
    the enclosing region; ``policy`` is the policy its ops follow (``None``: torch's own
    lists, no ampcore kernel involved).
    """

    backend: Backend
    dtype: torch.dtype
    level: Level
    enabled: bool
    custom_white: frozenset[str] = frozenset()
    custom_black: frozenset[str] = frozenset()
    policy: Any = None


class ActiveRegion(NamedTuple):
    """One entered region: its spec and what its exit must restore (a named tuple: regions
    are entered on the hot path)."""

    owner: object  # the ampcore.autocast object that entered it
    spec: RegionSpec
    torch_region: Any  # the torch.autocast it entered
    previous_policy: Any  # the policy in force for the device type before it
    guard_mode: Any  # torch.compile guard mode, or None
    shadow: Any  # (dispatch key, was included, was excluded) when it switched a key on, or None
    context_outer: Any  # the innermost region of the entering context (asyncio task) before it


#: device type -> the function that hands its policy to the compiled kernel's thread-local
#: state (:mod:`ampcore._policy.compiled`), for the device types routed to compiled kernels.
#: Process-global because the dispatcher registrations it mirrors are; it only grows.
MIRRORS: dict[str, Callable[[Any], None]] = {}


class ThreadState(threading.local):
    """Per-thread state: region stack, active policy per device type, weight-cast cache.

    Policies change through :meth:`set_policy` / :meth:`replace_policies` only, which also
    hand them to the compiled kernel when it serves the device type (``policies`` is read
    directly by the Python kernels).
    """

    def __init__(self) -> None:
        self.stack: list[ActiveRegion] = []
        self.policies: dict[str, Any] = {}
        self.cast_cache: dict[tuple[int, torch.dtype], tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}

    def set_policy(self, device_type: str, policy: Any, keep_none: bool = True) -> None:
        """Put ``policy`` in force for ``device_type`` in this thread (``None``: no policy;
        removed from :attr:`policies` unless ``keep_none``)."""
        if policy is None and not keep_none:
            self.policies.pop(device_type, None)
        else:
            self.policies[device_type] = policy
        mirror = MIRRORS.get(device_type)
        if mirror is not None:
            mirror(policy)

    def replace_policies(self, policies: dict[str, Any]) -> None:
        """Put exactly ``policies`` in force (the others removed)."""
        changed = set(self.policies) | set(policies)
        self.policies.clear()
        self.policies.update(policies)
        for device_type in changed:
            mirror = MIRRORS.get(device_type)
            if mirror is not None:
                mirror(policies.get(device_type))


_state = ThreadState()


def thread_state() -> ThreadState:
    """The calling thread's state (the object itself is shared; its attributes are per thread)."""
    return _state


def current_region(device_type: str | None = None) -> RegionSpec | None:
    """The spec of this thread's innermost active region (of ``device_type`` if given), or None."""
    for region in reversed(_state.stack):
        spec: RegionSpec = region.spec
        if device_type is None or spec.backend.device_type == device_type:
            return spec
    return None
