"""The op-list registry: effective white/black/promote lists per backend, dtype and level.

The lists of a region are computed in three steps, each overriding the previous one:

1. the native ``torch.autocast`` table of the backend's device type
   (:mod:`ampcore._policy.torch_tables`), mapped through the level (OD runs promote ops in
   float32, O2 in low precision);
2. the adapter's ``ampcore_op_list_adjustments(dtype)``;
3. the user's ``custom_white_list`` / ``custom_black_list`` (Paddle's rules: an op may not
   be in both; a custom-white op leaves the black and promote lists and vice versa).

The result is an :class:`OpLists`, inspectable with :func:`ampcore.oplists` and
``ampcore oplists``.  Policies are decided per operator overload; the lists are summaries
by op name.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from .._backends.backend import Backend, dtype_name
from .._backends.registry import DeviceLike, get_backend
from .._dtypes import parse_dtype
from .._errors import AmpcoreError
from .._op_names import canonical_ops, functional_overloads, lookup_op
from .levels import Level, check_level
from .torch_tables import CastPolicy, dispatch_key_of, native_table, table_name_of

__all__ = [
    "ACTIONS",
    "Action",
    "BANNED",
    "FP32",
    "FP32_APPEND_DTYPE",
    "FP32_SET_OPT_DTYPE",
    "FOLLOW",
    "LOW",
    "OpLists",
    "DEFAULT_ACTIONS",
    "PROMOTE",
    "check_custom",
    "compute_oplists",
    "merge_custom",
    "native_action",
    "oplists",
]


class Action(str, enum.Enum):
    """What a policy does to one op call (a ``str``: lists print and serialise as their values)."""

    def __str__(self) -> str:
        return str(self.value)

    LOW = "low"  #: inputs cast to the low-precision dtype
    FP32 = "fp32"  #: inputs cast to float32
    FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"  #: dtype=float32 passed unless given
    FP32_APPEND_DTYPE = "fp32_append_dtype"  #: redispatched with a float32 output dtype
    PROMOTE = "promote"  #: inputs cast to the widest floating dtype among them
    BANNED = "banned"  #: raises, as torch.autocast does
    FOLLOW = "follow"  #: no cast: the op follows its inputs


LOW: Final = Action.LOW
FP32: Final = Action.FP32
FP32_SET_OPT_DTYPE: Final = Action.FP32_SET_OPT_DTYPE
FP32_APPEND_DTYPE: Final = Action.FP32_APPEND_DTYPE
PROMOTE: Final = Action.PROMOTE
BANNED: Final = Action.BANNED
FOLLOW: Final = Action.FOLLOW

ACTIONS: Final = tuple(Action)

_FP32_FAMILY: Final = frozenset({FP32, FP32_SET_OPT_DTYPE, FP32_APPEND_DTYPE})

#: native cast policy -> action, per level (promote ops follow the level's default).
_LEVEL_ACTIONS: Final[Mapping[str, Mapping[CastPolicy, str]]] = {
    level: {
        "lower_precision_fp": LOW,
        "fp32": FP32,
        "fp32_set_opt_dtype": FP32_SET_OPT_DTYPE,
        "fp32_append_dtype": FP32_APPEND_DTYPE,
        "promote": promote,
        "banned": BANNED,
    }
    for level, promote in (("OD", FP32), ("O1", PROMOTE), ("O2", LOW), ("auto", PROMOTE))
}

#: The list an overload's action puts it in (see :meth:`OpLists.category`).
_CATEGORY_OF: Final[Mapping[str, str]] = {
    LOW: "white",
    FP32: "black",
    FP32_SET_OPT_DTYPE: "black",
    FP32_APPEND_DTYPE: "black",
    PROMOTE: "promote",
    BANNED: "banned",
}

#: What an op in no list does, per level.
#: ``auto`` has O1's lists; :mod:`ampcore._auto` runs planned modules in float32 where
#: low precision does not pay.
DEFAULT_ACTIONS: Final[Mapping[str, str]] = {"O0": FOLLOW, "OD": FP32, "O1": FOLLOW, "O2": LOW, "auto": FOLLOW}

#: How :attr:`OpLists.unlisted` words :data:`DEFAULT_ACTIONS`.
_UNLISTED: Final[Mapping[str, str]] = {
    "O0": "autocast-off",
    "OD": "float32",
    "O1": "follow-inputs",
    "O2": "low-precision",
    "auto": "follow-inputs",
}


@dataclass(frozen=True)
class OpLists:
    """The effective op lists of one (backend, dtype, level, custom lists).

    ``white`` ops run in ``dtype``, ``black`` ops in float32 (``fp32_with_dtype`` is the part
    of the black list that gets there by asking for a float32 output, e.g. ``softmax`` on
    CUDA), ``promote`` ops in the widest floating dtype of their inputs, ``banned`` ops
    raise.  ``unlisted`` says what every other op does: ``"follow-inputs"`` (O1),
    ``"float32"`` (OD), ``"low-precision"`` (O2) or ``"autocast-off"`` (O0).
    ``overloads`` maps every listed operator overload (``"softmax.int"``) to its action.

    Example::

        >>> import ampcore
        >>> lists = ampcore.oplists("cpu", custom_white_list={"elementwise_add"})
        >>> "add" in lists.white, "mm" in lists.white, "mse_loss" in lists.black
        (True, True, True)
    """

    backend: str
    device_type: str
    dispatch_key: str
    table: str
    dtype: torch.dtype
    level: Level
    white: frozenset[str]
    black: frozenset[str]
    promote: frozenset[str]
    fp32_with_dtype: frozenset[str]
    banned: frozenset[str]
    unlisted: str
    custom_white: frozenset[str] = frozenset()
    custom_black: frozenset[str] = frozenset()
    adjustments: Mapping[str, frozenset[str]] = field(default_factory=dict, compare=False, hash=False)
    overloads: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_native(self) -> bool:
        """Whether these are exactly torch.autocast's lists (O1, nothing customised)."""
        return self.level == "O1" and not (self.custom_white or self.custom_black or self.adjustments)

    @property
    def default_action(self) -> str:
        """The action of ops in no list (see :attr:`unlisted`)."""
        return DEFAULT_ACTIONS[self.level]

    def action(self, overload: str) -> str:
        """The action for one operator overload (``"add.Tensor"``, ``"mm"``)."""
        return self.overloads.get(overload, self.default_action)

    def category(self, op: str) -> str:
        """``"white"``, ``"black"``, ``"promote"``, ``"banned"`` or :attr:`unlisted` for op name
        ``op`` (an ATen name, a Paddle alias, or one overload such as ``"add.Tensor"``).

        Raises :class:`ampcore.AmpcoreError` for an unknown op or overload, naming the
        closest valid names.
        """
        base, overload = lookup_op(op, f"OpLists.category({op!r})")
        if overload is not None:
            action = self.overloads.get(overload)
            return self.unlisted if action is None or action == FOLLOW else _CATEGORY_OF[action]
        for name in ("white", "black", "promote", "banned"):
            if base in getattr(self, name):
                return name
        return self.unlisted

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (sorted lists)."""
        return {
            "backend": self.backend,
            "device_type": self.device_type,
            "dispatch_key": self.dispatch_key,
            "table": self.table,
            "dtype": dtype_name(self.dtype),
            "level": self.level,
            "white": sorted(self.white),
            "black": sorted(self.black),
            "promote": sorted(self.promote),
            "fp32_with_dtype": sorted(self.fp32_with_dtype),
            "banned": sorted(self.banned),
            "unlisted": self.unlisted,
            "custom_white": sorted(self.custom_white),
            "custom_black": sorted(self.custom_black),
            "adjustments": {key: sorted(ops) for key, ops in sorted(self.adjustments.items())},
            "overloads": dict(sorted(self.overloads.items())),
        }


def native_action(policy: CastPolicy | None) -> str:
    """The O1 action of a native cast policy (``None``: no native kernel, the op follows)."""
    return FOLLOW if policy is None else _LEVEL_ACTIONS["O1"][policy]


def check_custom(white: frozenset[str], black: frozenset[str], call: str) -> None:
    """Paddle's rule: an op may not be in both custom lists."""
    both = white & black
    if both:
        raise AmpcoreError(
            f"{call}(custom_white_list=..., custom_black_list=...): {sorted(both)} in both lists; "
            f"an op can be in one custom list only: remove {sorted(both)} from one of them"
        )


