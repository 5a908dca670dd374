"""Where a plugin comes from and why it failed: small helpers of the plugin manager."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
from collections.abc import Iterable, Mapping
from typing import Final

from .._errors import PluginError

__all__ = [
    "NOT_PLUGINS",
    "describe_failure",
    "env_list",
    "load_entry_point",
    "module_file",
    "origin_of_entry_point",
    "plugin_file",
    "unique_entry_points",
]


def env_list(environ: Mapping[str, str], key: str) -> list[str]:
    return [item.strip() for item in environ.get(key, "").split(",") if item.strip()]


def plugin_file(plugin: object) -> str | None:
    try:
        return inspect.getsourcefile(plugin if inspect.ismodule(plugin) else type(plugin))
    except (TypeError, OSError):  # built in, or defined where there is no source (``python -c``)
        return None


def module_file(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module.split(":")[0])
    except Exception:  # the module itself may be what fails to import
        return None
    return spec.origin if spec is not None else None


#: Values that cannot be plugins (``register_plugin(None)`` and the like).
NOT_PLUGINS: Final = (type(None), str, bytes, int, float, complex, list, tuple, dict, set, frozenset)


def describe_failure(exc: BaseException) -> str:
    """One line saying why a plugin failed to load."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): the plugin called sys.exit() or exit() while loading"
    if isinstance(exc, PluginError):
        return str(exc).split(": ", 1)[-1]
    return f"{type(exc).__name__}: {exc}"


def origin_of_entry_point(distribution: str | None) -> str:
    return f'distribution "{distribution}"' if distribution else "no distribution"


def unique_entry_points(
    entry_points: Iterable[importlib.metadata.EntryPoint],
) -> list[tuple[str, importlib.metadata.EntryPoint]]:
    """The entry points, each once (a distribution found twice on ``sys.path`` counts once),
    with a unique plugin name: the entry-point name, or ``distribution:name`` when entry
    points of several distributions share the name."""
    seen: set[tuple[str, str]] = set()
    unique = []
    for ep in entry_points:
        if (ep.name, ep.value) not in seen:
            seen.add((ep.name, ep.value))
            unique.append(ep)
    dists: dict[str, set[str | None]] = {}
    for ep in unique:
        dists.setdefault(ep.name, set()).add(ep.dist.name if ep.dist is not None else None)
    named = []
    for ep in unique:
        dist = ep.dist.name if ep.dist is not None else None
        named.append((f"{dist}:{ep.name}" if len(dists[ep.name]) > 1 and dist else ep.name, ep))
    return named


def load_entry_point(ep: importlib.metadata.EntryPoint) -> object:
    """``ep.load()``, with a readable error for a malformed value (importlib's own is an
    ``AttributeError`` about ``None``)."""
    value = getattr(ep, "value", None)
    if isinstance(value, str) and importlib.metadata.EntryPoint.pattern.match(value) is None:
        raise ImportError(f"the entry point's value {value!r} is no 'module' or 'module:attribute'")
    return ep.load()
