"""``ampcore.autocast``: torch.autocast driven by a backend adapter, an AMP level and op lists."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar

import torch

from ._backend import dtype_name
from ._compile import constant_result, guard_mode, opaque
from ._dispatch import Policy, acquire, policy_for, release
from ._errors import AmpcoreError
from ._levels import check_level
from ._oplist_names import canonical_ops
from ._oplists import check_custom, compute_oplists, merge_custom
from ._registry import DeviceLike, resolve_device
from ._state import AutocastFrame, current_frame, pop_frame, thread_state

__all__ = ["autocast"]

F = TypeVar("F", bound=Callable[..., Any])

_CALL = "ampcore.autocast"
_EMPTY: frozenset[str] = frozenset()
_is_compiling = torch.compiler.is_compiling
_thread = thread_state()
_new_object = object.__new__


class autocast:
    """Run a region in mixed precision on any backend.

    A context manager and a decorator.  Inside the region, ops of the white list run in
    ``dtype``, black-list ops in float32, promote-list ops in the widest input dtype, and
    the others as ``level`` says (see docs/levels.md):

    * ``"O0"``: everything float32 (autocast off).
    * ``"OD"``: only white-list ops in ``dtype``; every other op in float32.
    * ``"O1"``: the native ``torch.autocast`` lists and semantics of the device; without
      custom lists it *is* ``torch.autocast`` (same speed, no Python on the op path).
    * ``"O2"``: every op in ``dtype`` except the black list (``ampcore.decorate`` casts the
      parameters).

    Custom lists change the lists of this region only (this thread, until exit, also after
    an exception) and reach every call of the op, also inside composite modules and
    functions (``nn.MultiheadAttention``, ``F.scaled_dot_product_attention``...).  Names are
    ATen op names (``"add"``, ``"linear"``, ``"softmax"``) or Paddle aliases
    (``"elementwise_add"``); see docs/op-lists.md.  A nested region merges its custom lists
    on top of the enclosing region's (its own lists win); its device, dtype and level are
    its own arguments.

    Args:
        device: ``"cuda"``, ``"cuda:1"``, a ``torch.device`` or ``None`` for the best
            available backend.
        dtype: the low-precision dtype; ``None`` takes the backend's default.
        level: the AMP level.
        enabled: ``False`` turns autocast off for this device type in the region (also
            inside an enclosing enabled region), as ``torch.autocast(enabled=False)``.
        cache_enabled: whether casts of leaf tensors (weights) are cached in the region;
            ``None`` keeps torch's current setting.
        custom_white_list: ops to run in ``dtype`` (they leave the black list).
        custom_black_list: ops to run in float32 (they leave the white list).

    Raises:
        AmpcoreError: unknown backend (the message lists known backends and their
            availability), unavailable backend (with the adapter's reason), dtype the
            backend does not support, invalid level, unknown op names (with the closest
            valid names), an op in both custom lists, a capability error of the device, or
            torch refusing to enable autocast.

    Example::

        >>> import torch, ampcore
        >>> x = torch.randn(8, 8)
        >>> with ampcore.autocast(device="cpu"):
        ...     torch.mm(x, x).dtype
        torch.bfloat16
        >>> with ampcore.autocast(device="cpu", custom_white_list={"elementwise_add"}):
        ...     (x + x).dtype
        torch.bfloat16
        >>> with ampcore.autocast(device="cpu", custom_black_list={"mm"}):
        ...     torch.mm(x, x).dtype
        torch.float32
        >>> @ampcore.autocast(device="cpu", enabled=False)
        ... def fp32_part(t):
        ...     return torch.mm(t, t)
        >>> with ampcore.autocast(device="cpu"):
        ...     fp32_part(x).dtype
        torch.float32
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            # Inside a function dynamo traces: a region with torch's own lists *is* a
            # torch.autocast, which dynamo compiles without a graph break.
            native = _native_region(args, kwargs)
            if native is not None:
                return torch.autocast(native[0], dtype=native[1], enabled=native[2], cache_enabled=native[3])
        return _new_object(cls)

    @opaque
    def __init__(
        self,
        device: DeviceLike = None,
        dtype: torch.dtype | None = None,
        level: str = "O1",
        enabled: bool = True,
        cache_enabled: bool | None = None,
        custom_white_list: Iterable[str] | None = None,
        custom_black_list: Iterable[str] | None = None,
    ) -> None:
        checked_level = check_level(level)
        if not isinstance(enabled, bool):
            raise AmpcoreError(f"{_CALL}(enabled={enabled!r}): expected True or False")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise AmpcoreError(f"{_CALL}(dtype={dtype!r}): expected a torch.dtype such as torch.bfloat16")
        white = black = _EMPTY
        if custom_white_list is not None or custom_black_list is not None:
            white = canonical_ops(custom_white_list, _CALL, "custom_white_list")
            black = canonical_ops(custom_black_list, _CALL, "custom_black_list")
            check_custom(white, black, _CALL)
        resolved = resolve_device(device)
        backend = resolved.backend
        self.backend = backend
        self.device_index = resolved.index
        self.device_type = backend.device_type
        self.dtype = backend.check_dtype(dtype)
        self.level = checked_level
        self.enabled = enabled and checked_level != "O0"
        self.cache_enabled = cache_enabled
        self.custom_white_list = white
        self.custom_black_list = black
        if self.enabled:
            backend.enforce_capability(self.dtype, self.device_index or 0, stacklevel=2)
        self._policy = self._policy_of(white, black)
        self._frame = AutocastFrame(backend, self.dtype, checked_level, self.enabled, white, black, self._policy)
        self._local = threading.local()

    def _policy_of(self, white: frozenset[str], black: frozenset[str]) -> Policy | None:
        """The op policy of this region with custom lists ``white``/``black`` (None: torch's)."""
        if not self.enabled:
            return None
        if self.level == "O1" and not white and not black and not self.backend.op_list_adjustments(self.dtype):
            return None  # exactly torch.autocast: nothing to register, nothing on the op path
        return policy_for(compute_oplists(self.backend, self.dtype, self.level, white, black))

    def __repr__(self) -> str:
        custom = ""
        if self.custom_white_list:
            custom += f", custom_white_list={set(sorted(self.custom_white_list))}"
        if self.custom_black_list:
            custom += f", custom_black_list={set(sorted(self.custom_black_list))}"
        return (
            f"ampcore.autocast(device={self.backend.name!r}, dtype=torch.{dtype_name(self.dtype)}, "
            f"level={self.level!r}, enabled={self.enabled}{custom})"
        )

    @opaque
    def __enter__(self) -> autocast:
        state = _thread
        device_type = self.device_type
        frame = self._frame
        outer = current_frame(device_type) if state.stack else None
        if outer is not None and (outer.custom_white or outer.custom_black):
            white, black = merge_custom((outer.custom_white, outer.custom_black), frame.custom_white, frame.custom_black)
            frame = AutocastFrame(
                self.backend, self.dtype, self.level, self.enabled, white, black, self._policy_of(white, black)
            )
        policy = frame.policy
        inner = torch.autocast(device_type, dtype=self.dtype, enabled=self.enabled, cache_enabled=self.cache_enabled)
        inner.__enter__()
        if self.enabled and not (
            torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == self.dtype
        ):
            inner.__exit__(None, None, None)
            raise AmpcoreError(
                f"{self!r}: torch did not enable autocast for device type {device_type!r} with "
                f"{self.dtype}; refusing to run in float32 silently. Check the {self.backend.name!r} "
                f"adapter ({self.backend.distribution}) and `ampcore info`."
            )
        mode = None
        if policy is not None:
            try:
                acquire(policy)
            except BaseException:
                inner.__exit__(None, None, None)
                raise
            if "torch._dynamo" in sys.modules:  # torch.compile in use: keep graphs per policy
                mode = guard_mode(policy)
                mode.__enter__()
        previous = state.policies.get(device_type)
        if policy is not None or previous is not None:
            state.policies[device_type] = policy
        try:
            stack = self._local.stack
        except AttributeError:
            stack = self._local.stack = []
        stack.append((inner, policy, previous, mode))
        state.stack.append(frame)
        return self

    @opaque
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        state = _thread
        pop_frame()
        inner, policy, previous, mode = self._local.stack.pop()
        if policy is not None or previous is not None:
            if previous is None:
                state.policies.pop(self.device_type, None)
            else:
                state.policies[self.device_type] = previous
        try:
            if mode is not None:
                mode.__exit__(None, None, None)
            inner.__exit__(exc_type, exc, traceback)
        finally:
            if policy is not None:
                release(policy)

    def __call__(self, func: F) -> F:
        """Use the region as a decorator: the function runs inside it on every call."""

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


@constant_result
def _native_region(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, torch.dtype, bool, bool | None] | None:
    """``(device type, dtype, enabled, cache_enabled)`` of a region with torch's lists, else None.

    Run eagerly (dynamo folds the result into a constant), so arguments are validated and
    errors raised exactly as outside torch.compile.
    """
    region = object.__new__(autocast)
    region.__init__(*args, **kwargs)  # type: ignore[misc]
    if region._policy is not None:
        return None
    return region.device_type, region.dtype, region.enabled, region.cache_enabled
