"""The compiled executor's Python side: its kernels on a key, its tables, the thread's table.

The C++ kernels (``policy_kernel.cpp``, built by :mod:`ampcore._policy.executor`) carry out
the same decisions as the Python kernels: :func:`ampcore._policy.decisions.decide`, taken once
per (policy, device type) for every castable overload and handed to C++ as one byte per
overload (:func:`encode`).  A thread's policy reaches C++ as that table's id, set per device
type whenever the thread's policy changes (:attr:`ampcore._policy.thread_state.MIRRORS`).

Overloads the C++ kernel does not carry out would run their Python kernel on the same key
(:data:`PYTHON_ROUTED`: none today).  The one piece of Python left on an op path is the
fused-kernel warning (:mod:`ampcore._policy.fused`): C++ asks ``_fused_sdp_choice`` itself
and calls Python only to warn, once per policy.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, Final

import torch

from .._op_names import castable_overloads
from .decisions import Decision, OverloadSpec, Plan, decide
from .fused import FUSED_CHOICE, named_swallowed, warn_swallowed
from .key_tables import Client, KeyTable, all_autocast_keys
from .lists import Action
from .thread_state import MIRRORS
from .torch_tables import APPEND_DTYPE_OVERLOADS

__all__ = ["PYTHON_ROUTED", "CompiledKernels", "encode", "specs"]

#: Overloads whose Python kernel runs under the compiled executor too (none today).
PYTHON_ROUTED: Final[frozenset[str]] = frozenset()

#: Steps that cast (or may) and then call the op below autocast, or decompose it.
_CASTING: Final = frozenset({Action.LOW, Action.FP32, Action.PROMOTE, Action.FP32_SET_OPT_DTYPE, "as_called"})
#: The resident clients' autocast dtypes given tables up front (C++ names of the dtypes).
_PROVIDED: Final = {torch.float16: "Half", torch.bfloat16: "BFloat16"}


@functools.cache
def specs() -> tuple[OverloadSpec, ...]:
    """The spec of every castable overload, in the C++ kernel's op order."""
    return tuple(OverloadSpec.of(overload) for overload in castable_overloads())


@functools.cache
def _index() -> dict[str, int]:
    """overload -> its index in the C++ kernel's op order."""
    return {overload: i for i, overload in enumerate(castable_overloads())}


def encode(decision: Decision, spec: OverloadSpec, policy: Any, codes: dict[str, int]) -> int:
    """The C++ code of ``decision`` (``codes``: the extension's ``CODES``)."""
    step = str(decision.step)
    if step == Action.FP32_APPEND_DTYPE and spec.append_to is None:
        step = "as_called"  # not one of torch's fp32_append_dtype overloads: run as called
    code = codes[step]
    if decision.choose:
        code |= codes["choose"]
    if step in _CASTING and policy.reach and spec.composite:
        code |= codes["decompose"]
        if spec.swallows and named_swallowed(spec.name, policy):
            code |= codes["check_fused"]
    return code


