"""``ampcore.autocast``: torch.autocast driven by a backend adapter, an AMP level and op lists."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Final, TypeVar

import torch

from .._backends.backend import dtype_name
from .._backends.registry import DeviceLike, resolve_device
from .._backends.registry import _holder as _registry_holder
from .._backends.support import resolve_dtype
from .._dtypes import parse_dtype
from .compile import compile_in_use, constant_result, foreign_mode, guard_mode, opaque
from .entry import Plans, abandon, enter, not_innermost, other_context
from .level_hooks import level_hooks
from .levels import check_level
from .lists import compute_oplists
from .registration import OpPolicy, has_native_autocast, policy_for
from .signature import (
    DEFAULTS,
    MADE,
    bind_arguments,
    check_switches,
    check_use_promote,
    construction_key,
    custom_lists,
    remember,
)
from .thread_state import ActiveRegion, RegionSpec, thread_state
from .torch_state import CompiledRegion, DirectAutocast
from .torch_state import restore as _restore
from .torch_state import switch_on as _switch_on

__all__ = ["auto_cast", "autocast"]

F = TypeVar("F", bound=Callable[..., Any])

_CALL = "ampcore.autocast"
_is_compiling = torch.compiler.is_compiling
#: ``is_compiling()`` without ``torch.jit.is_scripting`` (per region made): dynamo's own check, then the flag
_dynamo_compiling = torch.compiler.is_dynamo_compiling
_FLAG_OF: Final[Any] = torch.compiler if isinstance(getattr(torch.compiler, "_is_compiling_flag", None), bool) else None
_thread = thread_state()
_new_object = object.__new__
_new_tuple = tuple.__new__
_function_mode = torch._C._is_torch_function_mode_enabled


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
        dtype: the low-precision dtype (a ``torch.dtype`` or a name: ``"bfloat16"``,
            ``"bf16"``, ``"float16"``, ``"half"``...); ``None`` takes the backend's default.
        level: the AMP level.
        enabled: ``False`` turns autocast off for this device type in the region (also
            inside an enclosing enabled region), as ``torch.autocast(enabled=False)``.
        cache_enabled: whether casts of leaf tensors (weights) are cached in the region;
            ``None`` keeps torch's current setting.
        custom_white_list: ops to run in ``dtype`` (they leave the black list).
        custom_black_list: ops to run in float32 (they leave the white list).

    Positional arguments are read in ampcore's order (as above), torch's
    (``autocast("cpu", torch.bfloat16, True)``: a bool third is ``enabled``, then
    ``cache_enabled``) or Paddle's (``autocast(True, {"elementwise_add"})``: a bool first is
    ``enable``, then ``custom_white_list``, ``custom_black_list``, ``level``, ``dtype``,
    ``use_promote``); anything else raises.  Keyword aliases: torch's ``device_type``, Paddle's
    ``enable`` and ``use_promote`` (ampcore's O2 does not promote: ``True`` at O2 warns).
    ``ampcore.auto_cast`` is Paddle's name for this class.

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
        if _dynamo_compiling() or (_is_compiling() if _FLAG_OF is None else _FLAG_OF._is_compiling_flag):
            # Inside a function dynamo traces: a region with torch's own lists *is* a
            # torch.autocast, which dynamo compiles without a graph break.
            native = _native_region(args, kwargs)
            if native is not None:
                return torch.autocast(native[0], dtype=native[1], enabled=native[2], cache_enabled=native[3])
        return _new_object(cls)

    @opaque
    def __init__(
        self,
        *args: Any,
        device: DeviceLike = None,
        dtype: torch.dtype | str | None = None,
        level: str = "O1",
        enabled: bool = True,
        cache_enabled: bool | None = None,
        custom_white_list: Iterable[str] | None = None,
        custom_black_list: Iterable[str] | None = None,
        **aliases: Any,
    ) -> None:
        key, manager = None, _registry_holder.manager  # (loaded_generation() inline: made per step)
        generation = manager.generation if manager is not None and manager._loaded else None
        if generation is not None:
            key = construction_key(  # with the call's form where positional (torch's order) or aliased
                device,
                dtype,
                level,
                enabled,
                cache_enabled,
                custom_white_list,
                custom_black_list,
                generation,
                args,
                aliases,
            )
            made = MADE.get(key) if key is not None else None
            if made is not None:  # validated before: the same attributes, without the checks
                if (check := made["_level_check"]) is not None:
                    check()  # a level's settings (AMPCORE_AUTO_BUDGET) may have changed since
                self.__dict__.update(made)
                return
        if args or aliases:  # positional (three orders) or aliased: bound to ampcore's names
            keywords = {
                "device": device,
                "dtype": dtype,
                "level": level,
                "enabled": enabled,
                "cache_enabled": cache_enabled,
                "custom_white_list": custom_white_list,
                "custom_black_list": custom_black_list,
            }
            values = bind_arguments(args, {**aliases, **keywords}, DEFAULTS)
            check_use_promote(values.pop("use_promote"), check_level(values["level"]))
            self._construct(key, **values)
        else:
            self._construct(key, device, dtype, level, enabled, cache_enabled, custom_white_list, custom_black_list)

    def _construct(
        self,
        key: tuple[Any, ...] | None,
        device: DeviceLike,
        dtype: torch.dtype | str | None,
        level: str,
        enabled: bool,
        cache_enabled: bool | None,
        custom_white_list: Iterable[str] | None,
        custom_black_list: Iterable[str] | None,
    ) -> None:
        """Validate the arguments, set the region's attributes, remember them under ``key``."""
        checked_level = check_level(level)
        hooks = level_hooks(checked_level)  # level="auto": its module hooks (ampcore._auto)
        if hooks is not None:  # AMPCORE_AUTO_BUDGET checked here, before anything changes
            hooks.check()
        self._level_check = None if hooks is None else hooks.check  # again when made from the memo
        self._level_hooks = hooks if enabled else None
        check_switches(enabled, cache_enabled)
        if dtype is not None:
            dtype = parse_dtype(dtype, _CALL)
        white, black = custom_lists(custom_white_list, custom_black_list)
        resolved = resolve_device(device)
        backend = resolved.backend
        self.backend = backend
        self.device_index = resolved.index
        self.device_type = backend.device_type
        self.dtype = resolve_dtype(backend, dtype, resolved.index, _CALL) if enabled else backend.check_dtype(dtype)
        self.level = checked_level
        self.enabled = enabled and checked_level != "O0"
        self.cache_enabled = cache_enabled
        self.custom_white_list = white
        self.custom_black_list = black
        if self.enabled:
            backend.enforce_capability(self.dtype, self.device_index or 0)
        policy = self._policy_of(white, black)
        self._spec = RegionSpec(backend, self.dtype, checked_level, self.enabled, white, black, policy)
        self._plans = Plans()  # how it enters once it entered (entry.py); shared by the same arguments
        if key is not None:
            remember(key, self.__dict__)

    def _policy_of(self, white: frozenset[str], black: frozenset[str]) -> OpPolicy | None:
        """The op policy of this region with custom lists ``white``/``black`` (None: torch's)."""
        if not self.enabled:
            return None
        if (
            self.level in ("O1", "auto")  # auto: O1's lists; its plan acts through module hooks
            and not white
            and not black
            and not self.backend.op_list_adjustments(self.dtype)
            and has_native_autocast(self.device_type)
        ):
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

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Copy and pickle by constructor arguments (the backend by name), as torch.autocast."""
        device = self.backend.name if self.device_index is None else f"{self.backend.name}:{self.device_index}"
        white = sorted(self.custom_white_list) or None
        black = sorted(self.custom_black_list) or None
        enabled = self.enabled or self.level == "O0"  # O0 turns autocast off by itself
        return (autocast, (device, self.dtype, self.level, enabled, self.cache_enabled, white, black))

    @opaque
    def __enter__(self) -> autocast:
        # The short way (issue 26 item 3): an earlier entry's plan (entry.py) inline, else entry.enter.
        state = _thread
        stack = state.stack
        context_outer = _innermost.get()
        plans = self._plans
        plan = plans.alone
        device_type = self.device_type
        if stack:
            top = stack[-1]
            if context_outer is not top:
                raise other_context(self, entering=True)
            outer = top.spec
            if outer.backend.device_type != device_type:
                plan = None  # the enclosing region of this device type is further out
            elif outer.custom_white or outer.custom_black:
                plan = plans.nested.get((outer.custom_white, outer.custom_black))
        if plan is None or (_function_mode() and foreign_mode()):  # torch.export traces torch.autocast's entry
            return enter(self, state, _innermost)
        spec = plan.spec
        policy = spec.policy
        policies = state.policies
        previous = policies.get(device_type)
        call = plan.enter
        if call is not None:
            if plan.slotless and previous is not None:  # a policy in force: its table to switch off
                return enter(self, state, _innermost)
            torch_region: Any = _new_tuple(CompiledRegion, (plan.leave, plan.entry, call(plan.entry)))
        else:  # DirectAutocast(...)'s steps inline (a Python call less per region)
            torch_region = _new_object(DirectAutocast)
            torch_region.device_type, torch_region.previous_cache = device_type, torch.is_autocast_cache_enabled()
            torch_region.previous = torch.is_autocast_enabled(device_type)
            torch_region.previous_dtype = torch.get_autocast_dtype(device_type)
            torch.set_autocast_enabled(device_type, self.enabled)
            torch.set_autocast_dtype(device_type, self.dtype)
            torch.autocast_increment_nesting()
            if self.cache_enabled is not None:  # None: torch.autocast sets it to what it was
                torch.set_autocast_cache_enabled(self.cache_enabled)
        mode = shadow = None
        try:
            if plan.shadow is not None:
                shadow = _switch_on(plan.shadow)
            if policy is not None and compile_in_use():
                mode = guard_mode(policy)  # graphs per policy
                mode.__enter__()
            if call is not None:
                policies[device_type] = policy  # the compiled kernels' table is set already
            elif policy is not None or previous is not None:
                state.set_policy(device_type, policy)
            region = _new_tuple(ActiveRegion, (self, spec, torch_region, previous, mode, shadow, context_outer))
            stack.append(region)
            _innermost.set(region)
            if self._level_hooks is not None:  # level auto: its plan's module hooks, while it is active
                self._level_hooks.region_entered()
        except BaseException:
            abandon(state, _innermost, device_type, policy, previous, mode, shadow, torch_region)
            raise
        return self

    @opaque
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        state = _thread
        stack = state.stack
        if not stack or stack[-1].owner is not self:
            raise not_innermost(self)
        region = stack[-1]
        if _innermost.get() is not region:
            raise other_context(self, entering=False)
        stack.pop()
        _innermost.set(region.context_outer)
        torch_region = region.torch_region
        try:
            if self._level_hooks is not None:
                self._level_hooks.region_exited()
            if not stack and state.cast_cache:
                state.cast_cache.clear()
        finally:
            kind = type(torch_region)
            previous = region.previous_policy
            mode = region.guard_mode
            if kind is CompiledRegion and mode is None:  # the usual cases inline (restore's steps)
                if previous is None:
                    state.policies.pop(self.device_type, None)
                else:
                    state.policies[self.device_type] = previous
                torch_region[0](torch_region[1], torch_region[2])
            elif kind is DirectAutocast and mode is None and region.shadow is None:
                if previous is not None or region.spec.policy is not None:
                    state.set_policy(self.device_type, previous, keep_none=False)
                if torch.autocast_decrement_nesting() == 0:  # DirectAutocast.__exit__'s steps inline
                    torch.clear_autocast_cache()
                torch.set_autocast_enabled(self.device_type, torch_region.previous)
                torch.set_autocast_dtype(self.device_type, torch_region.previous_dtype)
                torch.set_autocast_cache_enabled(torch_region.previous_cache)
            else:
                _restore(
                    state,
                    self.device_type,
                    region.spec.policy,
                    previous,
                    mode,
                    region.shadow,
                    torch_region,
                    (exc_type, exc, traceback),
                )

    def __call__(self, func: F) -> F:
        """Use the region as a decorator: the function runs inside it on every call."""

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


#: The innermost region entered in this context (asyncio task): none runs another task's ops on its thread.
_innermost: contextvars.ContextVar[ActiveRegion | None] = contextvars.ContextVar("ampcore_region", default=None)


@constant_result
def _native_region(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, torch.dtype, bool, bool | None] | None:
    """``(device type, dtype, enabled, cache_enabled)`` of a region with torch's lists, else None.

    Run eagerly (dynamo folds the result into a constant), so arguments are validated and
    errors raised exactly as outside torch.compile.
    """
    region = object.__new__(autocast)
    region.__init__(*args, **kwargs)  # type: ignore[misc]
    if region._spec.policy is not None:
        return None
    return region.device_type, region.dtype, region.enabled, region.cache_enabled


#: Paddle's name (``paddle.amp.auto_cast``): the same class; Paddle's positional order works.
auto_cast = autocast
