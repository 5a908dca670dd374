"""``ampcore.autocast``: torch.autocast driven by a backend adapter and an AMP level."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import torch

from ._backend import dtype_name
from ._errors import AmpcoreError
from ._levels import IMPLEMENTED_LEVELS, check_level
from ._registry import DeviceLike, resolve_device
from ._state import AutocastFrame, pop_frame, push_frame

__all__ = ["autocast"]

F = TypeVar("F", bound=Callable[..., Any])


class autocast:
    """Run a region in mixed precision on any backend.

    A context manager and a decorator.  Inside the region, ops of the backend's white
    list run in ``dtype``, black-list ops in float32, the others as ``level`` says:

    * ``"O0"``: everything float32 (autocast off).
    * ``"O1"``: the native ``torch.autocast`` lists and semantics of the device (so exactly
      as fast as ``torch.autocast``).
    * ``"OD"`` / ``"O2"``: see docs/levels.md.

    Args:
        device: ``"cuda"``, ``"cuda:1"``, a ``torch.device`` or ``None`` for the best
            available backend.
        dtype: the low-precision dtype; ``None`` takes the backend's default.
        level: the AMP level.
        enabled: ``False`` turns autocast off for this device type in the region (also
            inside an enclosing enabled region), as ``torch.autocast(enabled=False)``.
        cache_enabled: whether casts of leaf tensors (weights) are cached in the region;
            ``None`` keeps torch's current setting.

    Raises:
        AmpcoreError: unknown backend (the message lists known backends and their
            availability), unavailable backend (with the adapter's reason), dtype the
            backend does not support, invalid level, a capability error of the device, or
            torch refusing to enable autocast.

    Example::

        >>> import torch, ampcore
        >>> x = torch.randn(8, 8)
        >>> with ampcore.autocast(device="cpu"):
        ...     torch.mm(x, x).dtype
        torch.bfloat16
        >>> @ampcore.autocast(device="cpu", enabled=False)
        ... def fp32_part(t):
        ...     return torch.mm(t, t)
        >>> with ampcore.autocast(device="cpu"):
        ...     fp32_part(x).dtype
        torch.float32
    """

    def __init__(
        self,
        device: DeviceLike = None,
        dtype: torch.dtype | None = None,
        level: str = "O1",
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        checked_level = check_level(level)
        if not isinstance(enabled, bool):
            raise AmpcoreError(f"ampcore.autocast(enabled={enabled!r}): expected True or False")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise AmpcoreError(f"ampcore.autocast(dtype={dtype!r}): expected a torch.dtype such as torch.bfloat16")
        resolved = resolve_device(device)
        backend = resolved.backend
        self.backend = backend
        self.device_index = resolved.index
        self.device_type = backend.device_type
        self.dtype = backend.check_dtype(dtype)
        if checked_level not in IMPLEMENTED_LEVELS:
            raise AmpcoreError(
                f"ampcore.autocast(level={checked_level!r}): level {checked_level} is not available yet "
                f"in this version; implemented levels: {', '.join(sorted(IMPLEMENTED_LEVELS))}"
            )
        self.level = checked_level
        self.enabled = enabled and checked_level != "O0"
        self.cache_enabled = cache_enabled
        if self.enabled:
            backend.enforce_capability(self.dtype, self.device_index or 0, stacklevel=2)
        self._frame = AutocastFrame(backend, self.dtype, checked_level, self.enabled)
        self._local = threading.local()

    def __repr__(self) -> str:
        return (
            f"ampcore.autocast(device={self.backend.name!r}, dtype=torch.{dtype_name(self.dtype)}, "
            f"level={self.level!r}, enabled={self.enabled})"
        )

    def __enter__(self) -> autocast:
        inner = torch.autocast(
            self.device_type, dtype=self.dtype, enabled=self.enabled, cache_enabled=self.cache_enabled
        )
        inner.__enter__()
        if self.enabled and not (
            torch.is_autocast_enabled(self.device_type) and torch.get_autocast_dtype(self.device_type) == self.dtype
        ):
            inner.__exit__(None, None, None)
            raise AmpcoreError(
                f"{self!r}: torch did not enable autocast for device type {self.device_type!r} with "
                f"{self.dtype}; refusing to run in float32 silently. Check the {self.backend.name!r} "
                f"adapter ({self.backend.distribution}) and `ampcore info`."
            )
        try:
            stack = self._local.stack
        except AttributeError:
            stack = self._local.stack = []
        stack.append(inner)
        push_frame(self._frame)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        pop_frame()
        self._local.stack.pop().__exit__(exc_type, exc, traceback)

    def __call__(self, func: F) -> F:
        """Use the region as a decorator: the function runs inside it on every call."""

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
