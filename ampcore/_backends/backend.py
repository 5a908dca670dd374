"""``Backend``: what one adapter plugin says about its backend, read once and cached."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, final

import pluggy
import torch

from .._dtypes import dtype_name, parse_dtype
from .._errors import AmpcoreError, AmpcoreWarning, BackendUnavailableError, PluginError, warn_user
from .._forklock import LOCK
from .answers import ADJUSTMENT_KEYS, read_adjustments, read_identity
from .capability import CapabilityIssue
from .checks import device_type_problem, indexed_device, privateuse1_name, result_problem, torch_knows
from .importing import ImportTimeout, call_bounded, import_timeout

__all__ = ["ADJUSTMENT_KEYS", "Backend", "dtype_name", "origin"]

_MISSING: Final = object()


def origin(distribution: str | None) -> str:
    """How messages name where a plugin comes from: ``distribution "x"``, or that it was
    registered in process (no distribution).

    Example::

        >>> origin("ampcore"), origin(None)
        ('distribution "ampcore"', 'registered in process')
    """
    return f'distribution "{distribution}"' if distribution else "registered in process"


class _BrokenBackendError(BackendUnavailableError, PluginError):
    """An unavailable backend whose plugin broke the contract: both errors at once."""


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _plugin_hook(pm: pluggy.PluginManager, plugin: object, hook: str) -> Callable[..., Any] | None:
    """The implementation of ``hook`` that ``plugin`` itself provides, as a function taking
    the hook's arguments by keyword, or None.

    pluggy's ``pm.hook.<name>(...)`` broadcasts a call to every registered plugin; ampcore
    asks one plugin about its own backend, so it calls that plugin's ``HookImpl`` directly.
    pluggy has validated the implementation against the spec at ``register`` time and
    recorded which of the spec's parameters it accepts (``HookImpl.argnames``); the call
    passes exactly those, by name, as pluggy's own caller does.
    """
    caller = getattr(pm.hook, hook, None)
    if caller is None:
        return None
    impl = next((i for i in caller.get_hookimpls() if i.plugin is plugin), None)
    if impl is None:
        return None
    function, argnames = impl.function, impl.argnames
    return lambda **kwargs: function(**{name: kwargs[name] for name in argnames})


@final
class Backend:
    """A backend as described by its adapter plugin.

    Identity (name, device type, dtypes, priority) is read when the plugin is registered;
    availability, device names and capability findings are read lazily and cached.
    Obtain instances with :func:`ampcore.get_backend` or :func:`ampcore.list_backends`.

    Example::

        >>> import ampcore, torch
        >>> cpu = ampcore.get_backend("cpu")
        >>> cpu.device_type, cpu.default_dtype
        ('cpu', torch.bfloat16)
    """

    def __init__(
        self,
        pm: pluggy.PluginManager,
        plugin: object,
        plugin_name: str,
        distribution: str | None = None,
        version: str | None = None,
        on_broken: Callable[[str], None] | None = None,
    ) -> None:
        self._pm = pm
        self._plugin = plugin
        self.plugin_name = plugin_name
        self.distribution = distribution
        self.version = version
        self._lock = LOCK  # fork-safe: adapter hooks may hold device-runtime locks
        self._hooks: dict[str, Callable[..., Any] | None] = {}
        self._reason: object = _MISSING
        self._capability: dict[tuple[int, torch.dtype], tuple[CapabilityIssue, ...]] = {}
        self._warned: set[tuple[int, torch.dtype, str]] = set()
        self._adjustments: dict[torch.dtype, dict[str, frozenset[str]]] = {}
        self._loss_scaling: dict[torch.dtype, bool] = {}
        self._on_broken: Callable[[str], None] | None = None  # at load, errors fail the load
        #: why the plugin broke the adapter contract in a lazily called hook (None: it did not)
        self.contract_error: str | None = None
        self._validate_and_describe()
        self._validate_dtype_hooks()
        self._on_broken = on_broken

    # -- identity --------------------------------------------------------------------
    def _hook(self, name: str) -> Callable[..., Any] | None:
        try:
            return self._hooks[name]
        except KeyError:
            hook = self._hooks[name] = _plugin_hook(self._pm, self._plugin, name)
            return hook

    def _call(self, name: str, default: Any = _MISSING, **kwargs: Any) -> Any:
        hook = self._hook(name)
        if hook is None:
            if default is _MISSING:
                raise self._error(
                    f"does not implement the required hook {name}(); an adapter plugin must implement "
                    "ampcore_backend() with @ampcore.hookimpl, returning an ampcore.BackendSpec"
                )
            return default
        return self._guarded(name, hook, **kwargs)

    def _guarded(self, name: str, hook: Callable[..., Any], **kwargs: Any) -> Any:
        """Call the plugin's ``hook``: a ``device`` argument always carries an index; an
        exception becomes a :class:`PluginError` naming the hook and the plugin; a result of
        the wrong class breaks the contract (the plugin is reported as failed)."""
        if "device" in kwargs:
            kwargs["device"] = indexed_device(kwargs["device"])
        try:
            result = hook(**kwargs)
        except AmpcoreError:
            raise
        except SystemExit as exc:  # a hook calling exit() must not end the user's program
            raise self._broken(f"{name}() called sys.exit({exc.code!r})") from None
        except Exception as exc:
            raise self._error(f"{name}() raised {type(exc).__name__}: {exc}") from exc
        problem = result_problem(name, result)
        if problem is not None:
            raise self._broken(f"{name}() {problem}")
        return result

    def _error(self, message: str) -> AmpcoreError:
        return PluginError(self.plugin_name, message, self.distribution)

    def _broken(self, message: str) -> PluginError:
        """Record that a lazily called hook broke the contract (the plugin is then reported
        as failed) and return the error to raise."""
        if self.contract_error is None and self._on_broken is not None:
            self.contract_error = message
            self._on_broken(message)
        return PluginError(self.plugin_name, message, self.distribution)

    def _validate_and_describe(self) -> None:
        """Read who the backend is from ``ampcore_backend()`` (checked: :mod:`.answers`)."""
        identity = read_identity(self._call("ampcore_backend"), self._error)
        self.name: str = identity.name
        self.device_type: str = identity.device_type
        self.supported_dtypes: tuple[torch.dtype, ...] = identity.supported_dtypes
        self.default_dtype: torch.dtype = identity.default_dtype
        self.priority: int = identity.priority
        #: elements per chunk of O2's master-weight updates; None: whole tensors (BackendSpec)
        self.master_update_chunk_elements: int | None = identity.master_update_chunk_elements
        #: fused O2 updates may run the one-pass CPU kernel (BackendSpec)
        self.master_update_onepass: bool = identity.master_update_onepass

    def _validate_dtype_hooks(self) -> None:
        """Ask every dtype-dependent hook once per supported dtype, now, so that a plugin
        returning the wrong type fails at load (and is skipped) instead of in a region."""
        for dtype in self.supported_dtypes:
            value = self._call("ampcore_needs_loss_scaling", default=dtype == torch.float16, dtype=dtype)
            if not _is_bool(value):
                raise self._error(f"ampcore_needs_loss_scaling({dtype}) returned {value!r}; expected True or False")
            self._loss_scaling[dtype] = value
            self._adjustments[dtype] = self._validated_adjustments(dtype)

    def _validated_adjustments(self, dtype: torch.dtype) -> dict[str, frozenset[str]]:
        raw = self._call("ampcore_op_list_adjustments", default=None, dtype=dtype)
        return read_adjustments(raw, f"ampcore_op_list_adjustments({dtype})", self._error)

    def __repr__(self) -> str:
        return (
            f"Backend(name={self.name!r}, device_type={self.device_type!r}, "
            f"dtypes={[dtype_name(d) for d in self.supported_dtypes]}, "
            f"plugin={self.plugin_name!r}, distribution={self.distribution!r})"
        )

    # -- availability ----------------------------------------------------------------
    @property
    def unavailable_reason(self) -> str | None:
        """Why the backend cannot run here, or ``None`` when it can (cached)."""
        if self._reason is _MISSING:
            with self._lock:
                if self._reason is _MISSING:
                    try:
                        reason = self._probe_availability()
                    except ImportTimeout as exc:  # a probe that never answers: as a hung import
                        self._broken(f"ampcore_unavailable_reason(): {exc}")
                        reason = f"the availability check did not answer: {exc}"
                    except AmpcoreError as exc:  # a broken probe means unavailable
                        reason = f"the availability check failed: {str(exc).split(': ', 1)[-1]}"
                    if reason is not None and (not isinstance(reason, str) or not reason.strip()):
                        message = (
                            f"ampcore_unavailable_reason() returned {reason!r}; expected None (available) "
                            "or a str saying why the backend cannot run"
                        )
                        self._broken(message)
                        reason = f"the plugin broke the adapter contract: {message}"
                    if reason is None:
                        reason = self._device_type_reason()
                    self._reason = reason
        return self._reason  # type: ignore[return-value]

    def _probe_availability(self) -> object:
        """The adapter's ``ampcore_unavailable_reason()``, waited for at most
        ``AMPCORE_PLUGIN_IMPORT_TIMEOUT`` (the probe talks to the vendor's runtime, which may
        never answer; :mod:`.importing` says what a bounded call can and cannot do)."""
        if self._hook("ampcore_unavailable_reason") is None:
            return None
        return call_bounded(
            lambda: self._call("ampcore_unavailable_reason", default=None),
            import_timeout(os.environ),
            f"availability {self.name}",
            doing="its availability check (ampcore_unavailable_reason)",
        )

    def _device_type_reason(self) -> str | None:
        """An available backend must drive a device type torch knows by now."""
        knows = torch_knows(self.device_type)
        problem = device_type_problem(self.device_type, knows, privateuse1_name(), available=True)
        if problem is None:
            return None
        message = f"ampcore_backend() gave {problem}"
        self._broken(message)
        return f"the plugin broke the adapter contract: {message}"

    @property
    def is_available(self) -> bool:
        """Whether the backend can run here."""
        return self.unavailable_reason is None

    def require_available(self) -> None:
        """Raise :class:`BackendUnavailableError` with the adapter's reason if unavailable."""
        reason = self.unavailable_reason
        if reason is not None and self.contract_error is not None:
            message = f'backend "{self.name}" is unavailable: {reason}'
            raise _BrokenBackendError(self.plugin_name, message, self.distribution)
        if reason is not None:
            where = origin(self.distribution)
            raise BackendUnavailableError(f'backend "{self.name}" ({where}) is unavailable: {reason}')

    def device_count(self) -> int:
        """Number of visible devices (adapter hook; 1 by default)."""
        self.require_available()
        count = self._call("ampcore_device_count", default=1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise self._broken(f"ampcore_device_count() returned {count!r}; expected an int >= 0")
        return count

    def device_name(self, device_index: int = 0) -> str:
        """Human-readable device name (adapter hook; the device type by default)."""
        self.require_available()
        name = self._call("ampcore_device_name", default=self.device_type, device_index=device_index)
        if not isinstance(name, str):
            raise self._broken(f"ampcore_device_name({device_index}) returned {name!r}; expected a str")
        return name

    # -- dtype questions --------------------------------------------------------------
    def needs_loss_scaling(self, dtype: torch.dtype) -> bool:
        """Whether ``dtype`` gradients need loss scaling on this backend (read at load)."""
        cached = self._loss_scaling.get(dtype)
        return dtype == torch.float16 if cached is None else cached

    def check_dtype(self, dtype: torch.dtype | str | None, call: str = "ampcore.autocast") -> torch.dtype:
        """Return ``dtype`` (a ``torch.dtype`` or a name such as ``"bf16"``; ``None`` for the
        default) after checking the backend supports it."""
        if dtype is None:
            return self.default_dtype
        dtype = parse_dtype(dtype, call)
        if dtype not in self.supported_dtypes:
            raise AmpcoreError(
                f'{call}(device="{self.name}", dtype={dtype}): backend "{self.name}" does not '
                f"support {dtype}; supported dtypes: "
                f"{', '.join('torch.' + dtype_name(d) for d in self.supported_dtypes)}"
            )
        return dtype

    def capability_issues(self, dtype: torch.dtype, device_index: int = 0) -> tuple[CapabilityIssue, ...]:
        """The adapter's findings for ``dtype`` on ``device_index`` (cached)."""
        key = (device_index, dtype)
        issues = self._capability.get(key)
        if issues is None:
            self.require_available()
            found = self._call("ampcore_check_capability", default=(), dtype=dtype, device_index=device_index)
            if found is not None and (isinstance(found, (str, bytes, Mapping)) or not isinstance(found, Iterable)):
                raise self._broken(
                    f"ampcore_check_capability({dtype}, {device_index}) returned {found!r}; expected a "
                    "list of ampcore.CapabilityIssue"
                )
            issues = tuple(found or ())
            for issue in issues:
                if not isinstance(issue, CapabilityIssue):
                    raise self._broken(
                        f"ampcore_check_capability({dtype}, {device_index}) yielded {issue!r}; expected "
                        "ampcore.CapabilityIssue"
                    )
            self._capability[key] = issues
        return issues

    def enforce_capability(self, dtype: torch.dtype, device_index: int = 0) -> None:
        """Raise on error findings; warn once per (device, dtype, message) on warnings (pointing
        at the user's call, however deep in ampcore this runs)."""
        for issue in self.capability_issues(dtype, device_index):
            if issue.severity == "error":
                raise AmpcoreError(
                    f'backend "{self.name}" cannot run {dtype} on {self.device_type}:{device_index}: {issue.message}'
                )
            key = (device_index, dtype, issue.message)
            if key not in self._warned:
                self._warned.add(key)
                warn_user(issue.message, AmpcoreWarning)

    def op_list_adjustments(self, dtype: torch.dtype) -> Mapping[str, frozenset[str]]:
        """The adapter's op-list changes for ``dtype`` (``{"white"|"black"|"promote": ops}``,
        canonical op names), validated when the plugin was loaded."""
        cached = self._adjustments.get(dtype)
        if cached is None:
            cached = self._adjustments[dtype] = self._validated_adjustments(dtype)
        return cached

    def broken(self, message: str) -> PluginError:
        """For core subsystems that check a hook's answer: record that the plugin broke the
        contract (it is reported as failed) and return the :class:`PluginError` to raise."""
        return self._broken(message)

    def hook(self, name: str) -> Callable[..., Any] | None:
        """This plugin's implementation of an optional hook, or None (for core subsystems).

        The function returned takes the hook's arguments by keyword and checks the call as
        the core's own calls are checked: a ``device`` is given with its index, an exception
        is raised as a :class:`PluginError` naming the hook and the plugin, a result of the
        wrong class marks the plugin failed.
        """
        hook = self._hook(name)
        return None if hook is None else functools.partial(self._guarded, name, hook)
