"""The deprecation window of adapter contract 1: its plugins load through a translation layer.

A plugin that declares no ``AMPCORE_CONTRACT`` (or ``AMPCORE_CONTRACT = 1``) targets the
unversioned contract of ampcore 0.1.x.  Until ampcore 0.3.0 it still loads: :func:`adapt`
builds a contract-2 plugin from it (a module object) and the loader warns once, naming each
hook to change (:func:`migration_notes`; docs/migrating-contract-1.md has the whole mapping).

* the five identity hooks become one ``ampcore_backend`` returning a ``BackendSpec``;
* the four memory hooks become one ``ampcore_memory``;
* ``ampcore_backend_overrides`` is not needed: a plugin replaces the first-party adapter of
  its backend name without it (docs/plugins.md, "Two plugins, one backend name");
* ``ampcore_unscale_grads_`` and ``ampcore_keep_norm_fp32`` are no longer asked: the scaler
  unscales with torch's fused kernel or its portable one, and O2 keeps norms in float32 for
  float16 only unless the user passes ``decorate(keep_norm_fp32=...)``;
* every other hook is unchanged and passed through as it is.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any, Final

from .. import hookspec as _hookspec
from .._errors import PluginError, PluginWarning, warn_at
from ..hookspec import BackendSpec, hookimpl
from .sources import plugin_file

__all__ = ["IDENTITY_HOOKS", "MEMORY_HOOKS", "REMOVAL_VERSION", "adapt", "migration_notes", "warn_deprecated"]

#: The ampcore release that stops loading contract-1 plugins.
REMOVAL_VERSION: Final = "0.3.0"
#: contract-1 identity hooks -> the ``BackendSpec`` field each fills (the first three required).
IDENTITY_HOOKS: Final = {
    "ampcore_backend_name": "name",
    "ampcore_device_type": "device_type",
    "ampcore_supported_dtypes": "dtypes",
    "ampcore_default_dtype": "default_dtype",
    "ampcore_backend_priority": "priority",
}
_REQUIRED: Final = ("ampcore_backend_name", "ampcore_device_type", "ampcore_supported_dtypes")
#: contract-1 memory hooks -> the ``ampcore_memory`` key each answers (None: the reset).
MEMORY_HOOKS: Final = {
    "ampcore_memory_in_use": "in_use",
    "ampcore_peak_memory": "peak",
    "ampcore_device_memory": "total",
    "ampcore_reset_peak_memory": None,
}


def _hooks_of(plugin: object) -> dict[str, Callable[..., Any]]:
    found = {}
    for attr in dir(plugin):
        if attr.startswith("ampcore_"):
            value = getattr(plugin, attr, None)
            if callable(value):
                found[attr] = value
    return found


def _call(function: Callable[..., Any], **kwargs: Any) -> Any:
    """Call a contract-1 hook with the parameters it accepts (it may take a subset)."""
    try:
        accepted = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return function(**kwargs)
    return function(**{k: v for k, v in kwargs.items() if k in accepted})


def migration_notes(plugin: object) -> list[str]:
    """One line per contract-1 hook ``plugin`` implements, saying what to change it to.

    Example::

        >>> class Old:
        ...     def ampcore_backend_name(self): return "old"
        ...     def ampcore_peak_memory(self, device_index): return 0
        >>> migration_notes(Old())  # doctest: +NORMALIZE_WHITESPACE
        ['ampcore_backend_name: merged into ampcore_backend (BackendSpec.name) in contract 2',
         "ampcore_peak_memory: merged into ampcore_memory (its 'peak' key) in contract 2"]
    """
    hooks = _hooks_of(plugin)
    return [f"{name}: {_hookspec.REMOVED_HOOKS[name]}" for name in sorted(hooks) if name in _hookspec.REMOVED_HOOKS]


def adapt(plugin: object, name: str, distribution: str | None) -> types.ModuleType:
    """A contract-2 plugin that answers with ``plugin``'s contract-1 hooks.

    Raises:
        PluginError: ``plugin`` lacks one of the three hooks contract 1 required.
    """
    hooks = _hooks_of(plugin)
    missing = [hook for hook in _REQUIRED if hook not in hooks]
    if missing:
        raise PluginError(
            name,
            f"declares no {_hookspec.CONTRACT_ATTRIBUTE}, so it targets adapter contract 1, but lacks the hooks "
            f"contract 1 required: {', '.join(missing)}. Declare {_hookspec.CONTRACT_ATTRIBUTE} = "
            f"{_hookspec.CONTRACT_VERSION} and implement ampcore_backend() (docs/migrating-contract-1.md)",
            distribution,
        )
    module = types.ModuleType(f"ampcore_contract_1_{name}")
    module.__doc__ = f"The contract-1 plugin {name!r}, translated to contract {_hookspec.CONTRACT_VERSION}."
    setattr(module, _hookspec.CONTRACT_ATTRIBUTE, _hookspec.CONTRACT_VERSION)
    for hook, function in hooks.items():
        if hook not in _hookspec.REMOVED_HOOKS:
            setattr(module, hook, function)  # unchanged in contract 2; pluggy checks its marker
    module.ampcore_backend = hookimpl(lambda: _spec(hooks))  # type: ignore[attr-defined]
    if any(hook in hooks for hook in MEMORY_HOOKS):
        module.ampcore_memory = hookimpl(  # type: ignore[attr-defined]
            lambda device_index, reset_peak: _memory(hooks, device_index, reset_peak)
        )
    return module


def _spec(hooks: dict[str, Callable[..., Any]]) -> BackendSpec:
    fields: dict[str, Any] = {}
    for hook, field in IDENTITY_HOOKS.items():
        if hook in hooks:
            fields[field] = _call(hooks[hook])
    if isinstance(fields.get("dtypes"), (set, frozenset)):
        fields["dtypes"] = sorted(fields["dtypes"], key=str)
    return BackendSpec(**fields)


def _memory(hooks: dict[str, Callable[..., Any]], device_index: int, reset_peak: bool) -> dict[str, Any]:
    if reset_peak and "ampcore_reset_peak_memory" in hooks:
        _call(hooks["ampcore_reset_peak_memory"], device_index=device_index)
    answer: dict[str, Any] = {}
    for hook, key in MEMORY_HOOKS.items():
        if key is not None and hook in hooks:
            answer[key] = _call(hooks[hook], device_index=device_index)
    return answer


def warn_deprecated(plugin: object, name: str, distribution: str | None) -> None:
    """Warn once that ``plugin`` (contract 1) loaded, naming each hook to change."""
    where = f'distribution "{distribution}"' if distribution else "registered in process"
    changes = "; ".join(migration_notes(plugin)) or "none of its hooks"
    warn_at(
        f'ampcore plugin "{name}" ({where}) targets adapter contract 1, deprecated: it is '
        f"loaded through a translation layer until ampcore {REMOVAL_VERSION}. Hooks to change: {changes}. "
        f"Then declare {_hookspec.CONTRACT_ATTRIBUTE} = {_hookspec.CONTRACT_VERSION} "
        "(docs/migrating-contract-1.md)",
        PluginWarning,
        plugin_file(plugin),
    )