class CompiledKernels:
    """The compiled executor of one process: its keys, tables and device-type slots."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.codes: dict[str, int] = dict(module.CODES)
        missing = {str(step) for step in (*Plan, *Action)} - {str(Plan.CHOOSE)} - set(self.codes)
        if missing:
            raise RuntimeError(f"the compiled policy kernel has no code for {sorted(missing)}")
        every = specs()
        module.set_ops(
            ["" if s.name in PYTHON_ROUTED else s.name for s in every],
            [-1 if s.dtype_arg is None else s.dtype_arg[0] for s in every],
            [APPEND_DTYPE_OVERLOADS.get(s.name, "") for s in every],
            [s.banned for s in every],
            [FUSED_CHOICE.get(s.name, ("", 0)) if s.swallows else ("", 0) for s in every],
            all_autocast_keys().raw_repr(),
            self._warn,
        )
        self._keys: dict[str, int] = {}
        self._slots: dict[str, int] = {}
        # slot -> policy -> table id: kept for the process, as the C++ tables are (policies
        # are few: one per distinct lists, and their own cache holds them already)
        self._ids: dict[int, dict[Any, int]] = {}
        self._policies: dict[int, Any] = {}  # table id -> policy (for the fused-kernel warning)
        self._lock = threading.Lock()

    def attach(self, table: KeyTable) -> None:
        """Serve ``table``'s key and clients (before any of its kernels is registered)."""
        if table.key_name not in self._keys:
            self._keys[table.key_name] = self.module.add_key(int(table.key.value))
        self.set_clients(table)

    def register(self, table: KeyTable, overloads: Iterable[str]) -> int:
        """Register the C++ kernels of ``overloads`` on ``table``'s key (those it has are
        skipped); how many overloads have one there."""
        index = _index()
        return int(self.module.register_ops(self._keys[table.key_name], [index[o] for o in overloads]))

    def set_clients(self, table: KeyTable) -> None:
        """Hand ``table``'s clients to its C++ kernels, and their policies from now on."""
        entries = []
        for client in table.clients:
            slot = self._slots.setdefault(client.device_type, len(self._slots))
            provided = []
            if client.provider is not None:
                for dtype, name in _PROVIDED.items():
                    policy = client.provider(dtype)
                    if policy is not None:
                        provided.append((name, self.table_id(policy, client, slot)))
            entries.append((int(client.key.value), int(client.backend.value), client.device_type, slot, provided))
            MIRRORS[client.device_type] = self._mirror(client, slot)
        self.module.set_clients(self._keys[table.key_name], entries)

    def region_entry(
        self, table: KeyTable | None, device_type: str, policy: Any, dtype: torch.dtype
    ) -> tuple[int, ...] | None:
        """The arguments of the extension's ``add_entry`` for a region of ``policy`` on
        ``device_type`` in ``dtype`` on ``table``'s (shadow) key: device type, dtype, slot,
        table id, key (None: a dtype the extension does not name).  ``policy`` None (no
        ``table``): a region without a policy, whose entry sets the slot's table to none
        where the device type has a slot, else leaves the tables alone (slot -1)."""
        name = _PROVIDED.get(dtype)
        if name is None:
            return None
        module = self.module
        ids = (int(module.device_type_id(device_type)), int(module.scalar_type_id(name)))
        if table is None:
            return (*ids, self._slots.get(device_type, -1), 0, -1)
        client = next((c for c in table.clients if c.device_type == device_type), None)
        if client is None:
            return None
        slot = self._slots[device_type]
        return (*ids, slot, self.table_id(policy, client, slot), int(table.key.value))

    def _mirror(self, client: Client, slot: int) -> Callable[[Any], None]:
        set_current, table_id = self.module.set_current, self.table_id

        def mirror(policy: Any) -> None:
            set_current(slot, 0 if policy is None else table_id(policy, client, slot))

        return mirror

    def table_id(self, policy: Any, client: Client, slot: int) -> int:
        """The id of ``policy``'s table for ``client`` (built the first time)."""
        ids = self._ids.get(slot)
        found = None if ids is None else ids.get(policy)
        if found is not None:
            return found
        with self._lock:
            ids = self._ids.setdefault(slot, {})
            found = ids.get(policy)
            if found is None:
                inner = 0 if policy.inner is None else self.table_id_locked(policy.inner, client, slot)
                found = ids[policy] = self._new_table(policy, client, inner)
            return found

    def table_id_locked(self, policy: Any, client: Client, slot: int) -> int:
        ids = self._ids[slot]
        found = ids.get(policy)
        if found is None:
            found = ids[policy] = self._new_table(policy, client, 0)
        return found

    def _new_table(self, policy: Any, client: Client, inner: int) -> int:
        codes = bytes(encode(decide(spec, policy, client), spec, policy, self.codes) for spec in specs())
        found = int(self.module.new_table(codes, inner, bool(policy.cache)))
        self._policies[found] = policy
        return found

    def _warn(self, index: int, table: int) -> None:
        """C++ found a call taking a fused kernel that swallows custom-listed ops."""
        warn_swallowed(specs()[index].name, self._policies[table])
