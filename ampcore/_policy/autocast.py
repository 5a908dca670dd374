"""``ampcore.autocast``: torch.autocast driven by a backend adapter, an AMP level and op lists."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Final, TypeVar

import torch

from .._backends.backend import Backend, dtype_name
from .._backends.registry import DeviceLike, loaded_generation, on_backend_available, resolve_device
from .._backends.support import resolve_dtype
from .._dtypes import parse_dtype
from .._errors import AmpcoreError, shown
from .._op_names import canonical_ops
from .compile import compile_in_use, constant_result, guard_mode, opaque
from .level_hooks import level_hooks
from .levels import check_level
from .lists import check_custom, compute_oplists, merge_custom
from .recompute import install as install_recompute
from .registration import OpPolicy, has_native_autocast, policy_for, route
from .signature import MADE, bind_arguments, check_use_promote, construction_key, remember
from .thread_state import ActiveRegion, RegionSpec, current_region, thread_state
from .torch_state import CompiledRegion, accepted, enter_region_state
from .torch_state import restore as _restore
from .torch_state import switch_on as _switch_on

__all__ = ["auto_cast", "autocast"]

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
        key = None
        generation = loaded_generation()
        if generation is not None and not args and not aliases and level != "auto":  # auto: budget per region
            arguments = (device, dtype, level, enabled, cache_enabled)
            key = construction_key(arguments, (custom_white_list, custom_black_list), generation)
            made = MADE.get(key) if key is not None else None
            if made is not None:  # validated before: the same attributes, without the checks
                self.__dict__.update(made)
                return
        if args or aliases:
            given = {
                **aliases,
                "device": device,
                "dtype": dtype,
                "level": level,
                "enabled": enabled,
                "cache_enabled": cache_enabled,
                "custom_white_list": custom_white_list,
                "custom_black_list": custom_black_list,
            }
            values = bind_arguments(args, given, _DEFAULTS)
            device, dtype, level, enabled = values["device"], values["dtype"], values["level"], values["enabled"]
            cache_enabled = values["cache_enabled"]
            custom_white_list, custom_black_list = values["custom_white_list"], values["custom_black_list"]
            check_use_promote(values["use_promote"], check_level(level))
        checked_level = check_level(level)
        hooks = level_hooks(checked_level)  # level="auto": its module hooks (ampcore._auto)
        if hooks is not None:  # AMPCORE_AUTO_BUDGET checked here, before anything changes
            hooks.check()
        self._level_hooks = hooks if enabled else None
        if not isinstance(enabled, bool):
            raise AmpcoreError(f"{_CALL}(enabled={shown(enabled)}): expected True or False")
        if cache_enabled is not None and not isinstance(cache_enabled, bool):
            raise AmpcoreError(f"{_CALL}(cache_enabled={shown(cache_enabled)}): expected True, False or None")
        if dtype is not None:
            dtype = parse_dtype(dtype, _CALL)
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
        state = _thread
        stack = state.stack
        if stack and _innermost.get() is not stack[-1]:
            raise AmpcoreError(
                f"{self!r}: another ampcore.autocast region of this thread is active in a different "
                "asyncio task or context. Regions are thread-local, like torch.autocast's flags: "
                "enter them inside one task (or use one thread per concurrent region)."
            )
        device_type = self.device_type
        spec = self._spec
        outer = current_region(device_type) if stack else None
        if outer is not None and (outer.custom_white or outer.custom_black):
            white, black = merge_custom((outer.custom_white, outer.custom_black), spec.custom_white, spec.custom_black)
            spec = spec._replace(custom_white=white, custom_black=black, policy=self._policy_of(white, black))
        policy = spec.policy
        found = None
        if policy is not None:
            found = route(device_type, _provider(self.backend), policy)
        if self.enabled:
            install_recompute()  # activation checkpointing keeps the policy and casts (once per process)
        # Every change below is undone if a later step fails or is interrupted.
        previous = state.policies.get(device_type)
        torch_region = enter_region_state(device_type, self.dtype, self.enabled, self.cache_enabled, policy, found)
        in_one_call = type(torch_region) is CompiledRegion  # the key and the C++ table set too
        mode = shadow = None
        try:
            if (
                self.enabled
                and not in_one_call
                and not (torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == self.dtype)
            ):
                raise AmpcoreError(
                    f"{self!r}: torch did not enable autocast for device type {device_type!r} with "
                    f"{self.dtype}; refusing to run in float32 silently. Check the {self.backend.name!r} "
                    f"adapter ({self.backend.distribution}) and `ampcore info`."
                )
            if type(torch_region) is torch.autocast:
                accepted(device_type, self.dtype, self.enabled)  # later entries set its flags directly
            if found is not None and not found.resident and not in_one_call:
                shadow = _switch_on(found.key)
            if policy is not None and compile_in_use():
                mode = guard_mode(policy)  # graphs per policy
                mode.__enter__()
            if in_one_call:
                state.policies[device_type] = policy  # the compiled kernels' table is set already
            elif policy is not None or previous is not None:
                state.set_policy(device_type, policy)
            region = ActiveRegion(self, spec, torch_region, previous, mode, shadow, _innermost.get())
            stack.append(region)
            _innermost.set(region)
            if self._level_hooks is not None:  # level auto: its plan's module hooks, while it is active
                self._level_hooks.region_entered()
        except BaseException:
            if stack and stack[-1].torch_region is torch_region:
                _innermost.set(stack.pop().context_outer)
            _restore(state, device_type, previous, mode, shadow, torch_region, None)
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
            raise AmpcoreError(
                f"{self!r}.__exit__: this region is not the innermost active region of this thread "
                "(exited twice, exited in another thread or asyncio task, or an inner region was "
                "never exited); nothing was changed"
            )
        region = stack[-1]
        if _innermost.get() is not region:
            raise AmpcoreError(
                f"{self!r}.__exit__: the region was entered in another asyncio task or context; "
                "exit it where it was entered"
            )
        stack.pop()
        _innermost.set(region.context_outer)
        if self._level_hooks is not None:
            self._level_hooks.region_exited()
        if not stack and state.cast_cache:
            state.cast_cache.clear()
        _restore(
            state,
            self.device_type,
            region.previous_policy,
            region.guard_mode,
            region.shadow,
            region.torch_region,
            (exc_type, exc, traceback),
        )

    def __call__(self, func: F) -> F:
        """Use the region as a decorator: the function runs inside it on every call."""

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


#: The keyword parameters of ``autocast.__init__`` and their defaults (signature.py binds calls).
_DEFAULTS: Final = {
    "device": None,
    "dtype": None,
    "level": "O1",
    "enabled": True,
    "cache_enabled": None,
    "custom_white_list": None,
    "custom_black_list": None,
}


#: The innermost region entered in the current context (asyncio task): a region entered in
#: one task must not run ops of another task that shares its thread.
_innermost: contextvars.ContextVar[ActiveRegion | None] = contextvars.ContextVar("ampcore_region", default=None)


@functools.cache
def _provider(backend: Backend) -> Callable[[torch.dtype], OpPolicy | None]:
    """The policies of ``backend``'s O1 lists per dtype, for kernels that provide autocast."""
    by_dtype: dict[torch.dtype, OpPolicy | None] = {}

    def provide(dtype: torch.dtype) -> OpPolicy | None:
        try:
            return by_dtype[dtype]
        except KeyError:
            pass
        try:
            policy = policy_for(compute_oplists(backend, dtype, "O1", _EMPTY, _EMPTY), cache=False)
        except AmpcoreError:
            policy = None  # a dtype the backend has no lists for: the op runs as called
        by_dtype[dtype] = policy
        return policy

    return provide


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


def _provide_autocast(backend: Backend) -> None:
    """Once ampcore knows an available backend whose device type has no autocast kernels
    of its own, ampcore's kernels provide its autocast from then on (for plain
    ``torch.autocast`` too), so results never depend on whether an ampcore region ran."""
    if not has_native_autocast(backend.device_type):
        route(backend.device_type, _provider(backend))


on_backend_available(_provide_autocast)
