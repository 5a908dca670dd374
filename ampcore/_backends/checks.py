"""What the core checks at the boundary with an adapter (pure functions, tested without devices).

* :func:`device_type_problem`: a ``BackendSpec.device_type`` torch does not know;
* :func:`indexed_device`: the ``device`` the overflow-flag hooks receive always has an index;
* :func:`result_problem`: a hook's result of the wrong class (each hook's expected class).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import torch

__all__ = [
    "MEMORY_KEYS",
    "current_index",
    "device_type_problem",
    "indexed_device",
    "memory_problem",
    "privateuse1_name",
    "result_problem",
    "torch_knows",
]

#: the ``ampcore_memory`` keys
MEMORY_KEYS: Final = ("in_use", "peak", "total")
_PRIVATEUSE1_DEFAULT: Final = "privateuseone"


def torch_knows(device_type: str) -> bool:
    """Whether ``torch.device(device_type)`` is valid in this process now."""
    try:
        torch.device(device_type)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def privateuse1_name() -> str:
    """What PrivateUse1 is called now (``privateuseone`` until an extension renames it)."""
    return str(torch._C._get_privateuse1_backend_name())


def device_type_problem(device_type: str, knows: bool, privateuse1: str, available: bool) -> str | None:
    """Why ``device_type`` cannot be the device type of an available backend, or ``None``.

    ``knows``: torch accepts it now; ``privateuse1``: PrivateUse1's current name;
    ``available``: the adapter said the backend can run.  An unknown device type is allowed
    while the backend is unavailable: a vendor extension renames PrivateUse1 when the
    availability hook imports it (the first-party ``npu`` adapter's ``"npu"`` is unknown to
    torch until ``torch_npu`` is imported, and stays unknown in a process whose PrivateUse1
    another extension took, where the backend is simply unavailable).

    Example::

        >>> device_type_problem("cuda", True, "privateuseone", True) is None
        True
        >>> device_type_problem("npu", False, "privateuseone", False) is None  # torch_npu not imported yet
        True
        >>> device_type_problem("bogusdev", False, "privateuseone", True)[:80]
        "device_type='bogusdev': torch knows no such device type, yet the backend says it"
    """
    if knows or not available:
        return None
    renamed = (
        f"PrivateUse1 is renamed to {privateuse1!r}"
        if privateuse1 != _PRIVATEUSE1_DEFAULT
        else "nothing renamed PrivateUse1 to it (torch.utils.rename_privateuse1_backend)"
    )
    return (
        f"device_type={device_type!r}: torch knows no such device type, yet the backend says it is available "
        f"({renamed}); the device type must be one torch knows (cpu, cuda, xpu, ... or the name the vendor "
        "extension gave PrivateUse1) by the time ampcore_unavailable_reason() returns None"
    )


def current_index(device_type: str) -> int:
    """The current device index of ``device_type`` (``torch.<type>.current_device()``), else 0."""
    current = getattr(getattr(torch, device_type, None), "current_device", None)
    try:
        index = current() if callable(current) else 0
    except Exception:  # a runtime that cannot answer: the first device
        return 0
    return index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else 0


def indexed_device(device: torch.device | str, current: Callable[[str], int] = current_index) -> torch.device:
    """``device`` with an index: the hooks that take a ``device`` always get one.

    Example::

        >>> indexed_device(torch.device("cpu")), indexed_device("cuda:1", lambda t: 0)
        (device(type='cpu', index=0), device(type='cuda', index=1))
    """
    device = torch.device(device)
    return device if device.index is not None else torch.device(device.type, current(device.type))


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def memory_problem(stats: object) -> str | None:
    """What is wrong with an ``ampcore_memory`` answer, or ``None``.

    Example::

        >>> memory_problem({"in_use": 5, "peak": None}) is None
        True
        >>> memory_problem({"in_use": "lots"})
        "'in_use' is 'lots'; expected an int number of bytes >= 0 or None"
    """
    if stats is None:
        return None
    if not isinstance(stats, Mapping):
        return f"expected None or a dict with keys {', '.join(MEMORY_KEYS)} (bytes or None)"
    for key, value in stats.items():
        if key not in MEMORY_KEYS:
            return f"unknown key {key!r}; valid keys: {', '.join(MEMORY_KEYS)}"
        if value is not None and not _is_count(value):
            return f"{key!r} is {value!r}; expected an int number of bytes >= 0 or None"
    return None


def _prepared(value: object) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], torch.nn.Module)


def _flag(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1


#: hook -> (accepts the result, what is expected); hooks not named here are checked where
#: their result is used (identity, capability, counts, memory, costs) or their result is
#: not used (the clearing and synchronising hooks).
_RESULTS: Final[dict[str, tuple[Callable[[Any], bool], str]]] = {
    "ampcore_device_overflow_flag": (lambda v: v is None or _flag(v), "a one-element tensor or None, on the device"),
    "ampcore_prepare_o2": (lambda v: v is None or _prepared(v), "None or a (model, optimizer) tuple"),
    "ampcore_backend_info": (lambda v: isinstance(v, Mapping), "a dict of name -> one line of text"),
    "ampcore_auto_load": (lambda v: v is None or _is_load(v), "None or a finite number >= 0 (float)"),
    "ampcore_auto_timer": (lambda v: v is None or callable(v), "None or a function returning seconds (float)"),
    "ampcore_auto_waited": (lambda v: v is None or callable(v), "None or a function returning seconds waited (float)"),
}


def _is_load(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")


def result_problem(hook: str, value: object) -> str | None:
    """Why ``value`` is no valid result of ``hook``, or ``None``.

    Example::

        >>> result_problem("ampcore_device_overflow_flag", True)
        'returned True; expected a one-element tensor or None, on the device'
        >>> result_problem("ampcore_device_overflow_flag", torch.zeros(1)) is None
        True
    """
    check = _RESULTS.get(hook)
    if check is None or check[0](value):
        return None
    return f"returned {value!r}; expected {check[1]}"
