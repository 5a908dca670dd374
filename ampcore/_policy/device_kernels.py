"""What a device type's own autocast key holds, read before ampcore's kernels go there.

Helpers of :mod:`ampcore._policy.registration`: torch's own actions on a device's autocast
key (which a policy may hand calls to), the castable overloads with a kernel there (which
ampcore's kernels must not pass by), a vendor's lists cut to the ops it has kernels for
(resident routes), the backend key of a device type, and silencing torch's override
warning where a resident table replaces a vendor's kernels on purpose.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import torch

from .._errors import AmpcoreError
from .._op_names import castable_overloads
from .key_tables import dispatch_key
from .lists import DEFAULT_ACTIONS, native_action
from .torch_tables import TORCH_KERNEL_DEVICE_TYPES, native_table

if TYPE_CHECKING:
    from .registration import OpPolicy

__all__ = ["backend_key", "kernels_on", "quiet", "torch_actions", "vendor_only"]

#: The warning torch gives (once per process) when a kernel overrides another.
_OVERRIDE_WARNING: Final = r"Warning only once for all operators"


def torch_actions(device_type: str, key: str) -> dict[str, str]:
    """overload -> the O1 action of torch's own autocast kernel on ``key``, for the device
    types whose kernels torch registers itself (:data:`TORCH_KERNEL_DEVICE_TYPES`; a vendor's
    kernels on its key may follow other lists)."""
    if device_type not in TORCH_KERNEL_DEVICE_TYPES:
        return {}
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    return {
        overload: native_action(policy)
        for overload, policy in native_table(device_type).items()
        if has_kernel(f"aten::{overload}", key)
    }


def kernels_on(key: str) -> frozenset[str]:
    """The castable overloads that have a kernel on ``key`` (the vendor's, before ampcore's)."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    return frozenset(o for o in castable_overloads() if has_kernel(f"aten::{o}", key))


def vendor_only(provider: Callable[[torch.dtype], Any], vendor: frozenset[str]) -> Callable[[torch.dtype], Any]:
    """``provider``'s policies cut to what a vendor's own autocast registrations did: the
    lists' action for the overloads in ``vendor`` (those it has kernels for), no cast for the
    others (its fallthrough; a composite still decomposes with autocast on, so its inner ops
    reach the vendor's kernels)."""
    cut: dict[torch.dtype, OpPolicy | None] = {}

    def provide(dtype: torch.dtype) -> OpPolicy | None:
        if dtype not in cut:
            full: OpPolicy | None = provider(dtype)
            cut[dtype] = None if full is None else dataclasses.replace(
                full, actions={o: a for o, a in full.actions.items() if o in vendor},
                default=DEFAULT_ACTIONS["O1"], reach=False, inner=None,
            )  # fmt: skip
        return cut[dtype]

    return provide


def backend_key(device_type: str) -> torch._C.DispatchKey:
    """The backend dispatch key of ``device_type`` (PrivateUse1 for a vendor's renamed one)."""
    try:
        return dispatch_key(torch._C._dispatch_key_for_device(device_type))
    except (RuntimeError, AmpcoreError):
        return torch._C.DispatchKey.PrivateUse1


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """A resident table overrides a vendor's kernels on purpose: silence torch's warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_OVERRIDE_WARNING, category=UserWarning)
        yield
