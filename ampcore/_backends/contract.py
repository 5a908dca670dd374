"""Load-time checks of a plugin against the adapter contract (:mod:`ampcore.hookspec`).

* :func:`check_contract`: the contract version the plugin declares (``AMPCORE_CONTRACT``);
* :func:`unknown_hooks`: ``ampcore_*`` functions that are no hook of this contract (hooks of
  an older contract are named with what replaced them; others get a did-you-mean hint).
"""

from __future__ import annotations

from typing import Final

from .. import hookspec as _hookspec
from .._errors import PluginError, closest
from .._version import __version__
from .contract1 import REMOVAL_VERSION

__all__ = ["SPEC_NAMES", "check_contract", "supported_text", "unknown_hooks"]

#: The hooks of the current contract.
SPEC_NAMES: Final = frozenset(
    name for name, obj in vars(_hookspec).items() if name.startswith("ampcore_") and callable(obj)
)


def _changes_since(version: int) -> str:
    return "; ".join(f"contract {n}: {text}" for n, text in sorted(_hookspec.CONTRACT_CHANGES.items()) if n > version)


def check_contract(plugin: object, name: str, distribution: str | None) -> int:
    """The contract version ``plugin`` declares, after checking this ampcore supports it.

    A plugin without ``AMPCORE_CONTRACT`` targets contract 1 (the unversioned one); contract 1
    is deprecated (:data:`ampcore.hookspec.DEPRECATED_CONTRACTS`): the loader translates such
    a plugin and warns.

    Raises:
        PluginError: the plugin targets a contract this ampcore does not load, or declares
            something other than an int; the message names the plugin, its version, the
            supported versions and what changed.

    Example::

        >>> class Plugin:
        ...     AMPCORE_CONTRACT = 2
        >>> check_contract(Plugin(), "demo", None)
        2
    """
    attribute = _hookspec.CONTRACT_ATTRIBUTE
    supported = supported_text()
    current = _hookspec.CONTRACT_VERSION
    declared = getattr(plugin, attribute, None)
    if declared is None:
        return 1  # the unversioned contract (deprecated: loaded through ampcore._backends.contract1)
    if not isinstance(declared, int) or isinstance(declared, bool):
        raise PluginError(
            name, f"{attribute} = {declared!r}; expected an int contract version such as {current}", distribution
        )
    if declared in _hookspec.SUPPORTED_CONTRACTS:
        return declared
    if declared > current:
        raise PluginError(
            name,
            f"targets adapter contract {declared} ({attribute} = {declared}), newer than this ampcore "
            f"{__version__} knows; supported contract versions: {supported}. Upgrade ampcore, or use a release of "
            f"the plugin that targets contract {current}",
            distribution,
        )
    raise PluginError(
        name,
        f"targets adapter contract {declared} ({attribute} = {declared}); supported contract "
        f"versions: {supported}. Update the plugin and declare {attribute} = {current}. What changed: "
        f"{_changes_since(declared)} (see docs/migrating-contract-1.md)",
        distribution,
    )


def supported_text() -> str:
    """The supported contract versions as messages give them, e.g. ``2 (and 1, deprecated)``.

    Example::

        >>> supported_text()
        '2 (and 1, deprecated: loaded with a warning until ampcore 0.3.0)'
    """
    current = [str(v) for v in _hookspec.SUPPORTED_CONTRACTS if v not in _hookspec.DEPRECATED_CONTRACTS]
    old = [str(v) for v in _hookspec.DEPRECATED_CONTRACTS]
    tail = f" (and {', '.join(old)}, deprecated: loaded with a warning until ampcore {REMOVAL_VERSION})" if old else ""
    return ", ".join(current) + tail


def unknown_hooks(plugin: object, contract: int = _hookspec.CONTRACT_VERSION) -> list[str]:
    """Names that look like hooks (``ampcore_*`` callables) but are no hook of this contract,
    each with what replaced it (a hook of an older contract) or a did-you-mean hint.  For a
    plugin of a deprecated ``contract`` the hooks of that contract are not unknown.

    Example::

        >>> class Plugin:
        ...     def ampcore_peak_memory(self): return 0
        >>> unknown_hooks(Plugin())
        ["ampcore_peak_memory (merged into ampcore_memory (its 'peak' key) in contract 2)"]
    """
    problems = []
    for attr in dir(plugin):
        if not attr.startswith("ampcore_") or attr in SPEC_NAMES:
            continue
        if callable(getattr(plugin, attr, None)):
            removed = _hookspec.REMOVED_HOOKS.get(attr)
            if removed is not None and contract in _hookspec.DEPRECATED_CONTRACTS:
                continue
            if removed is not None:
                problems.append(f"{attr} ({removed})")
                continue
            hint = closest(attr, SPEC_NAMES, n=1)
            problems.append(f"{attr}" + (f" (did you mean {hint[0]}?)" if hint else ""))
    return problems
