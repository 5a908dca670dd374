"""Test helpers for the op-policy engine: a dtype recorder and a no-leftover-region fixture."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ampcore._policy.executor import compiled_module, executor_chosen
from ampcore._policy.registration import SHADOW_KEYS
from ampcore._policy.thread_state import thread_state


@pytest.fixture(autouse=True)
def no_lingering_kernels() -> Iterator[None]:
    """Every test ends with no ampcore region and no policy active in its thread, and no
    shadow key left switched on."""
    yield
    assert thread_state().stack == [] and thread_state().policies == {}
    compiled = compiled_module() if executor_chosen() else None
    if compiled is not None:  # the compiled kernels' thread-local tables: none in force
        assert [compiled.current(slot) for slot in range(8)] == [0] * 8
    for key in SHADOW_KEYS:
        parsed = torch._C._parse_dispatch_key(key)
        if parsed is not None:
            assert not torch._C._dispatch_tls_is_dispatch_key_included(parsed), key


@dataclass(frozen=True)
class Call:
    op: str  # "mm", "add.Tensor"
    inputs: tuple[torch.dtype, ...]  # floating input dtypes
    outputs: tuple[torch.dtype, ...]  # floating output dtypes


def _floating(values: Any) -> tuple[torch.dtype, ...]:
    flat, _ = tree_flatten(values)
    return tuple(v.dtype for v in flat if isinstance(v, torch.Tensor) and v.is_floating_point())


class DtypeRecorder(TorchDispatchMode):
    """Runs below autocast (at the Python key): sees the dtypes after every cast."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.__name__.removesuffix(".default")
        self.calls.append(Call(name, _floating((args, kwargs)), _floating(out)))
        return out

    def of(self, *names: str) -> list[Call]:
        """The calls of ops whose base name is one of ``names``."""
        return [c for c in self.calls if c.op.partition(".")[0] in names]
