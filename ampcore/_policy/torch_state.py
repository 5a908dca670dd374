"""torch's autocast state entered by a region: through a ``torch.autocast`` object the first
time, then directly on torch's thread-local setters (issue 26 item 3).

A ``torch.autocast`` object costs a region more than everything else it does: its
``__init__`` validates the device type and dtype (and may turn autocast off with a warning
where the dtype is not supported), and ``__enter__``/``__exit__`` are Python.  What they
change is a handful of thread-local flags.  So a region enters the first time for each
(device type, dtype, enabled) through the object, and once torch accepted the combination
(``ampcore.autocast`` checks that autocast came on with the dtype) it sets the same flags
with torch's C setters, in the same order, and restores them on exit as ``__exit__`` does
(clearing the weight-cast cache when the outermost autocast exits).  Under a
``TorchFunctionMode`` other than ampcore's own guard modes (``torch.export`` traces regions
through ``PreDispatchTorchFunctionMode``, which must see ``torch.amp._enter_autocast``) the
object is always used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

from .compile import foreign_mode
from .key_tables import dispatch_key
from .registration import OpPolicy, Route, region_entry

__all__ = [
    "CompiledRegion",
    "DirectAutocast",
    "accepted",
    "compiled_call",
    "enter_compiled",
    "enter_region_state",
    "enter_torch_autocast",
    "fast",
    "restore",
    "switch_on",
]

_is_enabled: Final = torch.is_autocast_enabled
_set_enabled: Final = torch.set_autocast_enabled
_get_dtype: Final = torch.get_autocast_dtype
_set_dtype: Final = torch.set_autocast_dtype
_cache_enabled: Final = torch.is_autocast_cache_enabled
_set_cache_enabled: Final = torch.set_autocast_cache_enabled
_increment: Final = torch.autocast_increment_nesting
_decrement: Final = torch.autocast_decrement_nesting
_clear_cache: Final = torch.clear_autocast_cache
_function_mode: Final = torch._C._is_torch_function_mode_enabled

#: (device type, dtype, enabled) that torch.autocast accepted as asked in this process
_ACCEPTED: set[tuple[str, torch.dtype, bool]] = set()


class DirectAutocast:
    """The flags ``torch.autocast(device_type, dtype, enabled, cache_enabled)`` sets on
    entry, set directly; :meth:`__exit__` restores them as torch's ``__exit__`` does.
    ``ampcore.autocast.__enter__``/``__exit__`` carry out the same steps inline on an entry
    plan (a region made per step: two Python calls fewer); keep them alike."""

    __slots__ = ("device_type", "previous", "previous_cache", "previous_dtype")

    def __init__(self, device_type: str, dtype: torch.dtype, enabled: bool, cache_enabled: bool | None) -> None:
        self.device_type = device_type
        self.previous_cache = _cache_enabled()
        self.previous = _is_enabled(device_type)
        self.previous_dtype = _get_dtype(device_type)
        _set_enabled(device_type, enabled)
        _set_dtype(device_type, dtype)
        _increment()
        if cache_enabled is not None:  # None: torch.autocast sets it to what it was
            _set_cache_enabled(cache_enabled)

    def __exit__(self, *exc_info: Any) -> None:
        if _decrement() == 0:  # the outermost autocast of the thread: torch drops its cast cache
            _clear_cache()
        _set_enabled(self.device_type, self.previous)
        _set_dtype(self.device_type, self.previous_dtype)
        _set_cache_enabled(self.previous_cache)


class CompiledRegion(tuple[Any, ...]):
    """:class:`DirectAutocast`, the shadow key switched on and the thread's table of the
    compiled kernels set, in one call of the extension each way (``enter`` / ``leave`` of
    policy_kernel.cpp): ``(leave, entry id, saved state)``, a tuple so that
    ``autocast.__enter__`` makes one without a Python call."""

    __slots__ = ()

    def __exit__(self, *exc_info: Any) -> None:
        self[0](self[1], self[2])


#: (module, enter arguments) -> the extension's id of that region entry (add_entry); its
#: entries are process-wide and only grow, as this memo does.
_ENTRY_IDS: dict[tuple[Any, ...], int] = {}


def compiled_call(
    entry: tuple[Any, ...], enabled: bool, cache_enabled: bool | None
) -> tuple[Callable[[int], int], int, Callable[[int, int], None]] | None:
    """From ``(module, (device type id, dtype id, slot, table, key))`` (see
    :func:`~ampcore._policy.registration.region_entry`): the extension's ``enter``, the id of
    this entry and its ``leave``; None where the extension holds no more entries."""
    module, (device_type, dtype, slot, table, key) = entry
    cache = -1 if cache_enabled is None else int(cache_enabled)
    arguments = (device_type, dtype, enabled, cache, slot, table, key)
    found = _ENTRY_IDS.get((module, arguments))
    if found is None:
        found = int(module.add_entry(*arguments))
        if found < 0:
            return None
        _ENTRY_IDS[(module, arguments)] = found
    return module.enter, found, module.leave


def enter_compiled(entry: tuple[Any, ...], enabled: bool, cache_enabled: bool | None) -> CompiledRegion | None:
    """Enter a region in one call of the extension (``entry``: see :func:`compiled_call`)."""
    call = compiled_call(entry, enabled, cache_enabled)
    if call is None:
        return None
    enter, found, leave = call
    return CompiledRegion((leave, found, enter(found)))


def fast(device_type: str, dtype: torch.dtype, enabled: bool) -> bool:
    """Whether torch's flags for this region may be set directly (see the module docstring)."""
    return (device_type, dtype, enabled) in _ACCEPTED and not (_function_mode() and foreign_mode())


