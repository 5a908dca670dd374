"""Helpers shared by the checks: regions, per-op dtype checks, an op recorder, tiny models.

Kept out of the ``test_*`` modules so that every check module imports them under one name
(``ampcore_conformance._checks``) whatever name pytest gives the test module itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import ampcore
from ampcore.toolkit import has_own_autocast_kernel
from ampcore_conformance._context import SuiteContext, dtype_name
from ampcore_conformance._lists import REQUIRED_WHITE, category
from ampcore_conformance._op_samples import SAMPLES, OpSample

__all__ = [
    "UNLISTED",
    "OpRecorder",
    "check_op",
    "check_runs_fp32",
    "check_runs_low",
    "check_runs_widest",
    "check_unlisted",
    "decomposes_under_autocast",
    "make_mlp",
    "native_dtype",
    "ops_inside",
    "output_dtype",
    "region",
    "rel_error",
    "require_argument",
    "require_feature",
    "require_white",
    "white_ops",
]


def require_feature(owner: Any, name: str, feature: str) -> Any:
    """``owner.name``; skips the check with a reason naming ``feature`` when this ampcore
    lacks it."""
    found = getattr(owner, name, None)
    if found is None:
        where = getattr(owner, "__name__", type(owner).__name__)
        pytest.skip(f"feature missing in ampcore {ampcore.__version__}: {feature} ({where} has no {name!r})")
    return found


def require_argument(call: Callable[..., Any], argument: str, feature: str, **kwargs: Any) -> None:
    """Call ``call(**kwargs)``; skip with a reason naming ``feature`` when this ampcore
    refuses ``argument`` as an unexpected keyword (any other error propagates)."""
    try:
        call(**kwargs)
    except TypeError as exc:
        if argument in str(exc) and "unexpected keyword" in str(exc):
            pytest.skip(f"feature missing in ampcore {ampcore.__version__}: {feature} ({exc})")
        raise


def require_white(context: SuiteContext, dtype: torch.dtype, ops: Sequence[str], level: str = "O1") -> None:
    """Skip a model-level check whose meaning needs ``ops`` on the white list when the
    backend's lists put them elsewhere (``test_required_white_ops`` fails for that)."""
    lists = context.lists(dtype, level)
    elsewhere = [f"{op} on the {category(lists, op)} list" for op in ops if category(lists, op) != "white"]
    if elsewhere:
        pytest.skip(f"needs {', '.join(ops)} white at {level}; the backend puts {', '.join(elsewhere)}")


def white_ops(all_lists: Sequence[ampcore.OpLists]) -> list[OpSample]:
    """Samples on the white list of every one of ``all_lists`` (required ones first).

    The region checks watch these ops, so that they test regions, not one op's list entry.
    """
    names = dict.fromkeys([*REQUIRED_WHITE, *sorted(SAMPLES)])
    found = [SAMPLES[n] for n in names if all(category(lists, n) == "white" for lists in all_lists)]
    if not found:
        pytest.fail("no op the suite can call is on the backend's white list: nothing would run in low precision")
    return found


def output_dtype(sample: OpSample, device: torch.device) -> torch.dtype:
    """The dtype ``sample`` returns for float32 inputs in the current autocast state."""
    return sample.run(sample.inputs(torch.float32, device), device).dtype


def region(backend: ampcore.Backend, dtype: torch.dtype, **kwargs: Any) -> ampcore.autocast:
    """``ampcore.autocast`` on the backend under test."""
    return ampcore.autocast(device=backend.name, dtype=dtype, **kwargs)


def _real(t: torch.Tensor) -> torch.dtype:
    return t.real.dtype if t.is_complex() else t.dtype


def rel_error(out: torch.Tensor, ref: torch.Tensor, floor: float = 1.0) -> float:
    """Largest absolute difference, relative to ``max(floor, max |ref|)``."""
    out64, ref64 = out.detach().to("cpu", torch.complex128 if out.is_complex() else torch.float64), ref.detach().cpu()
    scale = max(floor, float(ref64.abs().max()))
    return float((out64 - ref64.to(out64.dtype)).abs().max()) / scale


def _run(sample: OpSample, inputs: Sequence[torch.Tensor], device: torch.device, ctx: Any = None) -> torch.Tensor:
    if ctx is None:
        return sample.run(inputs, device)
    with ctx:
        return sample.run(inputs, device)


def _describe(sample: OpSample, inputs: Sequence[torch.Tensor], dtype: torch.dtype, **kw: Any) -> str:
    """``"mm(float32, float32) under ampcore.autocast(dtype=torch.float16, level='O2')"``."""
    args = "".join(f", {key}={value!r}" for key, value in kw.items())
    return (
        f"{sample.name}({', '.join(dtype_name(x.dtype) for x in inputs)}) under ampcore.autocast(dtype={dtype}{args})"
    )


