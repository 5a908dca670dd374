"""The adapter contract: the hooks through which a plugin describes one backend.

A plugin is a module (or any object) whose functions carry the :data:`ampcore.hookimpl`
marker and are named like the hooks below.  It is found through the ``ampcore`` entry-point
group (:data:`ENTRY_POINT_GROUP`; or registered in process with
:func:`ampcore.register_plugin`) and describes exactly one backend.  The core calls each
plugin's own implementations; hooks are never broadcast to other plugins, so an
implementation never has to check which backend it is asked about, and no hook is
"firstresult".

This module is public (``ampcore.hookspec``, in ``ampcore.__all__``).

**Contract version.**  A plugin declares the contract it targets with a module (or object)
attribute ``AMPCORE_CONTRACT = 2`` (:data:`CONTRACT_VERSION`; :data:`SUPPORTED_CONTRACTS`
are all this ampcore loads).  The contract changes only with ampcore's minor version:
ampcore 0.1.x implements contract 1; 0.2.x contract 2, and loads contract-1 plugins (no
``AMPCORE_CONTRACT``; :data:`DEPRECATED_CONTRACTS`) through a translation layer with one
:class:`ampcore.PluginWarning` naming each hook to change; 0.3.0 drops contract 1.  Other
contracts fail at load with a :class:`ampcore.PluginError` naming the plugin, the supported
contracts and what changed (:data:`CONTRACT_CHANGES`); so does a contract-2 plugin defining
a contract-1 hook.  docs/migrating-contract-1.md maps every contract-1 hook to contract 2.

One hook is required: :func:`ampcore_backend`, which says who the backend is (a
:class:`BackendSpec`, defined in ``ampcore/_backend_spec.py`` with the rules of its fields;
public as ``ampcore.BackendSpec`` and ``ampcore.hookspec.BackendSpec``).  Every other hook
is optional; the core default used when a plugin leaves it out is given in its docstring.
An implementation may accept any subset of the hook's parameters, by name.  A function in a
plugin whose name starts with ``ampcore_`` but matches no hook below is an error (it is
almost always a misspelling).

Example plugin module::

    import torch
    from ampcore import BackendSpec, hookimpl

    AMPCORE_CONTRACT = 2

    @hookimpl
    def ampcore_backend() -> BackendSpec:
        return BackendSpec(name="example", device_type="cpu", dtypes=[torch.bfloat16])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final

import pluggy

# the value ampcore_backend() returns (its fields and their rules: ampcore/_backend_spec.py)
from ._backend_spec import BackendSpec

# what changed in each contract, and contract-1 hooks -> what replaces them (error texts)
from ._contract_history import CONTRACT_CHANGES, REMOVED_HOOKS

if TYPE_CHECKING:
    import torch

    from ._backends.capability import CapabilityIssue

__all__ = [
    "BackendSpec", "CONTRACT_ATTRIBUTE", "CONTRACT_CHANGES", "CONTRACT_VERSION", "DEPRECATED_CONTRACTS",
    "ENTRY_POINT_GROUP", "PROJECT_NAME", "REMOVED_HOOKS", "REQUIRED_HOOKS", "SUPPORTED_CONTRACTS", "hookimpl",
    "hookspec",
]  # fmt: skip

PROJECT_NAME: Final = "ampcore"
#: The entry-point group through which installed plugins are found.
ENTRY_POINT_GROUP: Final = "ampcore"

#: The contract version this ampcore implements (what ``AMPCORE_CONTRACT`` should say).
CONTRACT_VERSION: Final = 2
#: Every contract version this ampcore loads plugins of.
SUPPORTED_CONTRACTS: Final = (1, 2)
#: Contract versions loaded through a translation layer, with a warning (until ampcore 0.3.0).
DEPRECATED_CONTRACTS: Final = (1,)
#: The plugin attribute that declares the contract version (missing: contract 1).
CONTRACT_ATTRIBUTE: Final = "AMPCORE_CONTRACT"
#: Marker for hook specifications (used by this module only).
hookspec: Final = pluggy.HookspecMarker(PROJECT_NAME)
#: Marker that adapters put on their hook implementations.
hookimpl: Final = pluggy.HookimplMarker(PROJECT_NAME)

#: Hooks every adapter must implement.
REQUIRED_HOOKS: Final = ("ampcore_backend",)


# ---------------------------------------------------------------------------------------
# Identity (required)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_backend() -> BackendSpec:  # type: ignore[empty-body]
    """Who this backend is: its name, the torch device type it drives, its dtypes, default
    dtype and priority, as a :class:`BackendSpec` (see its fields for the rules).

    Read once, when the plugin is loaded; a wrong field fails the load with the field and
    what is valid.

    **Required.**

    Use in plugins: ``return BackendSpec("acme", "acme", [torch.float16, torch.bfloat16], priority=100)``.
    """


# ---------------------------------------------------------------------------------------
# Availability (optional)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_unavailable_reason() -> str | None:
    """Why this backend cannot run here, or ``None`` when it can.

    Called lazily (the first time the backend is used or listed) and cached.  Import the
    vendor's torch extension here, never at module import time, and catch its failures:
    a missing runtime must make the backend *unavailable*, not break ampcore.

    Core default: ``None`` (available).

    Use in plugins: ``return None if my_ext.is_available() else "no device found"``.
    """


# ---------------------------------------------------------------------------------------
# Device description and capability (optional)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_device_count() -> int:  # type: ignore[empty-body]
    """How many devices of this backend are visible; ``device="name:N"`` needs ``N < count``.

    Only called when the backend is available.

    Core default: 1.
    """


@hookspec
def ampcore_device_name(device_index: int) -> str:  # type: ignore[empty-body]
    """A human-readable name of device ``device_index`` (e.g. ``"NVIDIA A100-SXM4-40GB"``).

    Only called when the backend is available.

    Core default: the device type.
    """


@hookspec
def ampcore_check_capability(  # type: ignore[empty-body]
    dtype: torch.dtype, device_index: int
) -> Iterable[CapabilityIssue]:
    """Findings about running ``dtype`` on device ``device_index``.

    Return :class:`ampcore.CapabilityIssue` items: ``"warning"`` for "runs, but expect no
    speed-up" (ampcore warns once per backend, device and dtype) and ``"error"`` for "cannot
    run" (ampcore raises before entering autocast).  Keep the decision in a pure function of
    recorded device properties so it can be unit-tested without the device.

    Only called when the backend is available; results are cached per
    (device_index, dtype).

    Core default: no findings.
    """


@hookspec
def ampcore_needs_loss_scaling(dtype: torch.dtype) -> bool:  # type: ignore[empty-body]
    """Whether gradients of ``dtype`` need loss scaling to avoid underflow.

    :class:`ampcore.GradScaler` is a transparent no-op (scale 1, non-finite steps still
    skipped) for dtypes that do not, unless the user forces it.

    Core default: ``True`` for ``torch.float16`` only.
    """


# ---------------------------------------------------------------------------------------
# Op lists (optional)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_op_list_adjustments(
    dtype: torch.dtype,
) -> Mapping[str, Iterable[str]] | None:
    """Changes to the default op lists of this backend for ``dtype``.

    Keys are ``"white"`` (run in ``dtype``), ``"black"`` (run in float32) and ``"promote"``
    (run in the widest input dtype); values are ATen op names (or documented aliases).  An
    op named under a key moves into that list and leaves the others.  User lists passed to
    :class:`ampcore.autocast` still apply on top.

    Core default: no changes (the native ``torch.autocast`` lists of the device type).

    Use in plugins: ``return {"black": ["layer_norm"]} if dtype == torch.float16 else None``.
    """


# ---------------------------------------------------------------------------------------
# Loss scaling (optional)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_device_overflow_flag(device: torch.device) -> torch.Tensor | None:
    """The device's own overflow status (for chips whose arithmetic saturates instead of
    producing inf, such as Ascend NPUs outside INF_NAN mode).

    Return a one-element tensor on ``device`` that is > 0 when an overflow happened since
    the last :func:`ampcore_clear_device_overflow_flag`, or ``None`` when the device does not
    need it.  The scaler ORs it into ``found_inf``.

    ``device`` always has an index (``npu:0``, never ``npu``; the current device when the
    user named none).  The flag may have any dtype and shape of one element; it is read on
    the device, never synchronised to the host.  Another result marks the plugin failed; an
    exception is raised from ``GradScaler.step``/``unscale_`` as an
    :class:`ampcore.PluginError` naming this hook and the plugin.  Implement
    :func:`ampcore_clear_device_overflow_flag` with it.  ``ampcore info`` shows the backends
    that detect overflow by a flag.

    Core default: ``None``.
    """


@hookspec
def ampcore_clear_device_overflow_flag(device: torch.device) -> None:
    """Reset the status read by :func:`ampcore_device_overflow_flag` (called by
    :meth:`ampcore.GradScaler.update` once the iteration's steps read it, so that the next
    window covers the forward and backward passes of every micro-batch of the next iteration).

    ``device`` is given as for :func:`ampcore_device_overflow_flag` (with its index); the
    result is ignored; an exception is raised from the :class:`ampcore.GradScaler` call that
    clears the flag, as an :class:`ampcore.PluginError` naming this hook and the plugin.

    Core default: nothing.
    """


# ---------------------------------------------------------------------------------------
# Memory (optional; used by `ampcore bench` and the conformance speed report)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_memory(device_index: int, reset_peak: bool) -> Mapping[str, int | None] | None:
    """Memory of device ``device_index`` in bytes: ``{"in_use": ..., "peak": ..., "total": ...}``
    (any key may be left out or ``None`` when the backend cannot tell), or ``None``: the
    backend cannot tell any of them (the same as ``{}``; ``ampcore bench`` prints ``-``).
    Values are ints >= 0 or ``None``; another key or value (``{"in_use": "lots"}``) marks
    the plugin failed and raises an :class:`ampcore.PluginError` naming this hook.

    ``in_use`` is what is allocated now (host backends: the process's resident memory),
    ``peak`` the most in use since the last reset, ``total`` the device's capacity (``None``
    for backends computing in host memory; then ``ampcore bench`` picks the scaled-down
    sizes).  With ``reset_peak=True`` the call also starts a new peak measurement (the core
    ignores what it returns then).

    Core default: ``torch.accelerator`` (``memory_allocated``, ``max_memory_allocated``,
    ``reset_peak_memory_stats``, ``get_memory_info``) when the backend's device type is
    torch's current accelerator, else unknown.

    Use in plugins::

        @hookimpl
        def ampcore_memory(device_index, reset_peak):
            if reset_peak:
                torch_myvendor.reset_peak_memory_stats(device_index)
            return {"in_use": torch_myvendor.memory_allocated(device_index),
                    "peak": torch_myvendor.max_memory_allocated(device_index)}
    """


# ---------------------------------------------------------------------------------------
# O2 model preparation (optional)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_prepare_o2(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, dtype: torch.dtype
) -> tuple[torch.nn.Module, torch.optim.Optimizer | None] | None:
    """Prepare ``model`` (and ``optimizer``, when given) for level O2 in ``dtype`` with the
    vendor's own tool, e.g. ``ipex.optimize(model, dtype=torch.bfloat16, optimizer=opt)``.

    Called by :func:`ampcore.decorate` with ``level="O2"`` for a model on this backend,
    before the core's own O2 preparation.  Return ``(model, optimizer)`` (the objects to use
    from now on; ``optimizer`` is ``None`` when none was given) when the adapter did the
    whole preparation: low-precision parameters and whatever keeps the update exact (fp32
    master weights or the vendor's equivalent).  ampcore then skips its own casting and
    master weights for this model.  Return ``None`` to let the core do it (also when the
    vendor's tool is absent or unusable: warn, then return ``None``).

    Core default: ``None`` (the core casts parameters and keeps fp32 master weights).

    Use in plugins: import the vendor tool lazily here; return ``None`` for dtypes it does
    not handle.
    """


# ---------------------------------------------------------------------------------------
# Synchronisation (optional; used by `ampcore bench` and the conformance speed report)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_synchronize(device_index: int) -> None:
    """Wait until the work queued on device ``device_index`` has finished (for timing).

    Core default: ``torch.accelerator.synchronize`` when the backend's device type is
    torch's current accelerator and torch supports it there; else the device module's
    ``torch.<device_type>.synchronize()`` (called without an index: the current device)
    when it has one; else nothing (host backends).  A PrivateUse1 device registered from
    Python is unknown to ``torch.accelerator``, so the default relies on your device module:
    implement this hook when that module has no ``synchronize()``, or when timing must wait
    for device ``device_index`` rather than the current one.

    Use in plugins: ``torch_myvendor.synchronize(device_index)``.
    """


# ---------------------------------------------------------------------------------------
# Description for `ampcore info` (optional)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_backend_info() -> Mapping[str, str]:  # type: ignore[empty-body]
    """Further facts about the backend for ``ampcore info``: name -> one line of text, e.g.
    ``{"ipex": "not used: ..."}`` (what a vendor library on this backend is doing).

    ``ampcore info`` lists each entry under the backend table and in its JSON output
    (``"info"`` of the backend).  Called only when the backend is available; an exception
    is shown as an adapter error and does not stop ``ampcore info``.

    Core default: ``{}``.

    Use in plugins: cheap and side-effect free: read versions from package metadata rather
    than importing a vendor library that may abort the process.
    """


# ---------------------------------------------------------------------------------------
# Costs for level="auto" (optional)
# ---------------------------------------------------------------------------------------


@hookspec
def ampcore_auto_costs(shape_class: str, dtype: torch.dtype) -> Mapping[str, float] | None:
    """The costs of one shape class for ``level="auto"``, instead of measuring them.

    ``shape_class`` is the key the plan stores decisions under, e.g.
    ``"Linear(in_features=1024, out_features=1024, bias=True) in=[512x1024] grad"``
    (see docs/auto.md).  Return a mapping with ``fp32_ms`` and ``low_ms`` (forward and
    backward of one call; ``low_ms`` including the casts) and optionally ``cast_ms``; the
    core decides from them as from measured costs.  Return ``None`` to let the core measure.

    Core default: ``None`` (the core measures with micro-benchmarks).

    Use in plugins: a table from the vendor's own cost model or profiler; ``None`` for
    classes it does not know.
    """


@hookspec
def ampcore_auto_load(device_index: int) -> float | None:
    """How busy *other* work keeps device ``device_index`` right now, for ``level="auto"``:
    0.0 idle, 1.0 as much other work as the device has units (CPU cores, ...), more when
    work queues; ``None`` when the adapter cannot tell.

    A whole-call check measured while this is over 0.5 (or whose ratios spread widely) is
    kept as *provisional* and measured again by a later process, at most three times in all
    (docs/auto.md, "A verdict measured on a busy machine heals"): another program on the
    device can shift a whole measurement at once.

    Core default: ``None`` (only the spread of the measurement marks it provisional).

    Use in plugins: cheap, no synchronisation; exclude this process's own work where you
    can (the CPU adapter: the load average minus this process's threads, over the usable
    cores).
    """


@hookspec
def ampcore_auto_timer(device_index: int) -> Callable[[], float] | None:
    """A clock (a function returning seconds, as ``time.perf_counter``) for
    ``level="auto"`` to time its runs on device ``device_index`` with, instead of the wall
    clock around :func:`ampcore_synchronize`; ``None``: the wall clock.  Not used where the
    device has timing events (``torch.Event(enable_timing=True)``).

    Offer one only where it measures what the user waits for on a quiet device but not the
    time other work holds the device: on a busy machine the wall clock of a short run
    catches the scheduler's time slices of other processes, and the paired rounds of a
    measurement then tie where one side is clearly faster (docs/auto.md, "How it
    decides").  Asked at each timed run: the answer may change with the thread count.
    A shape class or a whole-call check timed with it on a busy device (``ampcore_auto_load``
    over 0.5) is provisional only where its two sides (a check's: a comparison its verdict
    rests on) lie within twice their spread: the load reaches such figures through their
    spread alone (docs/auto.md, item 7 of "How it decides", and the whole-call check).

    Core default: ``None`` (the wall clock).

    Use in plugins: the CPU adapter gives the calling thread's CPU time
    (``time.thread_time``) while torch computes on one thread (all of a call's work then
    runs on the calling thread), ``None`` with more threads (work spread over threads that
    clock does not see).
    """


@hookspec
def ampcore_auto_waited(device_index: int) -> Callable[[], float] | None:
    """A count of the time this process's threads have waited for device ``device_index``
    while other work held it (a function returning seconds so far, never decreasing), for
    ``level="auto"`` to tell a timed run that other work pre-empted; ``None``: no count.
    Used with the host's clock only (not where the device has timing events).

    A run while which the count grew by more than 5% of the run's time (and more than
    50 us) is timed again, up to four tries, the fastest counting where every try was
    pre-empted (docs/auto.md, "How it decides"): where a run's work spreads over threads,
    neither one thread's clock nor the wall clock leaves other work's time slices out.
    The count is read before and after each try, outside the timed interval; a reading
    that is no finite number of seconds >= 0 is a :class:`~ampcore.PluginError`.  Asked at
    each timed run: the answer may change with the thread count.

    Core default: ``None`` (runs are timed once).

    Use in plugins: cheap to read (microseconds); the CPU adapter gives, while torch
    computes on more than one thread, the sum of its threads' run delay (Linux
    ``/proc/self/task/*/schedstat``: time runnable but waiting for a core), ``None`` with
    one thread (its ``ampcore_auto_timer`` leaves the waits out) or where the kernel does not
    give the run delay.
    """
