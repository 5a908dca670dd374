"""Shared fixtures: fake adapter plugins registered in process and removed afterwards."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import ampcore
from ampcore import hookimpl

# level="auto" keeps measured costs on disk: never in the user's cache during tests
os.environ.setdefault("AMPCORE_AUTO_CACHE", tempfile.mkdtemp(prefix="ampcore-auto-cache-"))


def pytest_configure(config: pytest.Config) -> None:
    """Keep the acme adapter (plugins/ampcore-privateuse1) out of the test process.

    Asked whether it is available, it installs a PrivateUse1 device, and torch hosts one per
    process, for good.  Its tests (tests/plugins/test_privateuse1_device.py) use it in
    processes of their own.  (pytest also imports this file for a conformance run started
    at the repository root; that run is left alone.)
    """
    if not config.pluginmanager.has_plugin("ampcore_conformance.plugin"):
        os.environ.setdefault("AMPCORE_BLOCK_PLUGINS", "acme")


def make_adapter(
    name: str,
    device_type: str = "cpu",
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
    default_dtype: torch.dtype | None = None,
    priority: int = 50,
    **hooks: Any,
) -> object:
    """A plugin object targeting the current contract: ``ampcore_backend`` (a BackendSpec of
    the arguments) plus any optional ``ampcore_*`` hooks given as keyword arguments
    (functions taking the hook's parameters by name)."""
    spec = ampcore.BackendSpec(name, device_type, list(dtypes) if isinstance(dtypes, tuple) else dtypes, default_dtype, priority)
    namespace: dict[str, Any] = {
        "AMPCORE_CONTRACT": ampcore.hookspec.CONTRACT_VERSION,
        "ampcore_backend": hookimpl(lambda self: spec),
    }
    for hook, function in hooks.items():
        namespace[hook] = hookimpl(_method(function))
    return type(f"Adapter_{name}", (), namespace)()


def _method(function: Callable[..., Any]) -> Callable[..., Any]:
    import inspect

    params = list(inspect.signature(function).parameters)
    # pluggy reads argument names from the signature: rebuild one with ``self`` first.
    source = f"def hook(self, {', '.join(params)}):\n    return function({', '.join(params)})"
    scope: dict[str, Any] = {"function": function}
    exec(source, scope)  # noqa: S102 - building a signature pluggy can introspect
    return scope["hook"]


@pytest.fixture
def register() -> Iterator[Callable[..., ampcore.Backend]]:
    """Register plugins for one test: ``register(plugin, name=...)``; unregistered after."""
    names: list[str] = []

    def _register(plugin: object, name: str | None = None) -> ampcore.Backend:
        backend = ampcore.register_plugin(plugin, name=name)
        names.append(name or backend.plugin_name)
        return backend

    yield _register
    for name in names:
        ampcore.unregister_plugin(name)


@pytest.fixture
def no_emulation_warning() -> Iterator[None]:
    """Silence the CPU adapter's 'runs emulated' warning (fp16 on CPUs without AVX512-FP16)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*runs emulated.*", category=ampcore.AmpcoreWarning)
        yield
