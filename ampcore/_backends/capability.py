"""Capability findings that adapters report for a device and dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CapabilityIssue", "Severity"]

Severity = Literal["warning", "error"]


@dataclass(frozen=True)
class CapabilityIssue:
    """One finding of an adapter's capability check.

    ``severity="warning"`` means the dtype runs but is likely slow or imprecise here (ampcore
    warns once per backend, device and dtype); ``severity="error"`` means the dtype cannot
    run correctly here (ampcore raises :class:`ampcore.AmpcoreError` before entering autocast).

    Example::

        >>> CapabilityIssue("warning", "bfloat16 runs emulated on this CPU")
        CapabilityIssue(severity='warning', message='bfloat16 runs emulated on this CPU')
    """

    severity: Severity
    message: str

    def __post_init__(self) -> None:
        if self.severity not in ("warning", "error"):
            raise ValueError(f"CapabilityIssue(severity={self.severity!r}): severity must be 'warning' or 'error'")
