"""How custom lists and levels OD/O2 reach every op call: policies, and where their kernels
live in the dispatcher.

torch's autocast is a set of C++ kernels registered per operator on the autocast dispatch
key of a device type (``AutocastCPU``...), which sits above autograd.  ampcore's policy
kernels read the calling thread's :class:`OpPolicy`: the C++ ones of
:mod:`ampcore._policy.compiled` or the Python ones of :mod:`ampcore._policy.kernels`, one
executor per process (:mod:`ampcore._policy.executor`), registered the same way; an
uncustomised O1 region has no policy and involves no ampcore kernel: it *is*
``torch.autocast``.

Registration lifecycle (correct by construction, measured in docs/performance.md):

* **Registered once per overload, only where a policy needs it, never removed.**  Removing
  a kernel, or replacing one, while another thread dispatches the same operator on the same
  key races inside the dispatcher (segfaults, ``SafePyObject`` INTERNAL ASSERTs): nothing is
  ever removed or replaced.  On a shadow key, the first region that needs the key registers
  a fallthrough fallback for it, and a region whose policy is new registers kernels for the
  overloads that policy (or its inner policy) decides anything but ``PASS`` for
  (:func:`~ampcore._policy.decisions.needs_kernel`), under a lock, before the policy is put in
  force.  Every other overload has no kernel there: the dispatcher folds the fallthrough
  into the operator's key mask, so those ops skip the key without entering any code of
  ampcore's.  A new kernel only replaces its op's fallthrough (the dispatcher fills the
  op's table entry before it clears the key from the op's fallthrough mask, and a call
  reads the entry only then), so a thread dispatching the op meanwhile runs one or the
  other (tests/policy/test_kernel_registration.py races new policies against other
  threads' ops).  A resident key gets every castable overload at once.
* **On a shadow key.**  For a device type whose autocast key has a higher-priority autocast
  key that nothing else uses (:data:`SHADOW_KEYS`: ``AutocastIPU`` above CPU, XPU and MTIA;
  ``AutocastPrivateUse1`` above CUDA, MPS, HPU and XLA while no PrivateUse1 backend is
  loaded), the kernels go on that key, and a region with a policy switches the key on for
  its thread only (the thread-local include set) until it exits.  Tensors never carry a
  shadow key, so plain ``torch.autocast`` code, in any thread and at any time, dispatches
  exactly as in a process without ampcore: it pays nothing and its results cannot depend on
  what ran before.  A kernel passes a call on untouched when its thread has no policy for
  the call's device type, and when the policy does what the dispatcher would do without it
  (:class:`~ampcore._policy.decisions.Plan` ``PASS``: torch's own kernel below casts as the
  policy says, or nothing below casts and neither does the policy), so an op's result never
  depends on whether another policy gave it a kernel.
* **Resident**, otherwise (a PrivateUse1 device such as ``npu``: no autocast key ranks
  above it): the kernels go on the device's own autocast key.  With no ampcore region
  active they do what was there before them, so plain ``torch.autocast`` gives the same
  results before and after any region: on a device without autocast kernels of its own
  they *provide* its autocast (the backend's O1 lists, registered as soon as the backend is
  resolved); on a device whose vendor registered kernels (:func:`_vendor_only`) they apply
  the backend's O1 lists to the ops the vendor has kernels for (the lists the adapter
  declares, which the conformance suite checks against those kernels) and leave every other
  op uncast, as the vendor's fallthrough did.  The vendor's kernels themselves are replaced
  (torch.library cannot call a kernel it overrode), so each autocast call of the device
  runs ampcore's Python kernel (docs/op-lists.md measures the cost).
* **Fork and interrupts.**  Registration runs under :data:`ampcore._forklock.LOCK`, which
  ``os.register_at_fork`` takes around ``fork()``, so a child never inherits a held lock,
  a held dispatcher mutex or a half-registered table.  A
  registration interrupted by ``KeyboardInterrupt`` resumes where it stopped; a route is
  published only when its table is complete.

Reaching inside composites: when a region has custom lists, an op with a
CompositeImplicitAutograd kernel (``linear``, ``matmul``, ``scaled_dot_product_attention``...)
is cast as its own action says and then *decomposed with autocast still on*, under an inner
policy in which only the custom-listed ops act and every other op merely reconciles mixed
input dtypes (torch's promote rule), as torch runs a composite's internals with autocast
off.  So ``custom_white_list={"bmm"}`` reaches the ``bmm`` inside SDPA's math path, while a
black-listed ``linear`` does not see its inner ``addmm`` cast back to low precision.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import torch

from .._errors import AmpcoreError
from .._forklock import LOCK
from .._op_names import castable_overloads
from .casting import device_check
from .compiled import PYTHON_ROUTED, CompiledKernels, specs
from .device_kernels import backend_key as _backend_key
from .device_kernels import kernels_on as _kernels_on
from .device_kernels import quiet as _quiet
from .device_kernels import torch_actions as _torch_actions
from .device_kernels import vendor_only as _vendor_only
from .executor import compiled_module
from .kernels import kernel, needs_kernel
from .key_tables import Client, KeyTable, dispatch_key
from .lists import DEFAULT_ACTIONS, PROMOTE, OpLists
from .torch_tables import NATIVE_TABLES, TENSOR_DEVICE_CHECKS, dispatch_key_of, table_name_of

__all__ = [
    "SHADOW_KEYS",
    "OpPolicy",
    "Route",
    "choose_key",
    "has_native_autocast",
    "has_own_autocast_kernel",
    "policy_for",
    "registered_keys",
    "region_entry",
    "registered_overloads",
    "route",
    "routes",
]

#: Autocast keys ampcore may use as shadow keys, in order of preference.
SHADOW_KEYS: Final = ("AutocastIPU", "AutocastPrivateUse1")


@dataclass(frozen=True, eq=False)
class OpPolicy:
    """What each op does in a region: built once per :class:`~ampcore.OpLists`.

    ``inner`` is the policy inside a decomposed composite (``None``: this one); ``cache``
    says whether weight casts go to the thread's region cache (not for the lists a resident
    client applies outside any region).
    """

    lists: OpLists
    dtype: torch.dtype
    actions: Mapping[str, str]
    default: str
    reach: bool
    inner: OpPolicy | None = None
    cache: bool = True


@functools.lru_cache(maxsize=512)
def _policy(lists: OpLists, _identity: int, cache: bool) -> OpPolicy | None:
    if lists.level == "O0":
        return None
    explicit = {
        overload: lists.overloads[overload]
        for overload in lists.overloads
        if overload.partition(".")[0] in lists.custom_white | lists.custom_black
    }
    # inside a decomposed composite: custom-listed ops act, the others only reconcile
    # mixed input dtypes their neighbours' custom casts may cause (torch's promote rule)
    inner = OpPolicy(lists, lists.dtype, explicit, PROMOTE, True, None, cache) if explicit else None
    default = DEFAULT_ACTIONS[lists.level]
    return OpPolicy(lists, lists.dtype, dict(lists.overloads), default, bool(explicit), inner, cache)


def policy_for(lists: OpLists, cache: bool = True) -> OpPolicy | None:
    """The runtime policy of ``lists`` (``None`` for O0)."""
    return _policy(lists, id(lists), cache)


# -- routes -------------------------------------------------------------------------------


class Route(NamedTuple):
    """Where the kernels of a device type live: ``key`` (a dispatch key name), and whether it
    is the device's own autocast key (``resident``) rather than a shadow key."""

    device_type: str
    key: str
    resident: bool


