"""What the extra calls of a measurement or a whole-call check must leave as the user's step
would see it (issue 27, ninth sweep): the user's tensor hooks on parameters, and a call's
arguments that its forward changes in place.

* :func:`muted_hooks`: ``torch.autograd.grad`` of a parameter runs the hooks registered on it
  (``p.register_hook``: a gradient scaled, clipped, logged or counted); a hook with side
  effects saw each measured call (a count of 6 calls a step read 54).
* :class:`Inputs`: a forward that changes its input in place (``x.mul_(2)``) changed the
  caller's tensor once per run of a whole-call check, and the real call that follows saw it
  changed.  Their values are put back after each run.  So are the states of the
  ``torch.Generator`` objects among the arguments or held by the root's modules (noise
  drawn with ``generator=``: each run drew on, and the real call drew other noise than the
  fixed precision's; eleventh sweep).

(Buffers are kept by :func:`~._measure.kept_buffers`, the RNG by ``_measure._fork_rng``, the
root's parameters and tensor attributes its forward writes by :class:`~._written.Written`.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ._written import Written

__all__ = ["Inputs", "muted_hooks"]


@contextlib.contextmanager
def muted_hooks(params: Sequence[torch.Tensor]) -> Iterator[None]:
    """The tensor hooks of ``params`` silent inside, then put back as they were (the same
    dicts, which autograd holds, in their order).

    Example::

        >>> p = torch.ones(2, requires_grad=True)
        >>> seen = []
        >>> _ = p.register_hook(lambda g: seen.append(1))
        >>> with muted_hooks([p]):
        ...     _ = torch.autograd.grad((p * 2).sum(), [p])
        >>> _ = torch.autograd.grad((p * 2).sum(), [p])
        >>> seen
        [1]
    """
    saved = [(hooks, list(hooks.items())) for p in params if (hooks := p._backward_hooks)]
    for hooks, _ in saved:
        hooks.clear()
    try:
        yield
    finally:
        for hooks, items in saved:
            hooks.clear()
            hooks.update(items)


class Inputs:
    """The tensors of a call's arguments (through tuples, lists and dicts) with their values
    when the check began; :meth:`put_back` writes back those a run changed in place.

    Example::

        >>> x = torch.ones(3)
        >>> kept = Inputs((x,), {})
        >>> _ = x.mul_(2)
        >>> kept.put_back()
        >>> x
        tensor([1., 1., 1.])
    """

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], root: torch.nn.Module | None = None) -> None:
        found: dict[int, torch.Tensor] = {}
        generators: dict[int, torch.Generator] = {}
        _collect((args, kwargs), found, generators)
        for module in root.modules() if root is not None else ():
            for value in vars(module).values():
                if isinstance(value, torch.Generator):
                    generators.setdefault(id(value), value)
        self.kept = [(t, t._version, t.detach().clone()) for t in found.values()]
        self.states = [(g, g.get_state()) for g in generators.values()]
        self.written = Written(root)  # (the root's tensors its forward writes: copy-on-write)

    def put_back(self) -> None:
        for i, (tensor, version, value) in enumerate(self.kept):
            if tensor._version != version:
                with torch.no_grad():
                    tensor.copy_(value)
                self.kept[i] = (tensor, tensor._version, value)
        for generator, state in self.states:
            generator.set_state(state)


def _collect(value: Any, found: dict[int, torch.Tensor], generators: dict[int, torch.Generator]) -> None:
    if isinstance(value, torch.Tensor):
        found.setdefault(id(value), value)
    elif isinstance(value, torch.Generator):
        generators.setdefault(id(value), value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _collect(v, found, generators)
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, found, generators)
