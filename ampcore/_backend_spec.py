"""``BackendSpec``: who a backend is, the value its adapter's required hook
:func:`ampcore.hookspec.ampcore_backend` returns.

Part of the adapter contract (:mod:`ampcore.hookspec`, which re-exports it; public as
``ampcore.BackendSpec``), kept in its own module because it is a value, not a hook:
:mod:`ampcore.hookspec` holds only the hooks, their markers and the contract's constants.
The core checks every field when the plugin is loaded (``ampcore/_backends/answers.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["BackendSpec"]


@dataclass(frozen=True)
class BackendSpec:
    """Who a backend is: what :func:`ampcore_backend` returns (``ampcore.BackendSpec``).

    Attributes:
        name: the backend's name, as users pass it to ``device=`` (e.g. ``"cuda"``): lower
            case letters, digits, ``_`` and ``-``, no ``:`` (``"cuda:1"`` selects device 1 of
            backend ``"cuda"``).  A plugin claiming the name of a first-party adapter
            (distribution ``ampcore``) replaces it; two other plugins claiming one name
            conflict (the user blocks one with ``AMPCORE_BLOCK_PLUGINS``).
        device_type: the torch device type the backend drives (``torch.autocast(device_type)``);
            usually the name (``"cuda"``, ``"xpu"``, ``"npu"`` after torch_npu renamed
            PrivateUse1), but a template may drive ``"cpu"`` under its own name.
        dtypes: the low-precision dtypes the backend can autocast to, best first: only those
            the hardware (or a documented emulation) really runs, as the conformance suite
            checks each one.  Non-empty, distinct, floating.  Read at load, before the
            vendor extension is imported (so not from ``get_amp_supported_dtype()``): list
            the dtypes of the product line, and refuse one on a device that lacks it with an
            ``"error"`` :class:`ampcore.CapabilityIssue` from :func:`ampcore_check_capability`.
        default_dtype: the dtype used for ``dtype=None``, one of ``dtypes``; ``None``: the
            first of ``dtypes``.
        priority: rank for ``device=None``: the available backend with the highest priority
            wins (ties: alphabetical name).  Default 50; first-party values: ``cpu`` 0,
            ``xpu`` 80, ``cuda`` and ``npu`` 100; the in-repo templates and test devices
            -10 (never chosen over a real device, not even over ``cpu``).
        master_update_chunk_elements: how O2's own master-weight updates (momentum-free
            SGD, Adam, AdamW) walk large parameters: ``None`` (the default) updates whole
            tensors, a few multi-tensor ops per param group (what a GPU-like device with
            costly kernel launches wants); a positive int splits each parameter larger
            than that many elements (rounded up to a multiple of 64, where torch's CPU
            fused kernels split alike) into chunks updated one after another, so that a
            chunk stays in the CPU's caches between the optimizer's passes (the CPU
            adapter's choice); ampcore then times its update on the host clock against
            whole tensors and keeps the faster walk, so give a number only where updates
            run synchronously on the host.  Optional; added to contract 2 with a default,
            so adapters that predate it keep working.
        master_update_onepass: whether O2's Adam/AdamW/SGD updates may run ampcore's
            one-pass CPU kernels (C++ extensions built at first use that read the
            low-precision gradient, apply the arithmetic of torch's CPU optimizer of the
            group's flavour, fused or for-loop/foreach, and write the rounded low-precision
            parameter in one pass; self-checked against torch's own at first use,
            ``AMPCORE_O2_ONEPASS``, docs/o2.md).  Only for devices whose tensors live in
            host memory and whose optimizers run torch's CPU kernels (the CPU adapter).
            Optional, default ``False``.

    Example::

        >>> import torch
        >>> spec = BackendSpec("acme", "acme", [torch.float16, torch.bfloat16], priority=100)
        >>> spec.default_dtype, spec.priority
        (None, 100)
    """

    name: str
    device_type: str
    dtypes: Sequence[torch.dtype]
    default_dtype: torch.dtype | None = None
    priority: int = 50
    master_update_chunk_elements: int | None = None
    master_update_onepass: bool = False