def _ranks_above(key: str, other: str) -> bool:
    return bool(torch._C._dispatch_keyset_full_after(dispatch_key(key)).has(dispatch_key(other)))


def choose_key(
    device_key: str, in_use: Callable[[str], bool], ranks_above: Callable[[str, str], bool] = _ranks_above
) -> str:
    """The key for the kernels of a device type whose own autocast key is ``device_key``:
    the first :data:`SHADOW_KEYS` entry that ranks above it and is not ``in_use``, else
    ``device_key`` itself (resident).

    Example::

        >>> choose_key("AutocastCPU", in_use=lambda key: False)
        'AutocastIPU'
        >>> choose_key("AutocastCUDA", in_use=lambda key: False)
        'AutocastPrivateUse1'
        >>> choose_key("AutocastCUDA", in_use=lambda key: key == "AutocastPrivateUse1")
        'AutocastCUDA'
        >>> choose_key("AutocastPrivateUse1", in_use=lambda key: False)
        'AutocastPrivateUse1'
    """
    for key in SHADOW_KEYS:
        if torch._C._parse_dispatch_key(key) is not None and ranks_above(key, device_key) and not in_use(key):
            return key
    return device_key


class _Registry:
    """The process's registrations: one :class:`KeyTable` per key used, one route per device type.

    This is process-global state because the dispatcher is; it only ever grows.
    """

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.tables: dict[str, KeyTable] = {}
        self.registered: dict[str, set[str]] = {}  # key -> overloads with a kernel of ampcore's
        self._prepared: dict[str, set[OpPolicy]] = {}  # device type -> policies whose kernels are there
        self._entries: dict[tuple[str, OpPolicy | None, torch.dtype], tuple[Any, ...] | None] = {}  # region_entry
        self._libraries: list[torch.library.Library] = []  # kept alive: never removed
        self._library: dict[str, torch.library.Library] = {}  # key -> the one the Python kernels go in
        self._fallbacks: set[str] = set()  # keys ampcore registered a fallthrough for
        self.vendor_ops: dict[str, frozenset[str]] = {}  # resident device type -> its vendor's kernels
        self._executor: tuple[CompiledKernels | None] | None = None  # chosen at the first registration

    def _compiled(self) -> CompiledKernels | None:
        """The compiled executor, or None where the Python kernels run (chosen once)."""
        if self._executor is None:
            module = compiled_module()
            self._executor = (None if module is None else CompiledKernels(module),)
        return self._executor[0]

    def in_use(self, key: str) -> bool:
        """Whether something other than ampcore's shadow kernels gives ``key`` a meaning."""
        if key in self.tables:  # ampcore's: a shadow key it shares, or a device's own key
            return any(r.resident and r.key == key for r in self.routes.values())
        if key == "AutocastPrivateUse1" and torch._C._get_privateuse1_backend_name() != "privateuseone":
            return True  # a PrivateUse1 backend is loaded: the key is its autocast key
        return bool(torch._C._dispatch_has_backend_fallback(dispatch_key(key)))

    def route(self, device_type: str, provider: Callable[[torch.dtype], Any]) -> Route:
        found = self.routes.get(device_type)
        if found is not None:
            return found
        with LOCK:
            found = self.routes.get(device_type)
            if found is None:
                found = self._new_route(device_type, provider)
            return found

    def _new_route(self, device_type: str, provider: Callable[[torch.dtype], Any]) -> Route:
        own = dispatch_key_of(device_type)
        dispatch_key(own)  # AmpcoreError on a torch without it
        key = choose_key(own, self.in_use)
        resident = key == own
        table = self.tables.get(key) or KeyTable(key)
        self.tables[key] = table
        on_device = device_check(device_type, TENSOR_DEVICE_CHECKS.get(device_type))
        own_kernels = _kernels_on(own)  # before ampcore's kernels hide them (resident)
        own_key, backend_key = dispatch_key(own), _backend_key(device_type)
        if resident:
            self.vendor_ops[device_type] = own_kernels
            provider = _vendor_only(provider, own_kernels) if own_kernels else provider
            # kernels behave as the backend's lists while they are being registered
            table.clients = (*table.clients, Client(device_type, own_key, backend_key, on_device, provider))
        else:
            native = _torch_actions(device_type, own)
            client = Client(device_type, own_key, backend_key, on_device, None, native, own_kernels)
            # the highest-priority device key first, as the dispatcher would choose
            table.clients = tuple(sorted((*table.clients, client), key=lambda c: -int(c.key.value)))
        self._attach(table)
        if resident:  # the kernels provide the device's autocast: every overload, at once
            self._register(table, castable_overloads())
        route = Route(device_type, key, resident)
        self.routes[device_type] = route
        return route

    def _attach(self, table: KeyTable) -> None:
        """The key's fallthrough fallback (the first time) and its clients to the kernels."""
        key = table.key_name
        compiled = self._compiled()  # first: a bad AMPCORE_POLICY_KERNEL changes nothing
        if key not in self._fallbacks and not torch._C._dispatch_has_backend_fallback(dispatch_key(key)):
            # ops without a kernel pass through (torch registers no fallback for these keys)
            fallback = torch.library.Library("_", "IMPL")
            fallback.fallback(torch.library.fallthrough_kernel, key)
            self._libraries.append(fallback)
            self._fallbacks.add(key)
        if compiled is not None:
            compiled.attach(table)

    def region_entry(self, device_type: str, policy: OpPolicy | None, dtype: torch.dtype) -> tuple[Any, ...] | None:
        """``(module, arguments of its add_entry)`` for a region of ``policy`` in ``dtype``
        on ``device_type``'s shadow key under the compiled executor, else None (remembered);
        ``policy`` None: a region without a policy, where that executor was chosen already."""
        key = (device_type, policy, dtype)
        if key in self._entries:
            known: tuple[Any, ...] | None = self._entries[key]
            return known
        if policy is None and self._executor is None:
            return None  # never chosen (nor built) for a region without a policy
        compiled = self._compiled()
        found = self.routes.get(device_type)
        entry = None
        if compiled is not None and not (found.resident if found is not None else policy is not None):
            table = None if policy is None else self.tables[found.key]  # type: ignore[union-attr]
            arguments = compiled.region_entry(table, device_type, policy, dtype)
            entry = None if arguments is None else (compiled.module, arguments)
        if found is not None or policy is not None:  # else: no slot yet (-1), asked again later
            self._entries[key] = entry
        return entry

    def prepare(self, device_type: str, policy: OpPolicy) -> None:
        """Register the kernels ``policy`` needs on ``device_type``'s shadow key (once)."""
        prepared = self._prepared.get(device_type)
        if prepared is not None and policy in prepared:
            return
        with LOCK:
            prepared = self._prepared.setdefault(device_type, set())
            found = self.routes[device_type]
            if policy in prepared or found.resident:
                return
            table = self.tables[found.key]
            client = next(c for c in table.clients if c.device_type == device_type)
            policies = (policy,) if policy.inner is None else (policy, policy.inner)
            needed = [s.name for s in specs() if any(needs_kernel(s, p, client) for p in policies)]
            self._register(table, needed)
            prepared.add(policy)

    def _register(self, table: KeyTable, overloads: Iterable[str]) -> None:
        """Kernels for those of ``overloads`` that have none of ampcore's on the key yet."""
        key = table.key_name
        done = self.registered.setdefault(key, set())
        todo = [o for o in overloads if o not in done]
        if not todo:
            return
        compiled = self._compiled()
        if compiled is not None:  # the C++ kernels, all at once; the Python-routed ones below
            compiled.register(table, todo)
        library = self._library.get(key)
        if library is None:
            library = self._library[key] = torch.library.Library("aten", "IMPL")
            self._libraries.append(library)
        overload = ""
        try:
            with _quiet():
                for overload in todo:
                    if compiled is None or overload in PYTHON_ROUTED:
                        library.impl(overload, kernel(table, overload), key, with_keyset=True)
                    done.add(overload)
        except Exception as exc:
            raise AmpcoreError(
                f"ampcore could not register its policy kernel for aten::{overload} on {key}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


_registry = _Registry()


def route(device_type: str, provider: Callable[[torch.dtype], Any], policy: OpPolicy | None = None) -> Route:
    """The route of ``device_type``, set up the first time, with the kernels ``policy`` needs
    registered (thread-safe).

    ``provider`` gives the policy of the backend's O1 lists for a dtype (used when the route
    is resident).
    """
    found = _registry.route(device_type, provider)
    if policy is not None:
        _registry.prepare(device_type, policy)
    return found


def region_entry(device_type: str, policy: OpPolicy | None, dtype: torch.dtype) -> tuple[Any, ...] | None:
    """How a region of ``policy`` (None: without one) enters in one extension call (or None)."""
    return _registry.region_entry(device_type, policy, dtype)


def routes() -> dict[str, Route]:
    """The routes taken so far in this process."""
    return dict(_registry.routes)


def has_native_autocast(device_type: str) -> bool:
    """Whether ``device_type``'s own autocast key has kernels that are not ampcore's (for
    any op of its native table): ``False`` means ampcore provides its autocast."""
    found = _registry.routes.get(device_type)
    if found is not None and found.resident:
        return bool(_registry.vendor_ops.get(device_type))
    return _native_kernels(dispatch_key_of(device_type), table_name_of(device_type))


def has_own_autocast_kernel(op: str, device_type: str) -> bool:
    """Whether overload ``op`` (``"group_norm"``, ``"add.Tensor"``) has a kernel of the
    device's own (torch's, IPEX's, the vendor's) on ``device_type``'s autocast key, not
    counting ampcore's: resident kernels replace the vendor's, so there the answer is the
    vendor's registrations as ampcore found them."""
    found = _registry.routes.get(device_type)
    if found is not None and found.resident:
        return op in _registry.vendor_ops.get(device_type, frozenset())
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", dispatch_key_of(device_type)))
    except RuntimeError:  # no such overload
        return False


@functools.cache
def _native_kernels(key: str, table: str) -> bool:
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    return any(has_kernel(f"aten::{overload}", key) for overload in NATIVE_TABLES[table])


def registered_keys() -> dict[str, int]:
    """Dispatch key name -> number of ampcore kernels registered on it in this process."""
    return {key: len(done) for key, done in _registry.registered.items() if done}


def registered_overloads(key: str) -> frozenset[str]:
    """The overloads with a kernel of ampcore's on dispatch key ``key`` in this process."""
    return frozenset(_registry.registered.get(key, ()))
