"""The root's own tensors a whole-call check's extra runs write in place (issue 27, twelfth
sweep): a forward that changes its module's parameters or plain tensor attributes (a MoCo
momentum encoder updated by EMA inside ``forward``, frozen parameters under
``torch.no_grad``; ``nn.Embedding(max_norm=...)`` renormalising its rows; a memory tensor
kept as a plain attribute) changed them once per run of the check, and the real call that
follows saw them changed 6 to 24 times over (other keys, another teacher: other gradients
than torch.autocast's step).  So did the modules' attributes that are numbers, flags or
strings (a queue's position ``self.ptr += n``): they are put back too.

:class:`Written` is copy-on-write: the first run of each candidate (an untimed warm-up) runs
under a dispatch mode that, before an op writes one of those tensors in place, keeps a copy
of it; :meth:`Written.restore` writes the copies back once the check ends.  Buffers are
kept apart (:func:`~._measure.kept_buffers`); the timed runs run without the mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Written"]


def _key(tensor: torch.Tensor) -> tuple[int, int] | None:
    """A tensor's storage and offset (a ``.data`` alias or a view of the whole has the same),
    None for one without storage (meta, fake, empty)."""
    try:
        storage = tensor.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return None
    ptr = storage.data_ptr()
    return None if ptr == 0 or tensor.numel() == 0 else (ptr, int(tensor.storage_offset()))


def _owned(root: nn.Module) -> dict[tuple[int, int], torch.Tensor]:
    """The parameters of ``root``'s modules and the tensors held as plain attributes of them
    (not buffers: :func:`~._measure.kept_buffers` keeps those), by storage."""
    found: dict[tuple[int, int], torch.Tensor] = {}
    for module in root.modules():
        values: list[Any] = [*module._parameters.values()]
        values += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
        for value in values:
            if isinstance(value, torch.Tensor) and (key := _key(value)) is not None:
                found.setdefault(key, value)
    return found


class _CopyOnWrite(TorchDispatchMode):
    """Keeps a copy of a watched tensor before the first op that writes it in place."""

    def __init__(self, written: Written) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.written = written

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func._schema.is_mutable and self.written.watched:
            for i, arg in enumerate(func._schema.arguments):
                if arg.alias_info is None or not arg.alias_info.is_write:
                    continue
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                for tensor in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(tensor, torch.Tensor):
                        self.written.before_write(tensor)
        return func(*args, **kwargs)


class Written:
    """The tensors of ``root`` a check's runs wrote in place, with their values before.

    Example::

        >>> from torch import nn
        >>> class Ema(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = nn.Parameter(torch.ones(2), requires_grad=False)
        ...     def forward(self, x):
        ...         self.w.mul_(0.5)
        ...         self.calls = getattr(self, "calls", 0) + 1
        ...         return x * self.w
        >>> m = Ema()
        >>> m.calls = 0
        >>> seen = Written(m)
        >>> with seen.watching(object()):
        ...     _ = m(torch.ones(2))
        >>> _ = m(torch.ones(2))
        >>> m.w.tolist(), m.calls, seen.restore(), m.w.tolist(), m.calls
        ([0.25, 0.25], 2, None, [1.0, 1.0], 0)
    """

    def __init__(self, root: nn.Module | None) -> None:
        self.watched = _owned(root) if root is not None else {}
        self.numbers = [(vars(m), _numbers(m)) for m in root.modules()] if root is not None else []
        self.kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.seen: set[int] = set()

    def before_write(self, tensor: torch.Tensor) -> None:
        key = _key(tensor)
        owner = self.watched.pop(key, None) if key is not None else None
        if owner is not None:
            with torch.no_grad():
                self.kept.append((owner, owner.detach().clone()))

    @contextlib.contextmanager
    def watching(self, run: object) -> Iterator[None]:
        """Watch the writes of ``run``'s first call (each candidate's warm-up); later calls
        run without the mode (they are timed)."""
        if id(run) in self.seen or not self.watched:
            yield
            return
        self.seen.add(id(run))
        with _CopyOnWrite(self):
            yield

    def restore(self) -> None:
        """Write back the tensors the runs wrote, as they were before the check."""
        with torch.no_grad():
            for owner, value in self.kept:
                if owner.shape == value.shape and owner.dtype == value.dtype:  # (not replaced by ``.data =``)
                    owner.copy_(value)
        self.kept.clear()
        for state, numbers in self.numbers:
            for name, value in numbers.items():
                if state.get(name, value) is not value:
                    state[name] = value


#: the kinds of a module's plain attributes put back after a check (a queue's position)
_NUMBERS = (bool, int, float, str)


def _numbers(module: nn.Module) -> dict[str, Any]:
    """``module``'s attributes that are numbers, flags or strings (not ampcore's own marks)."""
    return {k: v for k, v in vars(module).items() if type(v) in _NUMBERS and not k.startswith("_ampcore")}
