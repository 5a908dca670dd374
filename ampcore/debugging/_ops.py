"""What the debugging tools share about ATen ops: names, name filters, dtype buckets, tensors.

Op names follow torch's autocast lists: an ATen op is named without its namespace
(``"addmm"``, ``"exp"``), an op of another namespace keeps it (``"my_ns::my_op"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .._errors import AmpcoreError, closest
from .._nest import iter_tensors

__all__ = [
    "BUCKETS",
    "Bucket",
    "ObservingMode",
    "OpFilter",
    "dtype_bucket",
    "leaf_tensors",
    "op_name",
    "quiet",
    "result_bucket",
]

Bucket = Literal["fp32", "fp16", "bf16", "other"]

#: The output-dtype buckets of the operator statistics, in table order.
BUCKETS: Final[tuple[Bucket, ...]] = ("fp32", "fp16", "bf16", "other")

_BUCKET_OF: Final[dict[torch.dtype, Bucket]] = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
}


def op_name(func: torch._ops.OpOverload) -> str:
    """``aten.addmm.default`` -> ``"addmm"``; ``my_ns.op.default`` -> ``"my_ns::op"``."""
    packet = func.overloadpacket.__name__
    return packet if func.namespace == "aten" else f"{func.namespace}::{packet}"


def dtype_bucket(dtype: torch.dtype | None) -> Bucket:
    """The statistics bucket of an output dtype (``None``: the op returned no tensor)."""
    if dtype is None:
        return "other"
    return _BUCKET_OF.get(dtype, "other")


def leaf_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``value``, walking tuples, lists and dicts (model outputs, op args)."""
    return iter_tensors(value)


def result_bucket(result: Any) -> Bucket:
    """The bucket of an op's result: its first floating tensor, else its first tensor."""
    first: torch.Tensor | None = None
    for tensor in leaf_tensors(result):
        if tensor.is_floating_point():
            return dtype_bucket(tensor.dtype)
        if first is None:
            first = tensor
    return dtype_bucket(None if first is None else first.dtype)


@contextmanager
def quiet() -> Iterator[None]:
    """A context in which a tool's own inspection ops escape every active dispatch mode
    and autograd.

    Without it, the checks of :func:`check_numerics` would be counted by an enclosing
    :func:`collect_operator_stats` (and checked again by an enclosing checker), and
    autograd would record them: a dispatch mode runs below autograd, but the ops it
    calls start from the top again.
    """
    with _disable_current_modes(), torch.no_grad():
        yield


class ObservingMode(TorchDispatchMode):
    """A dispatch mode that runs every op unchanged, showing it to :meth:`before` and then,
    with its result, to :meth:`observe`.

    It sits below autograd and after autocast's casts, so it sees every ATen op of the
    entering thread, inside composite modules too, on any backend.
    """

    # torch's TorchDispatchMode leaves these three unannotated: typed here once, so the
    # subclasses and their users call typed methods (mypy's untyped_calls_exclude does not
    # cover super() calls, hence the ignores).
    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch: unannotated

    def __enter__(self) -> ObservingMode:
        super().__enter__()  # type: ignore[no-untyped-call]  # torch: unannotated; returns self
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        super().__exit__(exc_type, exc, traceback)  # type: ignore[no-untyped-call]  # torch: unannotated

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self.before(func, args, kwargs)
        result = func(*args, **kwargs)
        self.observe(func, args, kwargs, result)
        return result

    def before(self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Look at one op call before it runs; the base class does nothing."""

    def observe(self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        """Look at one op call; the base class does nothing."""


def _known_ops() -> dict[str, set[str]]:
    """Op name (``"exp"``, ``"my_ns::op"``) -> its overload names (``"default"``, ``"out"``)."""
    overloads: dict[str, set[str]] = {}
    for full in torch._C._dispatch_get_all_op_names():
        base, _, overload = full.partition(".")
        overloads.setdefault(base.removeprefix("aten::"), set()).add(overload or "default")
    return overloads


def _normalise(name: str) -> str:
    for prefix in ("aten::", "aten."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


class OpFilter:
    """Which ops a tool looks at: all, only ``ops``, or all but ``skip_ops``.

    A name is ``"exp"`` (every overload), ``"add.Tensor"`` (one overload), and may carry
    ``"aten::"``.  Unknown names raise, with the closest known names as a hint.

    Example::

        >>> f = OpFilter(None, ["exp"], call="check_numerics")
        >>> f.selects(torch.ops.aten.exp.default), f.selects(torch.ops.aten.mm.default)
        (False, True)
    """

    def __init__(self, ops: Iterable[str] | None, skip_ops: Iterable[str] | None, call: str) -> None:
        self.only = self._parse(ops, "ops", call)
        self.skip = self._parse(skip_ops, "skip_ops", call) or frozenset()
        overlap = (self.only or frozenset()) & self.skip
        if overlap:
            raise AmpcoreError(
                f"{call}(ops=..., skip_ops=...): {sorted(overlap)} are in both; an op is either "
                "restricted to or skipped, not both"
            )

    @staticmethod
    def _parse(names: Iterable[str] | None, argument: str, call: str) -> frozenset[str] | None:
        if names is None:
            return None
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise AmpcoreError(
                f"{call}({argument}={names!r}): expected a collection of op names such as "
                "{'exp', 'add.Tensor', 'aten::softmax'}"
            )
        parsed = frozenset(_normalise(n.strip()) for n in names)
        known = _known_ops()
        for name in sorted(parsed):
            base, _, overload = name.partition(".")
            if base not in known:
                hint = closest(name, known, n=3)
                raise AmpcoreError(
                    f"{call}({argument}=...): unknown op {name!r}"
                    + (f"; did you mean {', '.join(repr(h) for h in hint)}?" if hint else "")
                    + " Names are ATen op names as in torch's autocast lists, e.g. 'exp', 'add.Tensor'"
                )
            if overload and overload not in known[base]:
                choices = sorted(f"{base}.{o}" for o in known[base])
                hint = closest(name, choices, n=1)
                raise AmpcoreError(
                    f"{call}({argument}=...): unknown overload {name!r}"
                    + (f"; did you mean {hint[0]!r}?" if hint else "")
                    + f" The overloads of {base!r}: {', '.join(repr(c) for c in choices)}, or {base!r} for all of them"
                )
        return parsed

    def selects(self, func: torch._ops.OpOverload) -> bool:
        """Whether the tool looks at calls of ``func``."""
        name = op_name(func)
        full = f"{name}.{func._overloadname}"
        if self.only is not None and name not in self.only and full not in self.only:
            return False
        return name not in self.skip and full not in self.skip
