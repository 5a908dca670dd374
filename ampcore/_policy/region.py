"""``ampcore.active_region``: which ampcore region is in force in this thread."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._backends.registry import DeviceLike, resolve_device
from .thread_state import current_region

__all__ = ["RegionInfo", "active_region"]


class RegionInfo(NamedTuple):
    """The innermost active ``ampcore.autocast`` region of a thread (a snapshot).

    ``custom_white_list`` / ``custom_black_list`` are the region's effective custom lists,
    merged with those of the regions it is nested in.
    """

    backend: str
    device_type: str
    dtype: torch.dtype
    level: str
    enabled: bool
    custom_white_list: frozenset[str]
    custom_black_list: frozenset[str]


def active_region(device: DeviceLike = None) -> RegionInfo | None:
    """The innermost ``ampcore.autocast`` region active in this thread, or ``None``.

    Args:
        device: only regions of this backend's device type (a name, ``"name:N"`` or a
            ``torch.device``); ``None``: any region.

    Example::

        >>> import ampcore
        >>> ampcore.active_region() is None
        True
        >>> with ampcore.autocast(device="cpu", level="OD", custom_white_list={"add"}):
        ...     region = ampcore.active_region("cpu")
        >>> region.level, region.dtype, sorted(region.custom_white_list)
        ('OD', torch.bfloat16, ['add'])
    """
    device_type = None if device is None else resolve_device(device).backend.device_type
    spec = current_region(device_type)
    if spec is None:
        return None
    return RegionInfo(
        spec.backend.name,
        spec.backend.device_type,
        spec.dtype,
        spec.level,
        spec.enabled,
        spec.custom_white,
        spec.custom_black,
    )