def check_runs_low(
    sample: OpSample, backend: ampcore.Backend, device: torch.device, dtype: torch.dtype, eps_tol: float, **kw: Any
) -> None:
    """float32 inputs -> a ``dtype`` result that matches float32 within ``eps_tol`` eps."""
    inputs = sample.inputs(torch.float32, device)
    try:  # what the device's kernel returns for dtype inputs (CUDA's trace: float32)
        wanted = native_dtype(sample, device, dtype)
    except (RuntimeError, NotImplementedError):  # no kernel for dtype inputs outside autocast
        wanted = dtype
    out = _run(sample, inputs, device, region(backend, dtype, **kw))
    assert _real(out) == wanted, (
        f"{_describe(sample, inputs, dtype, **kw)} returned {out.dtype}: the backend's lists put "
        f"{sample.name} on the white list, so it must run in {dtype} and return what the device "
        f"returns for {dtype} inputs without autocast ({wanted})"
    )
    reference = sample.run([x.to(dtype).float() for x in inputs], device)
    error, allowed = rel_error(out, reference), eps_tol * torch.finfo(dtype).eps
    assert error <= allowed, f"{sample.name} in {dtype} differs from float32 by {error:.3g} (allowed {allowed:.3g})"


def _check_float32(
    sample: OpSample, backend: ampcore.Backend, device: torch.device, dtype: torch.dtype,
    inputs: list[torch.Tensor], why: str, **kw: Any,
) -> None:  # fmt: skip
    out = _run(sample, inputs, device, region(backend, dtype, **kw))
    assert _real(out) == torch.float32, f"{_describe(sample, inputs, dtype, **kw)} returned {out.dtype}: {why}"
    error = rel_error(out, sample.run([x.float() for x in inputs], device))
    assert error <= 1e-4, f"{sample.name} returned float32 but was not computed in float32 (error {error:.3g})"


def check_runs_fp32(
    sample: OpSample, backend: ampcore.Backend, device: torch.device, dtype: torch.dtype, **kw: Any
) -> None:
    """``dtype`` inputs -> a float32 result equal to float32 computed on the upcast inputs."""
    why = f"the lists put {sample.name} on the black list, so it must run in float32"
    _check_float32(sample, backend, device, dtype, sample.inputs(dtype, device), why, **kw)


def check_runs_widest(
    sample: OpSample, backend: ampcore.Backend, device: torch.device, dtype: torch.dtype, **kw: Any
) -> None:
    """Inputs alternating ``dtype``/float32 -> a float32 result."""
    why = f"{sample.name} is on the promote list, so it must run in the widest input dtype (float32)"
    _check_float32(sample, backend, device, dtype, sample.inputs([dtype, torch.float32], device), why, **kw)


#: What an op on no list does at each level: the dtype of its inputs -> the dtype it runs
#: in.  It then returns what the device's own kernel returns for inputs of that dtype
#: without autocast (CUDA's ``trace`` returns float32 for float16 inputs): the check
#: compares with that, never with an assumed output dtype.
UNLISTED: Final[dict[str, dict[str, str]]] = {
    "O1": {"low": "low", "fp32": "fp32"},  # follows its inputs
    "OD": {"low": "fp32", "fp32": "fp32"},  # float32
    "O2": {"low": "low", "fp32": "low"},  # low precision
}


