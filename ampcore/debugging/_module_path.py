"""Which module is running: global forward hooks that keep a stack of module paths.

A path is the class name of the outermost module called, then the qualified name of the
submodule as ``named_modules()`` gives it: ``"Net.blocks.2.proj"``.  A module that is not
a registered submodule of that outermost module (one built inside ``forward``) is named
by its class: ``"Net.blocks.2.<Linear>"``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.hooks import RemovableHandle

__all__ = ["ModuleTracker", "autograd_node_name"]

#: Called when a tracked module's forward returns: ``(path, module, output)``.
ForwardEnd = Callable[[str, nn.Module, Any], None]


def autograd_node_name() -> str | None:
    """The autograd node running in this thread (``"ExpBackward0"``), or None in forward."""
    current = getattr(torch._C, "_current_autograd_node", None)
    node = current() if current is not None else None
    return None if node is None else type(node).__name__


@dataclass
class _Frame:
    module_id: int
    path: str
    module_type: str
    names: dict[int, str] = field(default_factory=dict)


class ModuleTracker:
    """Knows the path of the module whose forward is running in the entering thread.

    While entered it holds two global module hooks (``register_module_forward_pre_hook``
    and ``register_module_forward_hook(always_call=True)``); they do nothing in other
    threads, and exiting removes them, also after an exception.  Only calls through
    ``module(...)`` are seen, not ``module.forward(...)``.

    Args:
        root_label: the name for the outermost module (its class name by default).
        on_forward_end: called with ``(path, module, output)`` when a forward returns.

    Example::

        >>> import torch
        >>> seen = []
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> with ModuleTracker(on_forward_end=lambda p, m, o: seen.append(p)):
        ...     _ = net(torch.ones(1, 2))
        >>> seen
        ['Sequential.0', 'Sequential']
    """

    def __init__(self, root_label: str | None = None, on_forward_end: ForwardEnd | None = None) -> None:
        self._root_label = root_label
        self._on_forward_end = on_forward_end
        self._stack: list[_Frame] = []
        self._thread: int | None = None
        self._handles: list[RemovableHandle] = []

    @property
    def path(self) -> str:
        """The path of the innermost running module, or ``""`` outside every module."""
        return self._stack[-1].path if self._stack else ""

    @property
    def module_type(self) -> str | None:
        """The class name of the innermost running module, or None outside every module."""
        return self._stack[-1].module_type if self._stack else None

    def __enter__(self) -> ModuleTracker:
        self._thread = threading.get_ident()
        self._stack.clear()
        self._handles = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack.clear()
        self._thread = None

    def _pre(self, module: nn.Module, args: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        kind = type(module).__name__
        if not self._stack:
            names = {id(m): name for name, m in module.named_modules()}
            self._stack.append(_Frame(id(module), self._root_label or kind, kind, names))
            return
        root = self._stack[0]
        name = root.names.get(id(module))
        path = f"{root.path}.{name}" if name else f"{self._stack[-1].path}.<{kind}>"
        self._stack.append(_Frame(id(module), path, kind))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        ident = id(module)
        for depth in range(len(self._stack) - 1, -1, -1):
            if self._stack[depth].module_id == ident:
                path = self._stack[depth].path
                del self._stack[depth:]
                if self._on_forward_end is not None:
                    self._on_forward_end(path, module, output)
                return
