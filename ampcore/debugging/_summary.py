"""``TensorSummary``: what a numerics finding says about one op input or output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import torch

__all__ = ["FP16_MAX", "TensorSummary", "summarise"]

#: The largest finite float16 value.
FP16_MAX: Final[float] = float(torch.finfo(torch.float16).max)


@dataclass(frozen=True)
class TensorSummary:
    """The dtype, shape and value range of a tensor (or a Python number) an op saw.

    ``min``/``max`` are over the finite values (None when there are none or the tensor is
    not numeric); ``nan``, ``posinf`` and ``neginf`` count the non-finite ones.

    Example::

        >>> str(summarise(torch.tensor([1.0, float("inf")])))
        'float32[2] min=1 max=1 +inf=1'
    """

    dtype: str
    shape: tuple[int, ...] | None
    min: float | None = None
    max: float | None = None
    nan: int = 0
    posinf: int = 0
    neginf: int = 0

    @property
    def finite(self) -> bool:
        """Whether no value is nan or inf."""
        return not (self.nan or self.posinf or self.neginf)

    def __str__(self) -> str:
        text = self.dtype if self.shape is None else f"{self.dtype}[{', '.join(map(str, self.shape))}]"
        if self.shape is None and self.min is not None:
            return f"{text} {self.min:g}"
        if self.min is not None and self.max is not None:
            text += f" min={self.min:g} max={self.max:g}"
        for label, count in (("nan", self.nan), ("+inf", self.posinf), ("-inf", self.neginf)):
            if count:
                text += f" {label}={count}"
        return text


def summarise(value: Any) -> TensorSummary | None:
    """Summarise a tensor or a Python number; None for anything else.  Synchronises."""
    if isinstance(value, bool) or not isinstance(value, (torch.Tensor, int, float)):
        return None
    if not isinstance(value, torch.Tensor):
        number = float(value)
        return TensorSummary(type(value).__name__, None, number, number)
    dtype = str(value.dtype).removeprefix("torch.")
    shape = tuple(value.shape)
    unreadable = value.is_meta or value.is_quantized or value.layout != torch.strided
    if unreadable or not value.numel() or value.dtype == torch.bool:
        return TensorSummary(dtype, shape)
    if value.is_complex():
        value = torch.view_as_real(value)
    if not value.is_floating_point():
        return TensorSummary(dtype, shape, float(value.min()), float(value.max()))
    finite = torch.isfinite(value)
    values = value[finite]
    low = high = None
    if values.numel():
        low, high = float(values.min()), float(values.max())
    nan = int(torch.isnan(value).sum())
    posinf = int((value == float("inf")).sum())
    neginf = int((value == float("-inf")).sum())
    return TensorSummary(dtype, shape, low, high, nan, posinf, neginf)
