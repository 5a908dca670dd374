"""The accuracy comparison: the same batch in float32 and under AMP, module by module.

Relative error of one module (or op) output is normwise in the max norm::

    max |amp - ref| / max(max |ref|, tiny)

with ``ref`` the float32 output, ``amp`` the AMP output cast back to ``ref``'s dtype,
the maxima over all floating-point tensors of the output, and equal non-finite values
(``inf == inf``, ``nan`` and ``nan``) counted as equal.  An AMP output that is inf or nan
where float32 was finite has an infinite error.  Unlike an elementwise ratio it does not
explode on outputs close to zero.

The two runs of :func:`compare_accuracy`: each run gets its own copy of the inputs (a
forward that changes its input in place changes neither the other run's nor the
caller's).  Both runs use ``torch.no_grad()`` and the model as given: its train/eval mode
is not changed (a model in train mode draws other dropout masks in each run and updates
batch-norm statistics twice: a warning says so; call ``model.eval()`` first).  The float32
outputs of every module are kept (cloned) until the AMP run has compared them, so memory
grows with the activations.  Module rows come from global module hooks held only during
the call; ``per_op=True`` adds a row per ATen op call (views and casts excluded), which
reaches ops inside composite modules such as ``nn.MultiheadAttention``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from .._backends.backend import dtype_name
from .._backends.registry import DeviceLike
from .._errors import AmpcoreError, AmpcoreWarning, warn_user
from .._policy.autocast import autocast
from .._validate import check_bool, check_real
from ._accuracy_report import AccuracyReport, AccuracyRow
from ._module_path import ModuleTracker
from ._ops import ObservingMode, leaf_tensors, op_name, quiet

__all__ = ["AccuracyReport", "AccuracyRow", "compare_accuracy"]

_TINY: Final = torch.finfo(torch.float32).tiny

#: (module path, op name or None for the module's own output, occurrence of the op)
Key = tuple[str, "str | None", int]
Shapes = tuple[tuple[int, ...], ...]


def _errors(ref: torch.Tensor, amp: torch.Tensor) -> tuple[float, float]:
    amp = amp.to(ref.dtype)
    same = (amp == ref) | (torch.isnan(amp) & torch.isnan(ref))
    diff = torch.where(same, torch.zeros_like(ref), (amp - ref).abs())
    max_abs = float(torch.nan_to_num(diff, nan=float("inf"), posinf=float("inf")).max())
    finite = ref[torch.isfinite(ref)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    return (max_abs / max(scale, _TINY) if max_abs else 0.0), max_abs


@dataclass
class _Accumulator:
    rel: float
    abs: float
    ref_dtype: str
    amp_dtype: str
    order: int
    calls: int = 1
    note: str = ""


class _Recorder:
    """Keeps the float32 outputs of the reference run and compares the AMP run with them."""

    def __init__(self) -> None:
        self.reference: dict[Key, list[list[torch.Tensor] | None]] = {}
        self.results: dict[Key, _Accumulator] = {}
        self.unmatched: list[str] = []
        self.amp_dtypes: set[torch.dtype] = set()
        self.comparing = False
        self._calls: dict[Key, int] = {}
        self._ops: dict[tuple[str, str], int] = {}
        # op calls by output shapes: the reference run's indices, the AMP run's count so far
        self._by_shapes: dict[tuple[str, str, Shapes], list[int]] = {}
        self._seen: dict[tuple[str, str, Shapes], int] = {}

    def start(self, comparing: bool) -> None:
        self.comparing = comparing
        self._calls = {}
        self._ops = {}

    def module_end(self, path: str, module: nn.Module, output: Any) -> None:
        with quiet():
            self.record((path, None, 0), output)

    def op_end(self, path: str, op: str, result: Any) -> None:
        index = self._ops.get((path, op), 0)
        self._ops[(path, op)] = index + 1
        shapes = (path, op, tuple(tuple(t.shape) for t in leaf_tensors(result) if t.is_floating_point()))
        if not self.comparing:
            self._by_shapes.setdefault(shapes, []).append(index)
        else:  # the reference call of this op with these output shapes, in order: the AMP run may
            # dispatch other ops (torch 2.8 runs a bfloat16 3-D matmul as a bmm, float32 as an mm)
            seen = self._seen[shapes] = self._seen.get(shapes, -1) + 1
            indices = self._by_shapes.get(shapes, [])
            if seen >= len(indices):
                if shapes[2]:
                    self.unmatched.append(_label((path, op, index)))
                return
            index = indices[seen]
        self.record((path, op, index), result)

    def record(self, key: Key, output: Any) -> None:
        tensors = [t for t in leaf_tensors(output) if t.is_floating_point()]
        if not tensors:
            return
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        if not self.comparing:
            self.reference.setdefault(key, []).append([t.detach().clone() for t in tensors])
            return
        self.amp_dtypes.update(t.dtype for t in tensors)
        calls = self.reference.get(key, [])
        refs = calls[call] if call < len(calls) else None
        if refs is None:
            self.unmatched.append(_label(key))
            return
        calls[call] = None
        self._compare(key, refs, tensors)

    def _compare(self, key: Key, refs: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
        rel = err = 0.0
        note = "" if len(refs) == len(tensors) else f"{len(refs)} float32 outputs vs {len(tensors)} under AMP"
        for ref, amp in zip(refs, tensors, strict=False):
            if ref.shape != amp.shape:
                note, rel, err = f"shape {tuple(ref.shape)} vs {tuple(amp.shape)}", float("inf"), float("inf")
                continue
            r, a = _errors(ref, amp)
            rel, err = max(rel, r), max(err, a)
        acc = self.results.get(key)
        if acc is None:
            order = len(self.results)
            names = dtype_name(refs[0].dtype), dtype_name(tensors[0].dtype)
            self.results[key] = _Accumulator(rel, err, names[0], names[1], order, note=note)
            return
        acc.rel, acc.abs, acc.calls = max(acc.rel, rel), max(acc.abs, err), acc.calls + 1
        acc.note = acc.note or note


class _OpRecordingMode(ObservingMode):
    """Shows the recorder every op call that computes from a floating tensor (no views, casts)."""

    def __init__(self, tracker: ModuleTracker, recorder: _Recorder) -> None:
        super().__init__()
        self.tracker = tracker
        self.recorder = recorder

    def observe(self, func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> None:
        name = op_name(func)
        if func.is_view or name == "_to_copy":
            return
        if not any(t.is_floating_point() for t in leaf_tensors((args, kwargs))):
            return
        with quiet():
            self.recorder.op_end(self.tracker.path, name, result)


def _label(key: Key) -> str:
    path, op, index = key
    return path if op is None else f"{path}/{op}#{index}"


def _call_args(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, tuple):
        return inputs, {}
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    return (inputs,), {}


def _infer_device(inputs: Any, model: nn.Module) -> torch.device | None:
    for tensor in leaf_tensors(inputs):
        return tensor.device
    for tensor in model.parameters():
        return tensor.device
    return None


def _run(model: nn.Module, label: str, inputs: Any, recorder: _Recorder, per_op: bool, comparing: bool) -> None:
    # each run gets its own copy: a forward that changes its input in place must neither
    # feed the second run a changed input nor change the caller's
    inputs = tree_map_only(torch.Tensor, torch.Tensor.clone, inputs)
    args, kwargs = _call_args(inputs)
    recorder.start(comparing)
    tracker = ModuleTracker(root_label=label, on_forward_end=recorder.module_end)
    with tracker:
        ops = _OpRecordingMode(tracker, recorder) if per_op else contextlib.nullcontext()
        with ops:
            model(*args, **kwargs)


def compare_accuracy(
    model: nn.Module,
    inputs: Any,
    level: str = "O1",
    device: DeviceLike = None,
    dtype: torch.dtype | None = None,
    *,
    amp_model: nn.Module | None = None,
    per_op: bool = False,
    threshold: float = 0.1,
    **autocast_kwargs: Any,
) -> AccuracyReport:
    """Run one batch in float32 and under AMP and rank the modules by relative error.

    How the two runs see the model and the inputs (copies, train mode, memory, hooks) is in
    this module's docstring.

    Args:
        model: the float32 model; also the AMP model unless ``amp_model`` is given.
        inputs: a tensor, a tuple of positional arguments, or a dict of keyword arguments.
        level, device, dtype, autocast_kwargs: as for :class:`ampcore.autocast`;
            ``device=None`` takes the device of the first input tensor (else of the
            model's first parameter).
        amp_model: a model of the same structure to run under AMP (e.g. an O2-decorated
            copy); rows are matched by module path.
        per_op: also compare every op call.
        threshold: the relative error above which a row counts as broken
            (:attr:`AccuracyReport.first_bad`).

    Raises:
        AmpcoreError: invalid arguments, or a level that does not lower precision (O0).

    Example::

        >>> import torch, ampcore.debugging
        >>> net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        >>> report = ampcore.debugging.compare_accuracy(net, torch.randn(4, 8), dtype=torch.bfloat16)
        >>> [row.name for row in report.in_order]
        ['Sequential.0', 'Sequential.1', 'Sequential']
    """
    call = "compare_accuracy"
    _check_arguments(call, model, amp_model, per_op, threshold)
    reference, amp = _regions(
        call, _infer_device(inputs, model) if device is None else device, dtype, level, autocast_kwargs
    )
    amp_model = model if amp_model is None else amp_model
    _warn_if_training(call, model, amp_model)
    recorder = _run_both(model, amp_model, inputs, per_op, reference, amp)
    if recorder.results and amp.dtype not in recorder.amp_dtypes:
        warn_user(
            f"{call}(): no output of the AMP run was {amp.dtype}: is the model on the {amp.backend.name!r} "
            f"device ({amp!r})?",
            AmpcoreWarning,
        )
    return _report(recorder, amp, float(threshold))


def _regions(
    call: str, device: DeviceLike, dtype: torch.dtype | None, level: str, autocast_kwargs: dict[str, Any]
) -> tuple[autocast, autocast]:
    """The float32 region and the AMP region (which must lower precision)."""
    reference = autocast(device=device, level="O0")
    amp = autocast(device=device, dtype=dtype, level=level, **autocast_kwargs)
    if not amp.enabled:
        raise AmpcoreError(
            f"{call}(level={amp.level!r}): this region runs in float32, so there is nothing to compare; "
            "use a mixed-precision level such as 'O1' with enabled=True"
        )
    return reference, amp


def _warn_if_training(call: str, model: nn.Module, amp_model: nn.Module) -> None:
    if model.training or amp_model.training:
        warn_user(
            f"{call}(): the model is in train mode: dropout differs between the two runs and "
            "batch-norm statistics are updated by both; call model.eval() first",
            AmpcoreWarning,
        )


def _run_both(
    model: nn.Module, amp_model: nn.Module, inputs: Any, per_op: bool, reference: autocast, amp: autocast
) -> _Recorder:
    """The float32 run (recording), then the AMP run (comparing), without gradients."""
    label = type(model).__name__
    recorder = _Recorder()
    with torch.no_grad():
        with reference:
            _run(model, label, inputs, recorder, per_op, comparing=False)
        with amp:
            _run(amp_model, label, inputs, recorder, per_op, comparing=True)
    return recorder


def _check_arguments(call: str, model: object, amp_model: object, per_op: object, threshold: object) -> None:
    for name, value in (("model", model), ("amp_model", amp_model)):
        if value is not None and not isinstance(value, nn.Module):
            raise AmpcoreError(f"{call}({name}={type(value).__name__}): expected a torch.nn.Module")
    check_bool(call, "per_op", per_op)
    check_real(call, "threshold", threshold, low=0.0)  # 10**400 would overflow float() later


def _report(recorder: _Recorder, amp: autocast, threshold: float) -> AccuracyReport:
    """The rows, worst first (execution order among equals)."""
    rows = [
        AccuracyRow(path, op, index, a.rel, a.abs, a.ref_dtype, a.amp_dtype, a.calls, a.order, a.note)
        for (path, op, index), a in recorder.results.items()
    ]
    rows.sort(key=lambda r: (-r.max_rel_error, r.order))
    return AccuracyReport(
        tuple(rows), amp.level, dtype_name(amp.dtype), amp.backend.name, threshold, tuple(recorder.unmatched)
    )
