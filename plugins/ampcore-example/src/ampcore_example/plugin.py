"""THIS IS A TEMPLATE.  The ``example`` backend drives the CPU; it is not a real device.

Copy this module to start the adapter of your accelerator.  It shows every hook of the
contract (:mod:`ampcore.hookspec`):

* the **required** hook (``ampcore_backend``: who the backend is), implemented;
* the **optional** hooks this template needs, implemented with the reason for each value;
* the optional hooks it does not need, at the bottom, as commented-out code with a note on
  when your device needs them.

The design rule of ampcore adapters: device logic lives in *pure functions of recorded
device properties* (here :class:`ExampleDeviceProperties` and
:func:`example_capability_issues`), unit-tested without the device; the hook functions stay
thin.  Your vendor's torch extension is imported lazily inside the hooks, never at module
import, so a machine without it lists the backend as unavailable instead of breaking.

What ``example`` does, so that it runs anywhere (and the conformance suite can run on it):

* device type ``"cpu"`` under its own backend name ``"example"``;
* ``bfloat16`` only (no loss scaling needed);
* op lists: the CPU's native ``torch.autocast`` lists, plus ``layer_norm`` and
  ``group_norm`` moved to the black list (float32), as CUDA's native lists and Paddle keep
  normalisation statistics in float32;
* priority -10: ``device=None`` never picks it over a real device (not even over ``cpu``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import torch

from ampcore import BackendSpec, CapabilityIssue, hookimpl

#: The adapter contract this plugin targets (ampcore.hookspec).
AMPCORE_CONTRACT = 2

#: The backend name users pass as ``device="example"``.  Rename it (see README.md).
BACKEND: Final = "example"

#: Ops this backend moves to the black list (float32) for bfloat16; see the module docstring.
BF16_BLACK_LIST: Final = ("layer_norm", "group_norm")


# -- pure device logic (unit-tested without the device) -----------------------------------


@dataclass(frozen=True)
class ExampleDeviceProperties:
    """What this adapter needs to know about one device, recorded once.

    A real adapter records what its vendor API reports (chip name, generation, feature
    flags) so that the tests can replay properties of devices the test machine lacks.

    ``bf16_native`` is whether the CPU has native bf16 instructions (``avx512_bf16`` or
    ``amx_bf16`` in ``torch.cpu.get_capabilities()``), ``None`` when torch cannot tell.
    """

    name: str
    bf16_native: bool | None = None


def example_capability_issues(props: ExampleDeviceProperties, dtype: torch.dtype) -> list[CapabilityIssue]:
    """The findings for ``dtype`` on a device with ``props`` (a pure function).

    Use ``"warning"`` for "runs, but slowly" and ``"error"`` for "cannot run correctly here".

    Example::

        >>> example_capability_issues(ExampleDeviceProperties("Old CPU", bf16_native=False), torch.bfloat16)[0].severity
        'warning'
        >>> example_capability_issues(ExampleDeviceProperties("New CPU", bf16_native=True), torch.bfloat16)
        []
    """
    if dtype == torch.bfloat16 and props.bf16_native is False:
        return [
            CapabilityIssue(
                "warning",
                f"the example backend (a TEMPLATE driving the CPU) runs bfloat16 emulated on {props.name}: "
                "expect it to be slower than float32",
            )
        ]
    return []


def read_properties() -> ExampleDeviceProperties:
    """Record the device's properties.  A real adapter calls its vendor API here (lazily)."""
    getter = getattr(torch.cpu, "get_capabilities", None)
    try:
        caps = dict(getter()) if getter is not None else {}
    except Exception:  # unusual builds: properties unknown
        caps = {}
    native = None if not caps else bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))
    return ExampleDeviceProperties(str(caps.get("cpu_name") or "the CPU"), native)


# -- the required hook --------------------------------------------------------------------


@hookimpl
def ampcore_backend() -> BackendSpec:
    return BackendSpec(
        name=BACKEND,
        # The torch device type whose autocast and kernels this backend uses.  A PrivateUse1
        # vendor gives the name it renamed PrivateUse1 to (torch_npu: "npu").
        device_type="cpu",
        # Only dtypes the hardware really runs, best first; the conformance suite checks each.
        dtypes=[torch.bfloat16],
        default_dtype=torch.bfloat16,  # dtype=None (default: the first of dtypes)
        # cuda/npu 100, xpu 80, plugins 50 by default, cpu 0: a template must never be
        # chosen by device=None.
        priority=-10,
    )


# -- optional hooks this template needs ---------------------------------------------------


