"""The one walker over nests of tensors: lists, tuples (named too) and mappings.

Used wherever ampcore maps a function over a structure it was given (the scaler's
``scale(outputs)``, O2's input casting, ...) or collects the tensors in one (op arguments
and results), so each of them treats the same containers the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["iter_tensors", "map_tensors"]


def _keep(value: Any) -> Any:
    return value


def map_tensors(
    value: Any, fn: Callable[[torch.Tensor], Any], other: Callable[[Any], Any] = _keep, *, keep_types: bool = True
) -> Any:
    """``value`` with ``fn`` applied to every tensor in it; ``other`` to every other leaf.

    Named tuples are rebuilt with their own type.  With ``keep_types`` (the default) lists,
    tuples and mappings are rebuilt with their own type too (a plain ``dict`` for a
    ``dict``); without it they become a plain ``list``, ``tuple`` or ``dict`` and only
    ``dict`` instances count as mappings (a model's forward arguments, as O2 casts them).
    Anything else is a leaf.

    Example::

        >>> import torch
        >>> map_tensors({"a": torch.ones(1), "b": [torch.ones(1), 3]}, lambda t: t * 2)
        {'a': tensor([2.]), 'b': [tensor([2.]), 3]}
    """
    if isinstance(value, torch.Tensor):
        return fn(value)

    def walk(item: Any) -> Any:
        return map_tensors(item, fn, other, keep_types=keep_types)

    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(walk(item) for item in value))
    if not keep_types:
        if isinstance(value, tuple):
            return tuple(walk(item) for item in value)
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        return other(value)
    if isinstance(value, Mapping):
        items = [(key, walk(item)) for key, item in value.items()]
        return dict(items) if type(value) is dict else type(value)(items)  # type: ignore[call-arg]
    if isinstance(value, (list, tuple)):
        return type(value)(walk(item) for item in value)
    return other(value)


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``value``, depth first, walking lists, tuples and dicts' values (model
    outputs, op arguments and results)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from iter_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors(item)
