"""The numerics checker: stop at the first ATen op whose output holds inf or nan.

It runs every op of the region through a ``TorchDispatchMode`` (below autograd, after
autocast's casts, inside composite modules, on any backend) and looks at its outputs, and
on a device with an overflow flag (a chip that saturates instead of producing inf) at the
flag, read and cleared after each op (:mod:`._device_flags`).
Looking at values needs their host copy: the checker synchronises with the device after
every checked op, by design.  It is a debugging tool, not something to leave on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import torch

from .._errors import AmpcoreError, AmpcoreWarning, warn_user
from .._validate import check_bool
from ._device_flags import DeviceFlags
from ._module_path import ModuleTracker, autograd_node_name
from ._ops import ObservingMode, OpFilter, leaf_tensors, op_name, quiet
from ._summary import FP16_MAX, TensorSummary, summarise

__all__ = ["NumericsError", "NumericsFinding", "NumericsWarning", "check_numerics"]

Kind = Literal["nan_inf", "fp16_range", "device_overflow"]


@dataclass(frozen=True)
class NumericsFinding:
    """One op call whose output failed the check.

    Attributes:
        kind: ``"nan_inf"`` (the output holds nan or inf), ``"fp16_range"`` (a
            non-float16 output holds finite values beyond float16's +-65504) or
            ``"device_overflow"`` (the op raised the device's overflow flag: its results
            saturated at the dtype's limit, e.g. +-65504 in float16).
        op: the op name as in torch's autocast lists (``"exp"``); ``overload`` its overload.
        module_path: the module whose forward called it (``"Net.blocks.2"``), ``""`` when
            none; ``module_type`` that module's class name.
        autograd_node: the autograd node (``"ExpBackward0"``) when the op ran in backward.
        outputs: summaries of the op's tensor outputs.
        inputs: summaries of its tensor and number arguments, in order.
    """

    kind: Kind
    op: str
    overload: str
    module_path: str
    module_type: str | None
    autograd_node: str | None
    outputs: tuple[TensorSummary, ...]
    inputs: tuple[TensorSummary, ...]

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        """The dtypes of the inputs (``"float16"``; ``"float"``/``"int"`` for numbers)."""
        return tuple(s.dtype for s in self.inputs)

    @property
    def inputs_finite(self) -> bool:
        """Whether every input was finite: then this op is where the problem starts."""
        return all(s.finite for s in self.inputs)

    @property
    def where(self) -> str:
        """``"in module Net.blocks.2 (Planted)"``, ``"in backward (ExpBackward0)"``..."""
        if self.autograd_node is not None:
            return f"in backward (autograd node {self.autograd_node})"
        if self.module_path:
            shown = self.module_type and not self.module_path.endswith((self.module_type, f"<{self.module_type}>"))
            return f"in module {self.module_path}" + (f" ({self.module_type})" if shown else "")
        return "outside any module"

    def describe(self) -> str:
        """A multi-line account: the op, where it ran, its outputs and inputs, a hint."""
        what = {
            "nan_inf": "non-finite values",
            "fp16_range": "values beyond the float16 range",
            "device_overflow": "an overflow (it raised the device's overflow flag; its results saturated)",
        }[self.kind]
        qualified = self.op if "::" in self.op else f"aten::{self.op}"
        lines = [f"{qualified}.{self.overload} produced {what} {self.where}"]
        lines += [f"  output {i}: {s}" for i, s in enumerate(self.outputs)]
        lines += [f"  input {i}: {s}" for i, s in enumerate(self.inputs)]
        lines.append(f"  hint: {self._hint()}")
        return "\n".join(lines)

    def _hint(self) -> str:
        if self.kind == "device_overflow" and self.autograd_node is None:
            return (
                f"the device saturates instead of producing inf: keep '{self.op}' in float32 (put it on the "
                "black list) or scale its input down"
            )
        if self.kind == "fp16_range":
            return (
                f"float16 holds at most +-{FP16_MAX:g}: this result would overflow if '{self.op}' "
                "(or an op consuming it) ran in float16"
            )
        if self.autograd_node is not None and self.inputs_finite:
            return (
                f"a gradient overflowed in {self.autograd_node}: lower the loss scale (ampcore's GradScaler "
                "backs off by itself); if it overflows at every scale (the scaler keeps skipping steps), keep "
                "the forward op in float32 (custom_black_list) or its layer (decorate(excluded_layers=...) or "
                "ampcore.register_fp32_module)"
            )
        if not self.inputs_finite:
            return "its inputs already held nan/inf: the problem starts earlier (before the region or in a skipped op)"
        if any(s.dtype == "float16" for s in self.outputs):
            return (
                f"float16 holds at most +-{FP16_MAX:g}: keep '{self.op}' in float32 (put it on the "
                "black list), scale its input down, or use bfloat16"
            )
        return f"'{self.op}' produced nan/inf from finite inputs"


class NumericsError(AmpcoreError):
    """Raised by :class:`check_numerics` at the first op that failed the check.

    ``finding`` holds the details; ``op``, ``module_path`` and ``inputs`` are shortcuts.
    """

    def __init__(self, finding: NumericsFinding) -> None:
        super().__init__(f"check_numerics: {finding.describe()}")
        self.finding = finding
        self.op = finding.op
        self.module_path = finding.module_path
        self.inputs = finding.inputs


class NumericsWarning(AmpcoreWarning):
    """Issued when a report-mode :class:`check_numerics` region ends with findings."""


def _inspect(result: Any, check_fp16_range: bool) -> Kind | None:
    kind: Kind | None = None
    for tensor in leaf_tensors(result):
        if tensor.is_meta or tensor.layout != torch.strided or not tensor.numel():
            continue
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            return "nan_inf"
        if check_fp16_range and tensor.dtype != torch.float16 and tensor.is_floating_point():
            if float(tensor.abs().amax()) > FP16_MAX:
                kind = "fp16_range"
    return kind


def _devices(*values: Any) -> list[torch.device]:
    """The devices of the tensors in ``values`` and of ``device=`` arguments, once each."""
    found = [t.device for t in leaf_tensors(values)]
    found += [v["device"] for v in values if isinstance(v, dict) and isinstance(v.get("device"), torch.device)]
    return list(dict.fromkeys(found))


class _CheckingMode(ObservingMode):
    def __init__(self, checker: check_numerics, tracker: ModuleTracker) -> None:
        super().__init__()
        self.checker = checker
        self.tracker = tracker
        self.flags = DeviceFlags()

    def before(self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not func.is_view:
            with quiet():
                self.flags.meet(_devices(args, kwargs))

    def observe(self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        checker = self.checker
        if func.is_view:  # a view cannot create nan/inf
            return
        with quiet():
            selected = checker._filter.selects(func)
            kind = _inspect(result, checker.check_fp16_range) if selected else None
            if self.flags.raised_by(_devices(args, kwargs, result)) and selected and kind is None:
                kind = "device_overflow"
        if kind is not None:
            checker._report(self._finding(kind, func, args, kwargs, result))

    def _finding(
        self, kind: Kind, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> NumericsFinding:
        node = autograd_node_name()
        inputs = (summarise(a) for a in _flat_args(args, kwargs))
        outputs = (summarise(t) for t in leaf_tensors(result))
        return NumericsFinding(
            kind=kind,
            op=op_name(func),
            overload=func._overloadname,
            module_path="" if node else self.tracker.path,
            module_type=None if node else self.tracker.module_type,
            autograd_node=node,
            outputs=tuple(s for s in outputs if s is not None),
            inputs=tuple(s for s in inputs if s is not None),
        )


def _flat_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    flat: list[Any] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, (tuple, list)):
            flat.extend(value)
        else:
            flat.append(value)
    return flat


def _restore_flags(flags: DeviceFlags) -> None:
    """Raise again the device overflow flags the region consumed (GradScaler reads them)."""
    before = [str(d) for d in flags.raised_before]
    failed = [str(d) for d in flags.restore()]
    if before:
        warn_user(
            f"check_numerics: the overflow flag of {', '.join(before)} was already raised when the region began "
            "(an op before it overflowed); ops of the region were checked after clearing it",
            NumericsWarning,
        )
    if failed:
        warn_user(
            f"check_numerics: could not raise the overflow flag of {', '.join(failed)} again after reading it: "
            "a GradScaler step of this iteration will not see that overflow",
            NumericsWarning,
        )


class check_numerics:
    """Check every ATen op of the region for inf/nan outputs, naming the first culprit.

    It sees every op dispatched in the entering thread, forward and backward, inside
    composite modules too, on any backend; ops of other threads are not checked (torch's
    dispatch modes are thread-local).  View ops (``t``, ``view``, ``detach``...) only alias
    tensors and are not checked.  The module path comes from global module hooks held only
    while the region is active.  Every checked op synchronises with the device.

    On a device whose backend has an overflow flag (a chip that saturates, clamping
    float16 results to +-65504 instead of producing inf), the flag is read after every op
    and cleared, and the op that raised it is a ``"device_overflow"`` finding.  Flags the
    region read raised are raised again when it ends (by an overflow on the device), so a
    :class:`ampcore.GradScaler` step still skips.

    Args:
        raise_on_error: raise :class:`NumericsError` at the first finding (default);
            ``False`` records every finding in :attr:`findings` and warns once, with a
            :class:`NumericsWarning`, when the region ends.
        check_fp16_range: also flag outputs of other floating dtypes (float32, bfloat16)
            whose finite values exceed float16's +-65504, i.e. that would overflow in
            float16.  Values too small for float16 are not flagged.
        ops: check only these ops (``"exp"``, ``"add.Tensor"``, ``"aten::softmax"``).
        skip_ops: do not check these ops, e.g. ``{"masked_fill"}`` where ``-inf`` masks
            are intended.

    Raises:
        NumericsError: in raise mode, at the first op whose output fails the check.
        AmpcoreError: invalid arguments (unknown op names list the closest ones).

    Example::

        >>> import torch, ampcore.debugging
        >>> try:
        ...     with ampcore.debugging.check_numerics():
        ...         torch.exp(torch.full((2,), 100.0, dtype=torch.float16))
        ... except ampcore.debugging.NumericsError as error:
        ...     error.op
        'exp'
        >>> with ampcore.debugging.check_numerics(raise_on_error=False, check_fp16_range=True) as checker:
        ...     _ = torch.full((2,), 1e6) * 2
        >>> [f.kind for f in checker.findings]
        ['fp16_range', 'fp16_range']
    """

    def __init__(
        self,
        raise_on_error: bool = True,
        check_fp16_range: bool = False,
        ops: Iterable[str] | None = None,
        skip_ops: Iterable[str] | None = None,
    ) -> None:
        for name, value in (("raise_on_error", raise_on_error), ("check_fp16_range", check_fp16_range)):
            check_bool("check_numerics", name, value)
        self.raise_on_error = raise_on_error
        self.check_fp16_range = check_fp16_range
        self._filter = OpFilter(ops, skip_ops, call="check_numerics")
        self.findings: list[NumericsFinding] = []
        self._tracker: ModuleTracker | None = None
        self._mode: _CheckingMode | None = None

    def __repr__(self) -> str:
        return (
            f"check_numerics(raise_on_error={self.raise_on_error}, check_fp16_range={self.check_fp16_range}, "
            f"findings={len(self.findings)})"
        )

    def _report(self, finding: NumericsFinding) -> None:
        self.findings.append(finding)
        if self.raise_on_error:
            raise NumericsError(finding)

    def __enter__(self) -> check_numerics:
        if self._mode is not None:
            raise AmpcoreError(f"{self!r} is already active; create a new check_numerics() for a nested region")
        self.findings = []
        self._tracker = ModuleTracker().__enter__()
        self._mode = _CheckingMode(self, self._tracker)
        try:
            self._mode.__enter__()
        except BaseException:
            self._tracker.__exit__(None, None, None)
            self._tracker = self._mode = None
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        mode, tracker = self._mode, self._tracker
        self._mode = self._tracker = None
        try:
            if mode is not None:
                mode.__exit__(exc_type, exc, traceback)
        finally:
            if tracker is not None:
                tracker.__exit__(exc_type, exc, traceback)
        if mode is not None:
            _restore_flags(mode.flags)
        if self.findings and not self.raise_on_error:
            origins = [f for f in self.findings if f.inputs_finite] or self.findings
            warn_user(
                f"check_numerics: {len(self.findings)} op call(s) failed the check; the first where "
                f"the inputs were finite:\n{origins[0].describe()}\n(see .findings for all)",
                NumericsWarning,
            )
