"""BatchNorm layers without a float32 island, where the device's kernel mixes dtypes.

Level O2 keeps BatchNorm's weights and running statistics in float32.  torch's batch-norm
kernels on CPU and CUDA take a low-precision input with float32 weights and statistics,
compute in float32 and return the input's dtype (what ``torch.autocast`` runs, and what
Paddle's and Apex's O2 rely on).  Where a device's kernel does so (probed once per device
and dtype, forward and backward, on a tiny tensor: :func:`mixed_batch_norm`), a torch
BatchNorm layer runs on the low-precision activations as they arrive; elsewhere it stays a
float32 island (casts in and out and autocast off inside, about four times the layer's
time at small sizes: docs/performance.md).  Either way its output is in the low-precision
dtype (:class:`LowOutput`), so the model runs the same with and without autocast.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .model_plan import cast_floating

__all__ = ["LowOutput", "mixed_batch_norm"]


@functools.lru_cache(maxsize=64)
def mixed_batch_norm(device: str, low: torch.dtype) -> bool:
    """Whether ``F.batch_norm`` on ``device`` takes a ``low`` input with float32 weights and
    running statistics in training mode, forward and backward, and gives a ``low`` output,
    float32 statistics and gradients in each input's dtype (probed once; False on any error).
    """
    try:
        # decorate may run under no_grad or inference_mode: the answer must not depend on it
        with torch.inference_mode(False), torch.enable_grad():
            return _probe(device, low)
    except Exception:  # noqa: BLE001 - any failure means "no": the layer stays an island
        return False


def _probe(device: str, low: torch.dtype) -> bool:
    x = torch.linspace(-1.0, 2.0, 12, device=device).reshape(4, 3).to(low).requires_grad_()
    weight = torch.ones(3, device=device, requires_grad=True)
    bias = torch.zeros(3, device=device, requires_grad=True)
    mean, var = torch.zeros(3, device=device), torch.ones(3, device=device)
    out = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.5)
    out.float().square().sum().backward()
    return (
        out.dtype == low
        and mean.dtype == var.dtype == torch.float32
        and bool(mean.abs().sum() > 0)  # the statistics moved: updated in place, not a copy
        and x.grad is not None
        and x.grad.dtype == low
        and weight.grad is not None
        and weight.grad.dtype == torch.float32
    )


class LowOutput:
    """Forward hook: the layer's floating outputs in ``dtype`` (a no-op when they are)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if isinstance(output, torch.Tensor) and output.dtype == self.dtype:
            return output  # the common case: a low-precision input gave a low-precision output
        return cast_floating(output, self.dtype)
