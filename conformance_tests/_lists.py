"""What the suite expects of each op: derived from the backend's own op lists.

The effective lists of a backend, dtype and level are :func:`ampcore.oplists`: the native
``torch.autocast`` table of the device type with the adapter's
``ampcore_op_list_adjustments`` applied.  Each op the suite has a sample for is then
checked against the list it is on (white: runs low; black: float32; promote: widest input
dtype; unlisted: what the level says).

Two required sets hold whatever an adapter's adjustments say: the matrix products that make
mixed precision worth having (they must stay white) and the losses that must stay float32.
Both are taken from torch's own table for the device type (:func:`required_ops`), so a loss
that table leaves unlisted (``cross_entropy_loss`` in CUDA's and the generic lists: it
decomposes into ``log_softmax``, black, and ``nll_loss``) is not required.  A vendor that
deliberately differs records it in its manifest, with a reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import torch

import ampcore

__all__ = [
    "REQUIRED_BLACK",
    "REQUIRED_WHITE",
    "category",
    "effective_lists",
    "native_category",
    "overlaps",
    "required_ops",
    "unknown_op_names",
]

#: Ops a backend must run in the low-precision dtype at O1, where torch's table has them white.
REQUIRED_WHITE: Final = ("mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "conv2d")
#: Ops a backend must keep in float32 at O1, where torch's table has them black (losses:
#: reductions prone to overflow).
REQUIRED_BLACK: Final = (
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "nll_loss",
    "cross_entropy_loss",
    "kl_div",
    "binary_cross_entropy_with_logits",
)
_LISTS: Final = ("white", "black", "promote", "banned")


_POLICY_CATEGORY: Final = {
    "lower_precision_fp": "white",
    "fp32": "black",
    "fp32_set_opt_dtype": "black",
    "fp32_append_dtype": "black",
    "promote": "promote",
    "banned": "banned",
}


def native_category(device_type: str, op: str) -> str:
    """The list torch's own autocast table for ``device_type`` puts ``op`` on (``"other"``:
    none), before any adapter adjustment.

    Example::

        >>> native_category("cpu", "cross_entropy_loss"), native_category("cuda", "cross_entropy_loss")
        ('black', 'other')
    """
    from ampcore.toolkit import native_table

    for overload, policy in native_table(device_type).items():
        if overload.partition(".")[0] == op:
            return _POLICY_CATEGORY[policy]
    return "other"


def required_ops(device_type: str, kind: str) -> tuple[str, ...]:
    """The ops of :data:`REQUIRED_WHITE` (``kind="required_white"``) or :data:`REQUIRED_BLACK`
    (``"required_black"``) that torch's table for ``device_type`` puts on that list.

    Example::

        >>> "cross_entropy_loss" in required_ops("cpu", "required_black")
        True
        >>> "cross_entropy_loss" in required_ops("npu", "required_black")
        False
    """
    candidates, wanted = (REQUIRED_WHITE, "white") if kind == "required_white" else (REQUIRED_BLACK, "black")
    return tuple(op for op in candidates if native_category(device_type, op) == wanted)


def effective_lists(backend: ampcore.Backend, dtype: torch.dtype, level: str = "O1") -> ampcore.OpLists:
    """The op lists ampcore applies for ``backend`` and ``dtype`` at ``level``.

    Raises the adapter's error (e.g. an unknown op name in its adjustments), or a
    ``RuntimeError`` naming the missing feature when this ampcore has no op-policy engine.
    """
    engine = getattr(ampcore, "oplists", None)
    if engine is None:
        raise RuntimeError(
            f"ampcore {ampcore.__version__} has no ampcore.oplists (the op-policy engine): the suite "
            "cannot derive per-op expectations from the backend's lists"
        )
    return engine(backend.name, dtype=dtype, level=level)


def category(lists: ampcore.OpLists, op: str) -> str:
    """``"white"``, ``"black"``, ``"promote"``, ``"banned"`` or ``"other"`` (on no list)."""
    return next((name for name in _LISTS if op in getattr(lists, name)), "other")


def overlaps(lists: ampcore.OpLists) -> dict[str, list[str]]:
    """Ops named on more than one list, by pair (``{"white/black": [...]}``)."""
    found = {
        f"{a}/{b}": sorted(getattr(lists, a) & getattr(lists, b)) for i, a in enumerate(_LISTS) for b in _LISTS[i + 1 :]
    }
    return {pair: ops for pair, ops in found.items() if ops}


def unknown_op_names(names: Iterable[str]) -> list[str]:
    """Names that resolve to no registered operator (``"mm"``, ``"myns::op"``)."""
    unknown = []
    for name in sorted(set(names)):
        namespace, _, op = name.rpartition("::")
        try:
            getattr(getattr(torch.ops, namespace or "aten"), op.split(".")[0])
        except (AttributeError, RuntimeError):
            unknown.append(name)
    return unknown
