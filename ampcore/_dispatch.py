"""How custom lists and levels OD/O2 reach every op call: policies and the registration of
their kernels on the autocast dispatch keys.

torch's autocast is a set of C++ kernels registered per operator on the autocast dispatch
key of a device type (``AutocastCPU``...), which sits above autograd.  ampcore overrides
kernels on that key with the Python kernels of :mod:`ampcore._kernels`, which consult the
calling thread's :class:`Policy`.  An uncustomised O1 region has no policy and registers
nothing: it is ``torch.autocast``.

Registration is process-wide, so it is reference-counted per *unit*:

* ``("native", device_type)``: every overload of the device type's native table (so that
  composite ops can be decomposed under the policy, and promote ops follow OD/O2);
* ``("generated", device_type)``: every other castable, non-composite ATen overload (levels
  OD and O2 give every op a policy; composite ops fall through to the ops they are made of);
* ``("op", device_type, overload)``: an overload named by a custom list and covered by
  neither.

A unit no region uses any more *lingers* for :attr:`_Installer.linger` seconds before it is
removed (a daemon timer sweeps it), so a training loop that enters a customised region
every step does not re-register ~130 (O1) or ~900 (OD/O2) kernels each time, and plain
``torch.autocast`` regions pay nothing once customised regions are over.  While a unit
lingers, the kernels do exactly what torch's own do (see :mod:`ampcore._kernels`).

Reaching inside composites: when a region has custom lists, an op with a
CompositeImplicitAutograd kernel (``linear``, ``matmul``, ``scaled_dot_product_attention``...)
is cast as its own action says and then *decomposed with autocast still on*, under an inner
policy in which only the custom-listed ops act and every other op merely reconciles mixed
input dtypes (torch's promote rule), as torch runs a composite's internals with autocast
off.  So ``custom_white_list={"bmm"}`` reaches the ``bmm`` inside SDPA's math path, while a
black-listed ``linear`` does not see its inner ``addmm`` cast back to low precision.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch

from ._errors import AmpcoreError
from ._kernels import kernel
from ._oplist_data import dispatch_key_of, native_table
from ._oplist_names import generated_overloads
from ._oplists import DEFAULT_ACTIONS, PROMOTE, OpLists

__all__ = ["Policy", "Unit", "acquire", "installed_units", "kernel_units", "policy_for", "release", "sweep"]

#: The warning torch gives (once per process) when a kernel overrides another.
_OVERRIDE_WARNING: Final = r"Warning only once for all operators"

#: ("native" | "generated", device type) or ("op", device type, overload).
Unit = tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Policy:
    """What each op does in a region: built once per :class:`~ampcore.OpLists`."""

    lists: OpLists
    dtype: torch.dtype
    actions: Mapping[str, str]
    default: str
    reach: bool
    units: tuple[Unit, ...]
    inner: Policy | None = None


def kernel_units(lists: OpLists) -> tuple[Unit, ...]:
    """The registrations a policy needs."""
    device_type = lists.device_type
    native = native_table(device_type)
    units: list[Unit] = [("native", device_type)]
    covered: set[str] = set(native)
    if lists.level in ("OD", "O2"):
        units.append(("generated", device_type))
        covered.update(generated_overloads())
    units += [("op", device_type, overload) for overload in sorted(lists.overloads) if overload not in covered]
    return tuple(units)


@functools.lru_cache(maxsize=512)
def _policy(lists: OpLists, _identity: int) -> Policy | None:
    if lists.is_native or lists.level == "O0":
        return None
    units = kernel_units(lists)
    explicit = {
        overload: lists.overloads[overload]
        for overload in lists.overloads
        if overload.partition(".")[0] in lists.custom_white | lists.custom_black
    }
    policy = Policy(lists, lists.dtype, dict(lists.overloads), DEFAULT_ACTIONS[lists.level], bool(explicit), units)
    if explicit:
        # inside a decomposed composite: custom-listed ops act, the others only reconcile
        # mixed input dtypes their neighbours' custom casts may cause (torch's promote rule)
        inner = Policy(lists, lists.dtype, explicit, PROMOTE, True, units)
        object.__setattr__(inner, "inner", inner)
        object.__setattr__(policy, "inner", inner)
    return policy


def policy_for(lists: OpLists) -> Policy | None:
    """The runtime policy of ``lists`` (``None`` for torch's native lists and for O0)."""
    return _policy(lists, id(lists))


# -- registration -----------------------------------------------------------------------


def _unit_overloads(unit: Unit) -> tuple[str, ...]:
    kind, device_type = unit[0], unit[1]
    native = native_table(device_type)
    if kind == "native":
        return tuple(native)
    if kind == "generated":
        return tuple(o for o in generated_overloads() if o not in native)
    return unit[2:]


class _Installer:
    """Process-wide, reference-counted registrations (one ``torch.library.Library`` per unit)."""

    def __init__(self, linger: float = 2.0) -> None:
        #: Seconds an unused unit stays registered (0: removed at once).
        self.linger = linger
        self._lock = threading.Lock()
        self._units: dict[Unit, list[torch.library.Library | int]] = {}
        self._idle: dict[Unit, float] = {}
        self._timer: threading.Timer | None = None
        self._overridden = False  # torch warns once per process; after that, no catch needed

    def acquire(self, units: tuple[Unit, ...]) -> None:
        with self._lock:
            done: list[Unit] = []
            try:
                for unit in units:
                    entry = self._units.get(unit)
                    if entry is None:
                        self._units[unit] = [self._install(unit), 1]
                    else:
                        entry[1] += 1  # type: ignore[operator]
                        self._idle.pop(unit, None)
                    done.append(unit)
            except BaseException:
                self._release(done)
                raise

    def release(self, units: tuple[Unit, ...]) -> None:
        with self._lock:
            self._release(units)

    def _release(self, units: Any) -> None:
        now = time.monotonic()
        for unit in units:
            entry = self._units[unit]
            entry[1] -= 1  # type: ignore[operator]
            if entry[1] == 0:
                self._idle[unit] = now
        if self._idle:
            if self.linger <= 0:
                self._sweep(now)
            elif self._timer is None:
                self._timer = threading.Timer(self.linger, self.sweep)
                self._timer.daemon = True
                self._timer.start()

    def sweep(self, everything: bool = False) -> None:
        """Remove the units idle for :attr:`linger` seconds (all idle ones if ``everything``)."""
        with self._lock:
            self._timer = None
            self._sweep(float("inf") if everything else time.monotonic() - self.linger)
            if self._idle and self.linger > 0:
                self._timer = threading.Timer(self.linger, self.sweep)
                self._timer.daemon = True
                self._timer.start()

    def _sweep(self, idle_before: float) -> None:
        for unit, since in list(self._idle.items()):
            if since <= idle_before:
                del self._idle[unit]
                library = self._units.pop(unit)[0]
                library._destroy()  # type: ignore[union-attr]

    def counts(self) -> dict[Unit, int]:
        with self._lock:
            return {unit: entry[1] for unit, entry in self._units.items()}  # type: ignore[misc]

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """Overriding torch's kernels is the point: silence torch's one-time warning about it
        (the filter is only installed the first time, while torch can still warn)."""
        if self._overridden:
            yield
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_OVERRIDE_WARNING, category=UserWarning)
            yield

    def _install(self, unit: Unit) -> torch.library.Library:
        device_type = unit[1]
        key_name = dispatch_key_of(device_type)
        library = torch.library.Library("aten", "IMPL")
        overload = ""
        try:
            with self._quiet():
                for overload in _unit_overloads(unit):
                    library.impl(overload, kernel(device_type, overload), key_name, with_keyset=True)
            self._overridden = True
        except Exception as exc:
            library._destroy()
            raise AmpcoreError(
                f"ampcore could not register its policy kernel for aten::{overload} on {key_name} "
                f"(device type {device_type!r}): {type(exc).__name__}: {exc}"
            ) from exc
        return library


_installer = _Installer()


def acquire(policy: Policy) -> None:
    """Register (or add a reference to) the kernels ``policy`` needs."""
    _installer.acquire(policy.units)


def release(policy: Policy) -> None:
    """Drop the references taken by :func:`acquire`; unused units linger, then go."""
    _installer.release(policy.units)


def sweep() -> None:
    """Unregister every unit no region uses, now (tests and benchmarks)."""
    _installer.sweep(everything=True)


def installed_units() -> dict[Unit, int]:
    """The registered units and their reference counts (0: lingering)."""
    return _installer.counts()
