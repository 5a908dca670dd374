"""``Backend``: what one adapter plugin says about its backend, read once and cached."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, final

import pluggy
import torch

from ._capability import CapabilityIssue
from ._forklock import LOCK
from ._errors import AmpcoreError, AmpcoreWarning, BackendUnavailableError

__all__ = ["Backend", "dtype_name"]

_NAME_RE: Final = re.compile(r"^[a-z][a-z0-9_\-]*$")
_MISSING: Final = object()
_DEFAULT_PRIORITY: Final = 50


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def _plugin_hook(pm: pluggy.PluginManager, plugin: object, hook: str) -> Callable[..., Any] | None:
    """The implementation of ``hook`` that ``plugin`` itself provides, or None."""
    caller = getattr(pm.hook, hook, None)
    if caller is None:
        return None
    for impl in caller.get_hookimpls():
        if impl.plugin is plugin:
            function = impl.function
            argnames = impl.argnames

            def call(**kwargs: Any) -> Any:
                return function(*[kwargs[name] for name in argnames])

            return call
    return None


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
        self._validate_and_describe()

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
                raise self._error(f"does not implement the required hook {name}()")
            return default
        return hook(**kwargs)

    def _error(self, message: str) -> AmpcoreError:
        from ._errors import PluginError

        return PluginError(self.plugin_name, message, self.distribution)

    def _validate_and_describe(self) -> None:
        name = self._call("ampcore_backend_name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise self._error(
                f"ampcore_backend_name() returned {name!r}; expected a lower-case name of "
                "letters, digits, '_' or '-' (no ':'), e.g. 'cuda'"
            )
        device_type = self._call("ampcore_device_type")
        if not isinstance(device_type, str) or not device_type:
            raise self._error(f"ampcore_device_type() returned {device_type!r}; expected e.g. 'cuda'")
        dtypes = tuple(self._call("ampcore_supported_dtypes"))
        bad = [d for d in dtypes if not isinstance(d, torch.dtype) or not d.is_floating_point]
        if not dtypes or bad:
            raise self._error(
                f"ampcore_supported_dtypes() returned {list(dtypes)!r}; expected a non-empty "
                "list of floating torch dtypes such as [torch.bfloat16]"
            )
        default = self._call("ampcore_default_dtype", default=dtypes[0])
        if default not in dtypes:
            raise self._error(
                f"ampcore_default_dtype() returned {default!r}, which is not among its "
                f"supported dtypes {[dtype_name(d) for d in dtypes]}"
            )
        priority = self._call("ampcore_backend_priority", default=_DEFAULT_PRIORITY)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise self._error(f"ampcore_backend_priority() returned {priority!r}; expected an int")
        self.name: str = name
        self.device_type: str = device_type
        self.supported_dtypes: tuple[torch.dtype, ...] = dtypes
        self.default_dtype: torch.dtype = default
        self.priority: int = priority
        self.overrides: bool = bool(self._call("ampcore_backend_overrides", default=False))

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
                        reason = self._call("ampcore_unavailable_reason", default=None)
                    except Exception as exc:  # a broken availability probe means unavailable
                        reason = f"the availability check raised {type(exc).__name__}: {exc}"
                    self._reason = None if reason is None else str(reason)
        return self._reason  # type: ignore[return-value]

    @property
    def is_available(self) -> bool:
        """Whether the backend can run here."""
        return self.unavailable_reason is None

    def require_available(self) -> None:
        """Raise :class:`BackendUnavailableError` with the adapter's reason if unavailable."""
        reason = self.unavailable_reason
        if reason is not None:
            raise BackendUnavailableError(
                f'backend "{self.name}" (distribution "{self.distribution}") is unavailable: {reason}'
            )

    def device_count(self) -> int:
        """Number of visible devices (adapter hook; 1 by default)."""
        self.require_available()
        return int(self._call("ampcore_device_count", default=1))

    def device_name(self, device_index: int = 0) -> str:
        """Human-readable device name (adapter hook; the device type by default)."""
        self.require_available()
        return str(self._call("ampcore_device_name", default=self.device_type, device_index=device_index))

    # -- dtype questions --------------------------------------------------------------
    def needs_loss_scaling(self, dtype: torch.dtype) -> bool:
        """Whether ``dtype`` gradients need loss scaling on this backend."""
        return bool(self._call("ampcore_needs_loss_scaling", default=dtype == torch.float16, dtype=dtype))

    def check_dtype(self, dtype: torch.dtype | None, call: str = "ampcore.autocast") -> torch.dtype:
        """Return ``dtype`` (or the default) after checking the backend supports it."""
        if dtype is None:
            return self.default_dtype
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
            issues = tuple(found or ())
            for issue in issues:
                if not isinstance(issue, CapabilityIssue):
                    raise self._error(
                        f"ampcore_check_capability() yielded {issue!r}; expected ampcore.CapabilityIssue"
                    )
            self._capability[key] = issues
        return issues

    def enforce_capability(self, dtype: torch.dtype, device_index: int = 0, stacklevel: int = 2) -> None:
        """Raise on error findings; warn once per (device, dtype, message) on warnings."""
        for issue in self.capability_issues(dtype, device_index):
            if issue.severity == "error":
                raise AmpcoreError(f'backend "{self.name}", {dtype}: {issue.message}')
            key = (device_index, dtype, issue.message)
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(issue.message, AmpcoreWarning, stacklevel=stacklevel + 1)

    def op_list_adjustments(self, dtype: torch.dtype) -> Mapping[str, frozenset[str]]:
        """The adapter's op-list changes for ``dtype`` (``{"white"|"black"|"promote": ops}``)."""
        cached = self._adjustments.get(dtype)
        if cached is None:
            raw = self._call("ampcore_op_list_adjustments", default=None, dtype=dtype) or {}
            bad = set(raw) - {"white", "black", "promote"}
            if bad:
                raise self._error(
                    f"ampcore_op_list_adjustments() returned keys {sorted(bad)}; valid keys: "
                    "'white', 'black', 'promote'"
                )
            cached = {key: frozenset(_names(ops)) for key, ops in raw.items()}
            self._adjustments[dtype] = cached
        return cached

    def hook(self, name: str) -> Callable[..., Any] | None:
        """This plugin's implementation of an optional hook, or None (for core subsystems)."""
        return self._hook(name)


def _names(ops: Iterable[str]) -> Iterable[str]:
    if isinstance(ops, str):
        return (ops,)
    return ops