@hookimpl
def ampcore_unavailable_reason() -> str | None:
    # A real adapter imports its extension here and turns every failure into a reason:
    #
    #     try:
    #         import torch_myvendor
    #     except Exception as exc:
    #         return f"importing torch_myvendor failed ({type(exc).__name__}: {exc})"
    #     if not torch_myvendor.is_available():
    #         return "no MyVendor device or driver found"
    #     return None
    return None  # the CPU is always there


@hookimpl
def ampcore_device_count() -> int:
    return 1


@hookimpl
def ampcore_device_name(device_index: int) -> str:
    return f"{read_properties().name} (example TEMPLATE backend)"


@hookimpl
def ampcore_check_capability(dtype: torch.dtype, device_index: int) -> list[CapabilityIssue]:
    return example_capability_issues(read_properties(), dtype)


@hookimpl
def ampcore_needs_loss_scaling(dtype: torch.dtype) -> bool:
    # bf16 has float32's exponent range: gradients do not underflow, no loss scaling.
    return dtype == torch.float16


@hookimpl
def ampcore_op_list_adjustments(dtype: torch.dtype) -> Mapping[str, Sequence[str]] | None:
    if dtype == torch.bfloat16:
        return {"black": list(BF16_BLACK_LIST)}
    return None


# -- optional hooks this template leaves to the core (uncomment what your device needs) ----
#
# A chip that saturates instead of producing inf (Ascend NPUs outside INF_NAN mode): hand
# the scaler the chip's overflow register, and clear it before backward:
#
#     @hookimpl
#     def ampcore_device_overflow_flag(device) -> torch.Tensor | None:
#         return torch_myvendor.read_overflow_register(device)   # one element, > 0: overflow
#
#     @hookimpl
#     def ampcore_clear_device_overflow_flag(device) -> None:
#         torch_myvendor.clear_overflow_register(device)
#
# Device memory, for `ampcore bench` and the conformance speed report (core default uses
# torch.accelerator when your device type is torch's current accelerator):
#
#     @hookimpl
#     def ampcore_memory(device_index, reset_peak) -> dict[str, int | None] | None:
#         if reset_peak:
#             torch_myvendor.reset_peak_memory_stats(device_index)
#         return {"in_use": torch_myvendor.memory_allocated(device_index),
#                 "peak": torch_myvendor.max_memory_allocated(device_index),
#                 "total": torch_myvendor.get_device_properties(device_index).total_memory}
#
# Your vendor's own O2 preparation (as the cpu adapter can use ipex.optimize, when the user
# opts in with AMPCORE_CPU_IPEX=optimize):
#
#     @hookimpl
#     def ampcore_prepare_o2(model, optimizer, dtype):
#         if dtype != torch.bfloat16:
#             return None      # the core casts parameters and keeps fp32 master weights
#         return torch_myvendor.optimize(model, dtype=dtype, optimizer=optimizer)
#
# Waiting for the device's queued work, for `ampcore bench` timings (core default:
# torch.accelerator, then torch.<device_type>.synchronize(), else nothing):
#
#     @hookimpl
#     def ampcore_synchronize(device_index) -> None:
#         torch_myvendor.synchronize(device_index)
#
# Further facts shown by `ampcore info` under the backend table (cheap, no vendor import):
#
#     @hookimpl
#     def ampcore_backend_info() -> dict[str, str]:
#         return {"runtime": f"myvendor-runtime {importlib.metadata.version('myvendor-rt')}"}
#
# Costs for level="auto" from your own cost model instead of ampcore's micro-benchmarks
# (None: let ampcore measure the shape class):
#
#     @hookimpl
#     def ampcore_auto_costs(shape_class, dtype) -> dict[str, float] | None:
#         return torch_myvendor.cost_table.get((shape_class, dtype))  # {"fp32_ms", "low_ms"}
#
# How busy other work keeps the device (1.0: as much as it has units; None: cannot tell);
# level="auto" measures a whole-call verdict again in a later process when it was busy:
#
#     @hookimpl
#     def ampcore_auto_load(device_index) -> float | None:
#         return torch_myvendor.utilization_by_others(device_index)  # cheap, no synchronisation
#
# A clock for level="auto" where your device has no timing events and the wall clock
# around ampcore_synchronize would catch other work's time slices (None: the wall clock):
#
#     @hookimpl
#     def ampcore_auto_timer(device_index) -> Callable[[], float] | None:
#         return torch_myvendor.busy_seconds  # seconds of this process's work on the device
#
# Where the clock above (or the wall clock) still includes time other work held the device,
# a count of that waiting (seconds so far, never decreasing): level="auto" times a run again
# when it grew during the run (None: each run timed once):
#
#     @hookimpl
#     def ampcore_auto_waited(device_index) -> Callable[[], float] | None:
#         return torch_myvendor.seconds_preempted  # cheap: read before and after each run