def merge_custom(
    outer: tuple[frozenset[str], frozenset[str]], white: frozenset[str], black: frozenset[str]
) -> tuple[frozenset[str], frozenset[str]]:
    """The custom lists of a region nested in a region with custom lists ``outer``.

    The inner lists win: an op the inner region white-lists leaves the outer black list
    and vice versa.
    """
    outer_white, outer_black = outer
    return (outer_white - black) | white, (outer_black - white) | black


def _adjustments(backend: Backend, dtype: torch.dtype) -> dict[str, frozenset[str]]:
    """The adapter's adjustments (canonical names, validated when the plugin loaded)."""
    return dict(backend.op_list_adjustments(dtype))


def _black_action(native: CastPolicy | None) -> str:
    if native in ("fp32_set_opt_dtype", "fp32_append_dtype"):
        return native
    return FP32


def _overload_actions(
    device_type: str,
    level: Level,
    adjustments: Mapping[str, frozenset[str]],
    white: frozenset[str],
    black: frozenset[str],
) -> dict[str, str]:
    if level == "O0":
        return {}
    table = native_table(device_type)
    level_actions = _LEVEL_ACTIONS[level]
    actions = {overload: level_actions[policy] for overload, policy in table.items()}
    moves: list[tuple[Iterable[str], str]] = [
        (adjustments.get("white", ()), LOW),
        (adjustments.get("black", ()), FP32),
        (adjustments.get("promote", ()), PROMOTE),
        (white, LOW),
        (black, FP32),
    ]
    for names, action in moves:
        for name in names:
            for overload in functional_overloads(name):
                actions[overload] = _black_action(table.get(overload)) if action == FP32 else action
    return actions


