"""Issue 27: the compiled settled path of ``level="auto"`` root calls (``_auto/_kernel.py``,
``roots_kernel.cpp``): the calls it takes run no Python hook, every other call goes the
Python way, with the same results; its choice (``AMPCORE_AUTO_KERNEL``) and its background
build; torch.compile traces the Python hooks in its place.

The settled-path tests (test_auto_settled_path.py, test_auto_region_cost.py) run once per
path (the ``settled_path`` fixture)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, compiled_in_use  # noqa: F401 (fixture)
from test_auto_programs import Net, _plan
from torch import nn

import ampcore
from ampcore._auto import _kernel, _program, _roots, _roots_kernel

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

_PY_HOOKS = ("_sentinel", "_root_post")


def _step(net: nn.Module, *args: Any, **kwargs: Any) -> Any:
    with ampcore.autocast("cpu", level="auto"):  # one place in the code
        return net(*args, **kwargs)


def _python_hooks(run: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """``run()`` and how often the Python sentinel and root post-hook ran in it."""
    counts = dict.fromkeys(_PY_HOOKS, 0)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in counts and frame.f_globals is vars(_roots):
            counts[frame.f_code.co_name] += 1

    sys.setprofile(profile)
    try:
        out = run()
    finally:
        sys.setprofile(None)
    return out, counts


def _settled_float32() -> tuple[Net, torch.Tensor, torch.Tensor]:
    net, x, y = Net(big=0, small=3), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="fp32", small="fp32")
    for _ in range(3):
        _step(net, x, y)
    return net, x, y


@pytest.fixture
def compiled(auto_state: None) -> Iterator[None]:  # noqa: F811 (the fixture's name)
    if not compiled_in_use():
        pytest.skip(f"the compiled settled path is not in use in this run: {_kernel.describe()}")
    yield


def _clean(net: nn.Module) -> bool:
    hooked = any(m._forward_pre_hooks or m._forward_hooks or m._forward_pre_hooks_with_kwargs for m in net.modules())
    return not hooked and _program.local.run is None and not torch.nn.modules.module._global_forward_pre_hooks


@pytest.mark.usefixtures("compiled")
def test_a_settled_float32_call_runs_no_python_hook_and_the_same_as_the_python_path() -> None:
    net, x, y = _settled_float32()
    out, counts = _python_hooks(lambda: _step(net, x, y))
    assert counts == {"_sentinel": 0, "_root_post": 0} and _clean(net)
    assert net.small_dtypes() == {torch.float32} and torch.is_autocast_enabled("cpu") is False
    _roots_kernel.use_python()
    try:
        reference, counts = _python_hooks(lambda: _step(net, x, y))
    finally:
        _kernel.start(_roots_kernel.use_compiled)
        _roots_kernel.use_compiled(_kernel._state.module)
    assert counts == {"_sentinel": 1, "_root_post": 1}
    assert all(torch.equal(a, b) for a, b in zip(out, reference, strict=True))


def _loose(net: Net, x: torch.Tensor, y: torch.Tensor) -> tuple[Any, ...]:
    net.__dict__["_ampcore_auto_loose"] = {}  # any loose patterns: the Python guard decides
    return (x, y)


@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize(
    "call",
    [
        lambda net, x, y: ((x, y), {"flag": None}),  # keyword arguments
        lambda net, x, y: ((x, [y][0] + 0), {}),  # the same signature: taken
        lambda net, x, y: ((x, y.bfloat16()), {}),  # another dtype
        lambda net, x, y: ((x, y[:2]), {}),  # another shape
        lambda net, x, y: (_loose(net, x, y), {}),
    ],
    ids=["kwargs", "same", "dtype", "shape", "loose"],
)
def test_every_other_call_goes_to_the_python_sentinel_once(call: Callable[..., Any]) -> None:
    net, x, y = _settled_float32()
    args, kwargs = call(net, x, y)
    if kwargs:
        net.forward = lambda x, y, flag=None: Net.forward(net, x, y)  # type: ignore[method-assign]
    _, counts = _python_hooks(lambda: _step(net, *args, **kwargs))
    taken = (
        kwargs == {}
        and args[1].shape == y.shape
        and args[1].dtype == y.dtype
        and "_ampcore_auto_loose" not in vars(net)
    )
    assert counts["_sentinel"] == (0 if taken else 1) and _clean(net)


@pytest.mark.usefixtures("compiled")
def test_eval_mode_grad_mode_and_an_exception_in_the_forward() -> None:
    net, x, y = _settled_float32()
    net.eval()
    _, counts = _python_hooks(lambda: _step(net, x, y))
    assert counts["_sentinel"] == 1  # another signature ("eval")
    for _ in range(3):
        _step(net, x, y)
    with torch.no_grad():
        _, counts = _python_hooks(lambda: _step(net, x, y))
    assert counts["_sentinel"] == 1  # grad mode is part of the signature
    for _ in range(3):
        _step(net, x, y)
    _, counts = _python_hooks(lambda: _step(net, x, y))
    assert counts["_sentinel"] == 0
    net.small[0].register_forward_hook(lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        _step(net, x, y)
    net.small[0]._forward_hooks.clear()
    assert _clean(net) and torch.is_autocast_enabled("cpu") is False  # the post-hook ran (always_call)


@pytest.mark.usefixtures("compiled")
def test_threads_run_their_own_settled_calls() -> None:
    nets = [Net(big=0, small=2) for _ in range(2)]
    x, y = torch.randn(4, 32), torch.randn(4, 8)
    _plan(nets[0], x, y, big="fp32", small="fp32")
    errors: list[BaseException] = []

    def work(net: Net) -> None:
        try:
            for _ in range(40):
                out = _step(net, x, y)
                assert out[1].dtype == torch.float32 and _program.local.run is None
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(net,)) for net in nets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and all(_clean(net) for net in nets)


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """A process that has not chosen its settled path yet; what ``ready`` was given."""
    monkeypatch.setattr(_kernel, "_state", _kernel._State())
    given: list[Any] = []
    yield given


def test_the_background_build_leaves_the_python_path_until_it_is_ready(
    fresh_choice: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_kernel.ENV, "auto")
    monkeypatch.setattr(_kernel, "missing_tools", lambda: None)
    release, module = threading.Event(), ModuleType("fake")
    monkeypatch.setattr(_kernel, "_build", lambda: release.wait(30) and module)
    _kernel.start(fresh_choice.append)  # returns at once: the first region does not wait
    assert fresh_choice == [] and _kernel.describe().startswith("python until")
    release.set()
    _kernel.wait()
    assert fresh_choice == [module] and _kernel.describe().startswith("compiled")


@pytest.mark.parametrize("wanted", ["auto", "compiled"])
def test_a_failed_build_keeps_the_python_path_or_raises_when_compiled_was_asked(
    fresh_choice: list[Any], monkeypatch: pytest.MonkeyPatch, wanted: str
) -> None:
    monkeypatch.setenv(_kernel.ENV, wanted)
    monkeypatch.setattr(_kernel, "missing_tools", lambda: None)

    def broken() -> ModuleType:
        raise RuntimeError("c++: error")

    monkeypatch.setattr(_kernel, "_build", broken)
    if wanted == "compiled":
        with pytest.raises(ampcore.AmpcoreError, match="AMPCORE_AUTO_KERNEL=compiled.*c\\+\\+: error"):
            _kernel.start(fresh_choice.append)
        return
    _kernel.start(fresh_choice.append)
    _kernel.wait()
    assert fresh_choice == [] and "the build failed: RuntimeError: c++: error" in _kernel.describe()


def test_the_choice_is_validated_and_python_builds_nothing(
    fresh_choice: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_kernel.ENV, "fast")
    with pytest.raises(ampcore.AmpcoreError, match="expected one of auto, compiled, python"):
        _kernel.start(fresh_choice.append)
    monkeypatch.setenv(_kernel.ENV, "python")
    monkeypatch.setattr(_kernel, "_build", lambda: pytest.fail("built"))
    _kernel.start(fresh_choice.append)
    assert fresh_choice == [] and _kernel.describe() == "python (AMPCORE_AUTO_KERNEL=python)"


@pytest.mark.usefixtures("compiled")
@pytest.mark.cuda_runtime  # torch.compile saves the CUDA generator's state once a GPU is reported
@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks:UserWarning")
def test_torch_compile_traces_the_python_hooks_without_a_graph_break() -> None:
    from torch._dynamo.utils import counters

    net, x, y = _settled_float32()
    compiled_net = torch.compile(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), backend="eager")
    counters.clear()
    with ampcore.autocast("cpu", level="auto"):
        out = compiled_net(y)
        net(x, y)
    assert dict(counters["graph_break"]) == {} and out.dtype == torch.bfloat16  # O1's lists
    assert _roots._hooks_now.traced is _roots._hooks_now.pre
