"""``ampcore.custom_fwd`` / ``ampcore.custom_bwd``: torch.amp's decorators for custom
autograd functions, with the device taken from the active ampcore region.

torch's versions need ``device_type=`` written into the code; these find it: the innermost
active ``ampcore.autocast`` region (any device type), else the best available backend, or
``device=`` when given.  ``custom_bwd`` also re-enters the forward's ampcore region in the
backward pass, custom lists and level included (torch's re-enters a plain autocast with the
forward's dtype): the backward usually runs outside the region, or in another thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar, overload

import torch
from torch.amp.autocast_mode import _cast

from .._backends.registry import DeviceLike, _parse, resolve_device
from .._dtypes import parse_dtype
from .._errors import AmpcoreError, closest
from .thread_state import RegionSpec, current_region

__all__ = ["custom_bwd", "custom_fwd"]

F = TypeVar("F", bound=Callable[..., Any])


def _check_device(device: object, call: str) -> None:
    """Check the form of ``device`` when decorating (it is resolved at call time, when the
    plugins it names are loaded)."""
    if device is None:
        return
    try:
        name, _ = _parse(device)  # type: ignore[arg-type]
    except AmpcoreError as exc:
        raise AmpcoreError(f"{call}(device={device!r}): {str(exc).split(': ', 1)[-1]}") from None
    if not name:
        raise AmpcoreError(f"{call}(device={device!r}): expected a backend name such as 'cuda' or 'cpu', or None")


def _device_alias(call: str, device: DeviceLike, aliases: dict[str, Any], valid: tuple[str, ...]) -> DeviceLike:
    """``device`` or torch's ``device_type`` (given once); AmpcoreError for any other keyword."""
    for name, value in aliases.items():
        if name != "device_type":
            hints = closest(name, [*valid, "device_type"])
            raise AmpcoreError(
                f"{call}({name}=...): unknown keyword argument"
                + (f"; did you mean {', '.join(repr(h) for h in hints)}?" if hints else "")
                + f" Valid: {', '.join(valid)} (and torch's device_type, an alias of device)"
            )
        if device is not None:
            raise AmpcoreError(
                f"{call}(device=..., device_type=...): give the device once (device_type is torch's name)"
            )
        device = value
    return device


def _check_function(function: object, call: str, param: str) -> None:
    if not callable(function):
        raise AmpcoreError(
            f"{call}({param}={function!r}): expected the {'forward' if param == 'fwd' else 'backward'} of a "
            "torch.autograd.Function (use it as a decorator)"
        )


def _device_type(device: DeviceLike) -> tuple[str, RegionSpec | None]:
    """The device type to use and the ampcore region of that type active now (if any)."""
    if device is not None:
        device_type = resolve_device(device).backend.device_type
        return device_type, current_region(device_type)
    frame = current_region()
    if frame is not None:
        return frame.backend.device_type, frame
    return resolve_device(None).backend.device_type, None


def _region(frame: RegionSpec) -> AbstractContextManager[Any]:
    from .autocast import autocast

    return autocast(
        device=frame.backend.name,
        dtype=frame.dtype,
        level=frame.level,
        enabled=frame.enabled,
        custom_white_list=frame.custom_white,
        custom_black_list=frame.custom_black,
    )


@overload
def custom_fwd(
    fwd: F, *, device: DeviceLike = None, cast_inputs: torch.dtype | str | None = None, device_type: DeviceLike = None
) -> F: ...


@overload
def custom_fwd(
    fwd: None = None,
    *,
    device: DeviceLike = None,
    cast_inputs: torch.dtype | str | None = None,
    device_type: DeviceLike = None,
) -> Callable[[F], F]: ...


