"""Saturating float16 arithmetic and the device overflow flag (``install(..., fp16="saturate")``).

Some chips (Ascend NPUs outside INF_NAN mode) do not produce inf or nan in float16: a result
beyond +-65504 is clamped to +-65504 and a global overflow status is raised instead, which
the runtime reads and clears (``npu_get_float_status`` / ``npu_clear_float_status``).  In
mode ``"saturate"`` the test device does the same to every float16 result of its kernels:
+-inf becomes +-65504, nan becomes 0, and the flag is raised.  Other dtypes keep IEEE
arithmetic.  Values the CPU kernel rounds to 65504 (up to 65519) stay finite without a flag,
as on the chips.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import torch
from torch.utils._pytree import tree_leaves

__all__ = ["FP16_MODES", "Fp16Mode", "clear_overflow_flag", "overflow_raised", "saturate_results"]

Fp16Mode = Literal["ieee", "saturate"]
FP16_MODES: Final[tuple[Fp16Mode, ...]] = ("ieee", "saturate")
_FP16_MAX: Final = 65504.0
#: The device's overflow status (one per process, as the chip's global register).
_FLAG: Final = torch.zeros(1)
_enabled: list[bool] = [False]


def enable() -> None:
    """Turn saturation on for the rest of the process (``install`` does, once)."""
    _enabled[0] = True


def saturate_results(op: torch._ops.OpOverload, out: Any) -> None:
    """Clamp the non-finite values of ``out``'s float16 CPU tensors in place, raising the flag.

    View ops are left alone (they compute nothing; their base was saturated when written).
    """
    if not _enabled[0] or op.is_view:
        return
    for value in tree_leaves(out):
        if isinstance(value, torch.Tensor) and value.dtype == torch.float16 and value.numel():
            if not bool(value.isfinite().all()):
                torch.nan_to_num_(value, nan=0.0, posinf=_FP16_MAX, neginf=-_FP16_MAX)
                _FLAG.fill_(1.0)


def overflow_raised() -> torch.Tensor:
    """A copy of the flag (a one-element float32 CPU tensor, 1.0 once an overflow happened)."""
    return _FLAG.clone()


def clear_overflow_flag() -> None:
    """Reset the flag."""
    _FLAG.zero_()