def enter_torch_autocast(device_type: str, dtype: torch.dtype, enabled: bool, cache_enabled: bool | None) -> Any:
    """Enter torch's autocast for a region; the object whose ``__exit__`` leaves it."""
    if fast(device_type, dtype, enabled):
        return DirectAutocast(device_type, dtype, enabled, cache_enabled)
    region = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    region.__enter__()
    return region


def accepted(device_type: str, dtype: torch.dtype, enabled: bool) -> None:
    """torch.autocast entered ``(device_type, dtype, enabled)`` as asked: later regions may
    set its flags directly."""
    _ACCEPTED.add((device_type, dtype, enabled))


def enter_region_state(
    device_type: str,
    dtype: torch.dtype,
    enabled: bool,
    cache_enabled: bool | None,
    policy: OpPolicy | None,
    found: Route | None,
) -> Any:
    """Enter torch's autocast state for a region: with the shadow key and the compiled
    kernels' table in one call (:class:`CompiledRegion`) where that executor serves the
    region's shadow route and torch accepted these flags before."""
    if found is not None and policy is not None and not found.resident and fast(device_type, dtype, enabled):
        entry = region_entry(device_type, policy, dtype)
        region = None if entry is None else enter_compiled(entry, enabled, cache_enabled)
        if region is not None:
            return region
    return enter_torch_autocast(device_type, dtype, enabled, cache_enabled)


def switch_on(key_name: str) -> tuple[torch._C.DispatchKey, bool, bool]:
    """Include shadow key ``key_name`` in this thread's dispatch; what to restore on exit."""
    key = dispatch_key(key_name)
    included = torch._C._dispatch_tls_is_dispatch_key_included(key)
    saved = (key, included, torch._C._dispatch_tls_is_dispatch_key_excluded(key))
    torch._C._dispatch_tls_set_dispatch_key_included(key, True)
    torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    return saved


def restore(
    state: Any,
    device_type: str,
    policy: OpPolicy | None,
    previous: OpPolicy | None,
    mode: Any,
    shadow: tuple[torch._C.DispatchKey, bool, bool] | None,
    torch_region: Any,
    exc_info: tuple[Any, Any, Any] | None,
) -> None:
    """Undo what entering a region of ``policy`` changed, innermost change first."""
    if type(torch_region) is CompiledRegion:  # its exit restores the compiled kernels' table
        if previous is None:
            state.policies.pop(device_type, None)
        else:
            state.policies[device_type] = previous
    elif policy is not None or previous is not None:  # else the entry left the policies alone
        state.set_policy(device_type, previous, keep_none=False)
    try:
        if mode is not None:
            mode.__exit__(None, None, None)
    finally:
        if shadow is not None:
            key, included, excluded = shadow
            torch._C._dispatch_tls_set_dispatch_key_included(key, included)
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)
        torch_region.__exit__(*(exc_info or (None, None, None)))
