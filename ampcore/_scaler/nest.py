"""``scale(outputs)``'s walk: the shared nest walker (``ampcore._nest``) with torch's rule for
other iterables (a lazy ``map``) and an error for anything else."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._errors import AmpcoreError
from .._nest import map_tensors as _map_nest
from .store import CALL

__all__ = ["map_tensors"]


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor of a nest of lists, tuples (named too) and mappings."""

    def other(leaf: Any) -> Any:
        if isinstance(leaf, Iterable) and not isinstance(leaf, (str, bytes)):
            return map(functools.partial(map_tensors, fn=fn), leaf)
        raise AmpcoreError(
            f"{CALL}.scale(): outputs must be a Tensor or lists, tuples or dicts of Tensors; got {type(leaf).__name__}"
        )

    return _map_nest(value, fn, other)