def native_dtype(sample: OpSample, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The (real) dtype ``sample`` returns for ``dtype`` inputs on ``device`` without
    autocast (call it outside any region): what an autocast region that runs the op in
    ``dtype`` must return."""
    return _real(sample.run(sample.inputs(dtype, device), device))


def decomposes_under_autocast(op: str, device_type: str) -> bool:
    """Whether ATen op ``op`` (its default overload) decomposes above autocast on
    ``device_type``: it has a CompositeImplicitAutograd kernel and no kernel of its own for
    the device's autocast key (ampcore's own kernels not counted).  A composite with such a
    kernel (IPEX registers AutocastCPU kernels for ``group_norm``...) is cast by that kernel,
    and is checked like any kernel; so is one with a kernel of its own on the device's backend
    key (IPEX's CPU kernel of ``layer_norm``): it never decomposes there."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        composite = bool(has_kernel(f"aten::{op}", "CompositeImplicitAutograd"))
    except RuntimeError:  # no default overload
        return False
    try:
        backend = torch._C._dispatch_key_for_device(device_type)
        own = any(has_kernel(f"aten::{op}", key) for key in (backend, f"Autograd{backend}"))
    except RuntimeError:  # a key the dispatcher cannot name: no kernel of its own there
        own = False
    return composite and not own and not has_own_autocast_kernel(op, device_type)


def ops_inside(sample: OpSample, device: torch.device) -> set[str]:
    """The ops ``sample`` calls through the dispatcher at any depth on ``device`` (float32
    inputs, no autocast), read with the profiler, by base name, itself left out.

    A device kernel may call other ops (CUDA's ``trace`` is ``diagonal().sum()``); those calls
    go through autocast again, so their lists decide the result's dtype.
    :class:`OpRecorder` sees only the calls above the kernels.
    """
    inputs = sample.inputs(torch.float32, device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        sample.run(inputs, device)
    names = {event.name.split("::", 1)[1].split(".")[0] for event in profile.events() if "::" in event.name}
    return names - {sample.name}


def check_unlisted(
    sample: OpSample,
    backend: ampcore.Backend,
    device: torch.device,
    dtype: torch.dtype,
    listed: frozenset[str],
    level: str = "O1",
) -> None:
    """An op on no list does what :data:`UNLISTED` says for ``level``.

    ``listed`` holds the ops of every list: an op that decomposes into one of them follows
    that op instead, and is not checked here; nor is a composite op (its inner ops'
    lists decide), nor an op the device cannot run in ``dtype`` at all.
    """
    low = sample.inputs(dtype, device)
    try:
        sample.run(low, device)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"{sample.name} cannot run in {dtype} on this device even without autocast: {exc}")
    with OpRecorder() as recorder:
        sample.run(sample.inputs(torch.float32, device), device)
    inner = sorted(recorder.ops() & listed)
    if inner:
        pytest.skip(f"{sample.name} decomposes into listed ops {inner}: its dtype follows theirs")
    kinds = {"low": dtype, "fp32": torch.float32}
    for given, runs_in in UNLISTED[level].items():
        inputs = low if given == "low" else sample.inputs(torch.float32, device)
        wanted = native_dtype(sample, device, kinds[runs_in])
        out = _run(sample, inputs, device, region(backend, dtype, level=level))
        if _real(out) != wanted and decomposes_under_autocast(sample.name, device.type):
            pytest.skip(
                f"{sample.name} is CompositeImplicitAutograd: under autocast it runs as its inner ops, whose "
                f"lists decide its dtype ({_real(out)} here; cross_entropy_loss: log_softmax, black, and nll_loss)"
            )
        inside = sorted(ops_inside(sample, device) & listed) if _real(out) != wanted else []
        if inside:
            pytest.skip(
                f"{sample.name}'s kernel on this device calls listed ops {inside}, which autocast casts like any "
                f"call ({_real(out)} here; CUDA's trace sums its diagonal with sum, float32 under autocast)"
            )
        assert _real(out) == wanted, (
            f"{_describe(sample, inputs, dtype, level=level)} returned "
            f"{out.dtype}: {sample.name} is on none of the backend's lists, so at {level} it runs in "
            f"{kinds[runs_in]} and must return what the device returns for {kinds[runs_in]} inputs "
            f"without autocast ({wanted})"
        )


def check_op(
    sample: OpSample,
    lists: ampcore.OpLists,
    backend: ampcore.Backend,
    device: torch.device,
    dtype: torch.dtype,
    eps_tol: float,
) -> None:
    """Check ``sample`` against the list it is on in ``lists`` (at ``lists.level``)."""
    level = lists.level
    where = category(lists, sample.name)
    if where == "white":
        check_runs_low(sample, backend, device, dtype, eps_tol, level=level)
    elif where == "black":
        check_runs_fp32(sample, backend, device, dtype, level=level)
    elif where == "promote":
        check_runs_widest(sample, backend, device, dtype, level=level)
    elif where == "banned":
        pytest.skip(f"{sample.name} is banned under autocast on this backend")
    else:
        check_unlisted(sample, backend, device, dtype, lists.white | lists.black | lists.promote, level)


class OpRecorder(TorchDispatchMode):
    """Records every ATen op call below autocast: name and floating input dtypes.

    Sees the ops inside composite modules (``nn.MultiheadAttention``) after autocast cast
    their inputs, on any device.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        leaves = tree_leaves((args, kwargs or {}))
        dtypes = tuple(t.dtype for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point())
        self.calls.append((func.overloadpacket.__name__, dtypes))
        return func(*args, **(kwargs or {}))

    def input_dtypes(self, op: str) -> set[torch.dtype]:
        """Floating input dtypes seen by calls of ``op`` (by ATen base name)."""
        return {d for name, dtypes in self.calls if name == op for d in dtypes}

    def ops(self) -> set[str]:
        return {name for name, _ in self.calls}


def make_mlp(
    device: torch.device, width: int = 32, depth: int = 2, seed: int = 0, n_in: int = 16, n_out: int = 4
) -> torch.nn.Sequential:
    """A small tanh MLP with deterministic weights, on ``device``."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(n_in, width), torch.nn.Tanh()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    layers.append(torch.nn.Linear(width, n_out))
    return torch.nn.Sequential(*layers).to(device)


def regression_data(
    device: torch.device, n: int = 256, n_in: int = 16, n_out: int = 4, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of a smooth regression task a small MLP learns in ~100 steps."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_in, generator=gen)
    w = torch.randn(n_in, n_out, generator=gen) / n_in**0.5
    y = torch.sin(x @ w) + 0.1 * (x[:, :n_out] ** 2)
    return x.to(device), y.to(device)


def timed(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` (``sync`` waits for the device)."""
    import time

    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times
