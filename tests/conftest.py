"""Shared fixtures: fake adapter plugins registered in process and removed afterwards, and
the presence or absence of a CUDA GPU faked through the cuda adapter (``cuda_present``,
``cuda_absent``; ``AMPCORE_TEST_SIMULATE_CUDA=1`` fakes a GPU for every test, as a machine
with one would show it: tests that assume the absence of CUDA fail under it)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import ampcore
from ampcore import hookimpl

# level="auto" keeps measured costs on disk: never in the user's cache during tests
if "AMPCORE_AUTO_CACHE" not in os.environ:
    os.environ["AMPCORE_AUTO_CACHE"] = _AUTO_CACHE = tempfile.mkdtemp(prefix="ampcore-auto-cache-")
    atexit.register(shutil.rmtree, _AUTO_CACHE, ignore_errors=True)  # not left in /tmp


#: Set to 1: every test runs as on a machine with one CUDA GPU (see :func:`simulate_cuda`).
SIMULATE_CUDA_ENV = "AMPCORE_TEST_SIMULATE_CUDA"


def pytest_configure(config: pytest.Config) -> None:
    """Keep the acme adapter (plugins/ampcore-privateuse1) out of the test process.

    Asked whether it is available, it installs a PrivateUse1 device, and torch hosts one per
    process, for good.  Its tests (tests/plugins/test_privateuse1_device.py) use it in
    processes of their own.  (pytest also imports this file for a conformance run started
    at the repository root; that run is left alone.)
    """
    if not config.pluginmanager.has_plugin("ampcore_conformance.plugin"):
        os.environ.setdefault("AMPCORE_BLOCK_PLUGINS", "acme")


def testdevice_unsupported_reason() -> str | None:
    """Why the pure-Python PrivateUse1 test device (plugins/ampcore-testdevice) and the acme
    adapter that drives it cannot run here: not installed, or this torch cannot host the
    device (torch 2.8); None when they can."""
    for module, plugin in (("ampcore_testdevice", "ampcore-testdevice"), ("ampcore_acme", "ampcore-privateuse1")):
        if importlib.util.find_spec(module) is None:
            return f"plugins/{plugin} is not installed (python3 tasks.py setup installs it)"
    import ampcore_testdevice  # imports torch only: installs nothing

    return ampcore_testdevice.unsupported_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``testdevice`` are skipped where the test device cannot run (with the
    reason: :func:`testdevice_unsupported_reason`).

    Under :data:`SIMULATE_CUDA_ENV`, tests marked ``cuda_runtime`` are skipped: they reach
    torch's own CUDA runtime (torch.compile reads the CUDA generator once a GPU is
    reported; ``torch.autocast("cuda")`` checks the build), which a faked GPU cannot give a
    CPU build of torch.  They run on real GPU machines (``python3 tasks.py gpu``)."""
    on_device = [item for item in items if item.get_closest_marker("testdevice") is not None]
    reason = testdevice_unsupported_reason() if on_device else None
    for item in on_device if reason else []:
        item.add_marker(pytest.mark.skip(reason=reason))
    if os.environ.get(SIMULATE_CUDA_ENV) != "1":
        return
    skip = pytest.mark.skip(reason=f"reaches torch's CUDA runtime, which {SIMULATE_CUDA_ENV}=1 only fakes")
    for item in items:
        if item.get_closest_marker("cuda_runtime") is not None:
            item.add_marker(skip)


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
    spec = ampcore.BackendSpec(
        name, device_type, list(dtypes) if isinstance(dtypes, tuple) else dtypes, default_dtype, priority
    )
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


def simulate_cuda(monkeypatch: pytest.MonkeyPatch, present: bool) -> ampcore.Backend:
    """Make the ``cuda`` backend report a GPU (``present``) or none, whatever the machine has.

    Patches what the cuda adapter reads (``torch.cuda.is_available``, ``device_count``,
    ``torch.version.cuda`` for a CPU-only build) and drops ampcore's cached availability and
    device resolutions, so that ampcore asks the adapter again; ``monkeypatch`` restores
    everything.  Nothing can run on the faked GPU: tests that need to run CUDA kernels skip
    unless ``torch.cuda.is_available()`` is true of the real machine.
    """
    from ampcore._backends import backend as backend_module
    from ampcore._backends import registry
    from ampcore_backends import cuda as adapter

    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(present))
    if present:
        if torch.version.cuda is None and torch.version.hip is None:
            monkeypatch.setattr(torch.version, "cuda", "12.8")
        if not torch.cuda.is_initialized():  # a real GPU keeps its own name and properties
            monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Simulated GPU")
            props = adapter.CudaDeviceProperties("Simulated GPU", 9, 0, bf16_native=True)
            monkeypatch.setattr(adapter, "read_properties", lambda index: props)
    cuda = ampcore.get_backend("cuda")
    monkeypatch.setattr(cuda, "_reason", backend_module._MISSING)
    monkeypatch.setattr(cuda, "_capability", {})
    monkeypatch.setattr(registry._holder, "cache", {})
    return cuda


@pytest.fixture(autouse=True)
def _simulated_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``AMPCORE_TEST_SIMULATE_CUDA=1`` every test sees a CUDA GPU (faked)."""
    if os.environ.get(SIMULATE_CUDA_ENV) == "1":
        simulate_cuda(monkeypatch, present=True)


@pytest.fixture
def cuda_present(monkeypatch: pytest.MonkeyPatch) -> ampcore.Backend:
    """The cuda backend reports one GPU (faked on a machine without one)."""
    return simulate_cuda(monkeypatch, present=True)


@pytest.fixture
def cuda_absent(monkeypatch: pytest.MonkeyPatch) -> ampcore.Backend:
    """The cuda backend reports no GPU (faked on a machine with one)."""
    return simulate_cuda(monkeypatch, present=False)