def custom_fwd(
    fwd: F | None = None, *, device: DeviceLike = None, cast_inputs: torch.dtype | str | None = None, **aliases: Any
) -> F | Callable[[F], F]:
    """Decorate the ``forward`` of a custom ``torch.autograd.Function`` (as
    ``torch.amp.custom_fwd``, with the device found by ampcore).

    Args:
        fwd: the forward (the decorator works with and without parentheses).
        device: the backend; ``None`` takes the innermost active ampcore region's, else the
            best available backend.  torch's name ``device_type`` is accepted for it.
        cast_inputs: a floating dtype (``torch.float32`` or a name such as ``"float32"``,
            ``"fp32"``, ``"bf16"``): if autocast is on, the floating tensors of the device
            type are cast to it and the forward runs with autocast off; if ``None``, the
            forward runs under the current autocast state and lists.

    Raises:
        AmpcoreError: when decorating: ``cast_inputs`` that is no floating dtype (e.g.
            ``torch.int8``), a malformed ``device``, a ``fwd`` that is not callable.

    Example::

        >>> import torch, ampcore
        >>> class Square(torch.autograd.Function):
        ...     @staticmethod
        ...     @ampcore.custom_fwd(cast_inputs=torch.float32)
        ...     def forward(ctx, x):
        ...         ctx.save_for_backward(x)
        ...         return torch.mm(x, x)
        ...     @staticmethod
        ...     @ampcore.custom_bwd
        ...     def backward(ctx, grad):
        ...         (x,) = ctx.saved_tensors
        ...         return torch.mm(grad, x.t()) + torch.mm(x.t(), grad)
        >>> with ampcore.autocast(device="cpu"):
        ...     Square.apply(torch.randn(4, 4)).dtype
        torch.float32
    """
    call = "ampcore.custom_fwd"
    device = _device_alias(call, device, aliases, ("device", "cast_inputs"))
    _check_device(device, call)
    if cast_inputs is not None:
        cast_inputs = parse_dtype(cast_inputs, call, "cast_inputs")
    if fwd is None:
        return functools.partial(custom_fwd, device=device, cast_inputs=cast_inputs)
    _check_function(fwd, call, "fwd")
    return _decorated_fwd(fwd, device, cast_inputs)


def _decorated_fwd(fwd: F, device: DeviceLike, cast_inputs: torch.dtype | None) -> F:
    """``fwd`` run as :func:`custom_fwd` says, remembering on ``ctx`` what backward needs."""

    @functools.wraps(fwd)
    def decorate_fwd(*args: Any, **kwargs: Any) -> Any:
        ctx = args[0]
        device_type, frame = _device_type(device)
        enabled = torch.is_autocast_enabled(device_type)
        ctx._dtype = torch.get_autocast_dtype(device_type)
        ctx._ampcore_device_type = device_type
        ctx._ampcore_frame = frame if enabled and cast_inputs is None else None
        if cast_inputs is None:
            ctx._fwd_used_autocast = enabled
            return fwd(*args, **kwargs)
        ctx._fwd_used_autocast = False
        if not enabled:
            return fwd(*args, **kwargs)
        with torch.autocast(device_type, enabled=False):
            return fwd(*_cast(args, device_type, cast_inputs), **_cast(kwargs, device_type, cast_inputs))

    return decorate_fwd  # type: ignore[return-value]


@overload
def custom_bwd(bwd: F, *, device: DeviceLike = None, device_type: DeviceLike = None) -> F: ...


@overload
def custom_bwd(bwd: None = None, *, device: DeviceLike = None, device_type: DeviceLike = None) -> Callable[[F], F]: ...


def custom_bwd(bwd: F | None = None, *, device: DeviceLike = None, **aliases: Any) -> F | Callable[[F], F]:
    """Decorate the ``backward`` of a custom ``torch.autograd.Function`` whose forward is
    decorated with :func:`custom_fwd`: the backward runs under the forward's autocast state.

    If the forward ran in an ``ampcore.autocast`` region, the backward runs in an equal
    region (backend, dtype, level and custom lists); otherwise it runs under
    ``torch.autocast`` with the forward's state, as ``torch.amp.custom_bwd`` does.

    Args:
        bwd: the backward (the decorator works with and without parentheses).
        device: only used when the forward was not decorated with :func:`custom_fwd`
            (torch's name ``device_type`` is accepted for it).

    Example::

        >>> import torch, ampcore
        >>> class Double(torch.autograd.Function):
        ...     @staticmethod
        ...     @ampcore.custom_fwd
        ...     def forward(ctx, x):
        ...         return x * 2
        ...     @staticmethod
        ...     @ampcore.custom_bwd
        ...     def backward(ctx, grad):
        ...         return grad * 2
        >>> x = torch.ones(2, requires_grad=True)
        >>> with ampcore.autocast(device="cpu"):
        ...     y = Double.apply(x)
        >>> y.sum().backward(); x.grad
        tensor([2., 2.])
    """
    device = _device_alias("ampcore.custom_bwd", device, aliases, ("device",))
    _check_device(device, "ampcore.custom_bwd")
    if bwd is None:
        return functools.partial(custom_bwd, device=device)
    _check_function(bwd, "ampcore.custom_bwd", "bwd")

    @functools.wraps(bwd)
    def decorate_bwd(*args: Any, **kwargs: Any) -> Any:
        ctx = args[0]
        frame: RegionSpec | None = getattr(ctx, "_ampcore_frame", None)
        if frame is not None:
            with _region(frame):
                return bwd(*args, **kwargs)
        device_type = getattr(ctx, "_ampcore_device_type", None) or _device_type(device)[0]
        used = getattr(ctx, "_fwd_used_autocast", False)
        dtype = getattr(ctx, "_dtype", None)
        with torch.autocast(device_type, enabled=used, dtype=dtype):
            return bwd(*args, **kwargs)

    return decorate_bwd