@functools.lru_cache(maxsize=512)
def compute_oplists(
    backend: Backend, dtype: torch.dtype, level: Level, white: frozenset[str], black: frozenset[str]
) -> OpLists:
    """The effective lists (validated inputs; cached)."""
    adjustments = _adjustments(backend, dtype) if level != "O0" else {}
    actions = _overload_actions(backend.device_type, level, adjustments, white, black)
    by_action: dict[str, set[str]] = {action: set() for action in ACTIONS}
    for overload, action in actions.items():
        by_action[action].add(overload.partition(".")[0])
    return OpLists(
        backend=backend.name,
        device_type=backend.device_type,
        dispatch_key=dispatch_key_of(backend.device_type),
        table=table_name_of(backend.device_type),
        dtype=dtype,
        level=level,
        white=frozenset(by_action[LOW]),
        black=frozenset(by_action[FP32] | by_action[FP32_SET_OPT_DTYPE] | by_action[FP32_APPEND_DTYPE]),
        promote=frozenset(by_action[PROMOTE]),
        fp32_with_dtype=frozenset(by_action[FP32_SET_OPT_DTYPE] | by_action[FP32_APPEND_DTYPE]),
        banned=frozenset(by_action[BANNED]),
        unlisted=_UNLISTED[level],
        custom_white=white,
        custom_black=black,
        adjustments=adjustments,
        overloads=actions,
    )


def oplists(
    device: DeviceLike = None,
    dtype: torch.dtype | str | None = None,
    level: str = "O1",
    custom_white_list: Iterable[str] | None = None,
    custom_black_list: Iterable[str] | None = None,
) -> OpLists:
    """The op lists :class:`ampcore.autocast` would use with these arguments.

    Works for unavailable backends too (e.g. CUDA's lists on a CPU-only machine).

    Args:
        device: a backend name, ``"name:N"``, a ``torch.device`` or ``None`` (best available).
        dtype: the low-precision dtype (``torch.bfloat16`` or a name such as ``"bf16"``);
            ``None`` takes the backend's default.
        level: ``"O0"``, ``"OD"``, ``"O1"``, ``"O2"`` or ``"auto"`` (O1's lists).
        custom_white_list: ops to run in ``dtype`` (ATen names or Paddle aliases).
        custom_black_list: ops to run in float32.

    Raises:
        AmpcoreError: unknown backend, dtype or level, unknown op names (with the closest
            valid names), or an op in both custom lists.

    Example::

        >>> import ampcore, torch
        >>> lists = ampcore.oplists("cpu", level="OD")
        >>> "mm" in lists.white, "cat" in lists.black, lists.unlisted
        (True, True, 'float32')
    """
    call = "ampcore.oplists"
    checked_level = check_level(level, call)
    if dtype is not None:
        dtype = parse_dtype(dtype, call)
    backend = get_backend(device)
    checked_dtype = backend.check_dtype(dtype, call)
    white = canonical_ops(custom_white_list, call, "custom_white_list")
    black = canonical_ops(custom_black_list, call, "custom_black_list")
    check_custom(white, black, call)
    return compute_oplists(backend, checked_dtype, checked_level, white, black)
