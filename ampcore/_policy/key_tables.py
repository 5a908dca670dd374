r"""Key tables: the policy kernels' dispatch key, the device types (:class:`Client`\ s) it
serves, and each call's route on it, remembered per key set.

A :class:`KeyTable` is what :mod:`ampcore._policy.registration` fills (one per dispatch key
ampcore registers kernels on) and what every kernel of :mod:`ampcore._policy.kernels` reads
first on each call: which client's tensors the call is on, and the call's key set below the
table's key and below autocast.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import torch

from .._errors import AmpcoreError
from .casting import OnDevice
from .torch_tables import AUTOCAST_DISPATCH_KEYS, DEFAULT_DISPATCH_KEY

__all__ = ["Client", "KeyTable", "Routed", "all_autocast_keys", "dispatch_key"]


@functools.lru_cache(maxsize=64)  # regions switch keys by name on entry: parsed once
def dispatch_key(name: str) -> torch._C.DispatchKey:
    """The dispatch key called ``name``; AmpcoreError when this torch has none."""
    key = torch._C._parse_dispatch_key(name)
    if key is None:
        raise AmpcoreError(f"this torch has no dispatch key {name}; ampcore cannot give this device type op policies")
    return key


@functools.cache
def all_autocast_keys() -> torch._C.DispatchKeySet:
    """Every autocast key of this torch (excluded while a policy kernel calls the op)."""
    result = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    for name in (DEFAULT_DISPATCH_KEY, *AUTOCAST_DISPATCH_KEYS.values()):
        key = torch._C._parse_dispatch_key(name)
        if key is not None:
            result = result | torch._C.DispatchKeySet(key)
    return result


@dataclass(frozen=True)
class Client:
    """A device type whose policy kernels live on a :class:`KeyTable`'s key.

    ``provider`` (resident clients: the kernels sit on the device's own autocast key) gives
    the policy of the backend's O1 lists for an autocast dtype, applied when no region of
    ampcore is active.  ``native`` maps an overload to the action of the device's own (torch's)
    autocast kernel: a policy that agrees passes the call on to it instead of casting in Python.
    ``own`` is every castable overload with a kernel on the device's own autocast key (a
    vendor's too): the others may go without a kernel of ampcore's (decisions.needs_kernel).
    """

    device_type: str
    key: torch._C.DispatchKey  # its autocast key (excluded while its autocast is off)
    backend: torch._C.DispatchKey  # its backend key (in the key set of a call on its tensors)
    on_device: OnDevice  # whether a tensor is on the device type (casting.eligible adds the dtype)
    provider: Callable[[torch.dtype], Any] | None = None
    native: Mapping[str, str] = field(default_factory=dict)
    own: frozenset[str] = frozenset()


class KeyTable:
    """The kernels registered on one dispatch key and the device types they serve.

    A call is routed to the clients whose backend key is in its key set; a client's policy
    applies when its autocast key is not excluded in the calling thread (the autocast key
    itself cannot tell: the dispatcher leaves it out of the key set of ops it has no kernel
    for).
    """

    def __init__(self, key_name: str) -> None:
        self.key_name = key_name
        key = dispatch_key(key_name)
        self.key = key
        #: every key below this one: the call as if this kernel were not there
        self.passthrough = torch._C._dispatch_keyset_full_after(key)
        #: the same without any autocast key: below autocast
        self.below = self.passthrough - all_autocast_keys()
        #: (clients, keyset raw repr -> Routed), replaced as a pair (never mutated but for
        #: adding to the cache) when a device type is routed here, so a kernel reads a
        #: consistent pair without a lock
        self.state: tuple[tuple[Client, ...], dict[int, Routed]] = ((), {})

    @property
    def clients(self) -> tuple[Client, ...]:
        """The device types served here, the highest-priority device key first."""
        return self.state[0]

    @clients.setter
    def clients(self, clients: tuple[Client, ...]) -> None:
        self.state = (tuple(clients), {})

    def routed(self, keyset: torch._C.DispatchKeySet) -> Routed:
        """Where a call with ``keyset`` goes: remembered per key set (a few per process: the
        key sets of the tensors in use under the thread-local include/exclude sets), since
        intersecting key sets per call costs more than a dictionary lookup."""
        clients, seen = self.state
        raw = keyset.raw_repr()
        found = seen.get(raw)
        if found is None:
            mine = tuple(c for c in clients if keyset.has(c.backend))
            found = Routed(mine, keyset & self.passthrough, keyset & self.below)
            if len(seen) < _MAX_ROUTED:
                seen[raw] = found
        return found


class Routed(NamedTuple):
    """A call's route on a :class:`KeyTable`: the clients whose tensors it has (in priority
    order), and its key set without the keys down to the table's own and down to autocast."""

    clients: tuple[Client, ...]
    after: torch._C.DispatchKeySet
    below: torch._C.DispatchKeySet


#: Key sets remembered per table at most (beyond it, routes are computed per call).
_MAX_ROUTED: Final = 256
