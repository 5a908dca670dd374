"""Issue 27: a forward that, on some steps only, enters a region of its own that turns
autocast on (``torch.autocast`` in another dtype, nested, as a decorator, entered by a
submodule; ``torch.amp.custom_fwd``; ampcore regions) inside a root whose program was
recorded without it (or with it).

Before, a float32-default program (autocast off for the root's forward, its float32-decided
layers unhooked) ran those layers in the inner region's dtype where the global hooks (call
by call) run them in float32.  Each case runs its steps under ``level="auto"`` and, on a copy,
under the fixed precision the plan gives (``test_auto_sweep3.run``: outputs, gradients and
parameters equal, nothing of auto left, settled steps record nothing), for float32-default
(``wide``) and low-default (``narrow``) programs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, counting  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, FP16, _mlp, _train, _wide, run
from torch import nn

import ampcore
from ampcore._auto import _hooks, _program
from ampcore._auto._entered import casts_inputs

pytestmark = pytest.mark.usefixtures("auto_state", "budget_kept")  # tests/auto/_auto_testing.py


@pytest.fixture
def budget_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's measuring budget as it was before the test (the whole-call checks of
    these cases' mixed programs must not leave later test files without one)."""
    monkeypatch.setattr(_hooks._process, "spent_s", _hooks._process.spent_s)


@contextlib.contextmanager
def _nested(*regions: Callable[[], Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for region in regions:
            stack.enter_context(region())
        yield


#: regions a forward enters itself that turn autocast on (or switch it off conditionally)
REGIONS: dict[str, Callable[[], Any]] = {
    "torch-fp16": lambda: torch.autocast("cpu", dtype=FP16),
    "torch-bf16": lambda: torch.autocast("cpu", dtype=BF16),
    "off-then-fp16": lambda: _nested(lambda: torch.autocast("cpu", enabled=False), REGIONS["torch-fp16"]),
    "fp16-then-bf16": lambda: _nested(REGIONS["torch-fp16"], REGIONS["torch-bf16"]),
    "amp-fp16": lambda: torch.amp.autocast("cpu", dtype=FP16),
    "ampcore-O1-fp16": lambda: ampcore.autocast("cpu", level="O1", dtype=FP16),
    "ampcore-auto-fp16": lambda: ampcore.autocast("cpu", level="auto", dtype=FP16),
}

OFFS: dict[str, list[bool]] = {
    "recorded-outside": [False, True, True, False, True, False],
    "recorded-inside": [True, False, False, True, False, True],
    "first-only": [True, False, False, False],
    "first-step-outside": [False, True, False, False],
}


class Block(nn.Module):
    """Runs ``layers`` inside ``REGIONS[region]`` where ``self.off`` (state its call does not show)."""

    def __init__(self, region: str, layers: nn.Module) -> None:
        super().__init__()
        self.region, self.off, self.layers = region, False, layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.off:
            return self.layers(x)
        with REGIONS[self.region]():
            return self.layers(x.float())


class Rooted(nn.Module):
    """A root whose submodule (:class:`Block`, between two layers of the root's own) enters
    the region: ``wide`` a float32-default program, else a low-default one."""

    def __init__(self, region: str, wide: bool) -> None:
        super().__init__()
        self.first = nn.Linear(16, 16)  # fp32 in both
        self.block = Block(region, _wide() if wide else _mlp())
        self.last = nn.Linear(4, 16) if wide else nn.Linear(4, 4)  # low

    @property
    def off(self) -> bool:
        return self.block.off

    @off.setter
    def off(self, value: bool) -> None:
        self.block.off = value

    def forward(self, x: torch.Tensor) -> Any:
        return self.last(self.block(torch.relu(self.first(x))))


def _default(steps: list[bool], wide: bool) -> str | None:
    """The programs' default where recorded outside the region (the case is what it says)."""
    return None if steps[0] else "fp32" if wide else "low"


def _steps(offs: list[bool], dtype: torch.dtype) -> Any:
    def step(m: nn.Module, i: int, enter: Any) -> Any:
        m.off = offs[i]
        return _train(m, torch.randn(8, 16, generator=torch.Generator().manual_seed(i)), enter, dtype)

    return step


@pytest.mark.parametrize("wide", [False, True], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("region", list(REGIONS))
@pytest.mark.parametrize("offs", list(OFFS))
def test_a_submodule_enters_a_region_on_some_steps(region: str, wide: bool, offs: str, recordings: list[Any]) -> None:
    steps = OFFS[offs]
    dtypes = (BF16, FP16) if region == "ampcore-auto-fp16" else (BF16,)  # its own plan too
    run(
        lambda: Rooted(region, wide), _steps(steps, BF16), len(steps), recordings, dtypes, default=_default(steps, wide)
    )


@pytest.mark.parametrize("wide", [False, True], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("offs", ["recorded-outside", "recorded-inside"])
def test_a_bfloat16_region_inside_a_float16_auto_region(wide: bool, offs: str, recordings: list[Any]) -> None:
    steps = OFFS[offs]
    make = lambda: Block("torch-bf16", _wide() if wide else _mlp())  # noqa: E731
    run(make, _steps(steps, FP16), len(steps), recordings, (FP16,), default=_default(steps, wide))


class Decorated(nn.Module):
    """Its layers run through a method decorated by ``torch.autocast(..., dtype=float16)``
    where ``off``."""

    def __init__(self, wide: bool) -> None:
        super().__init__()
        self.off = False
        self.layers = _wide() if wide else _mlp()

    @torch.autocast("cpu", dtype=FP16)
    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._inner(x) if self.off else self.layers(x)


class CustomFwd(Decorated):
    """The method decorated by ``torch.amp.custom_fwd(cast_inputs=float32)`` instead: autocast
    off inside, its inputs in float32, where autocast was on."""

    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.mark.parametrize("wide", [False, True], ids=["low-default", "fp32-default"])
@pytest.mark.parametrize("how", ["torch-decorator", "custom-fwd-fp32"])
@pytest.mark.parametrize("offs", ["recorded-outside", "recorded-inside"])
def test_a_decorated_forward_on_some_steps(how: str, wide: bool, offs: str, recordings: list[Any]) -> None:
    steps = OFFS[offs]
    made = Decorated if how == "torch-decorator" else CustomFwd
    default = _default(steps, wide and made is Decorated)  # (a custom_fwd(cast_inputs=...): no float32 default)
    run(lambda: made(wide), _steps(steps, BF16), len(steps), recordings, default=default)


def test_the_watch_leaves_nothing_after_an_exception_inside_the_region() -> None:
    """An exception inside the forward's region: its hooks go with the program's."""
    model = run(lambda: Block("torch-fp16", _wide()), _steps([False, True], BF16), 2, [])
    model.off = True

    def boom(module: nn.Module, args: Any, output: Any) -> None:
        raise RuntimeError("boom")

    handle = model.layers[2].register_forward_hook(boom)
    with pytest.raises(RuntimeError, match="boom"), ampcore.autocast("cpu", level="auto", dtype=BF16):
        model(torch.randn(8, 16))
    handle.remove()
    assert _program.local.run is None and not torch.is_autocast_enabled("cpu")
    for m in model.modules():
        assert all(type(key) is int for key in m._forward_pre_hooks), f"a hook left on {m}"


def test_torch_autocast_is_its_own_outside_auto_regions() -> None:
    """The wrapper of ``torch.autocast.__enter__`` is there only while a thread is in an auto
    region (issue 27: nothing of auto outside auto regions), also after a float32-default
    program ran, and stays while another thread is still in one."""
    from torch.amp.autocast_mode import autocast as torch_autocast

    from ampcore._auto._entered import installed

    own = torch_autocast.__dict__["__enter__"]
    model = run(lambda: Block("torch-fp16", _wide()), _steps([False, True, False], BF16), 3, [])
    assert not installed() and torch_autocast.__dict__["__enter__"] is own
    seen: list[bool] = []
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            inside.set()
            leave.wait(30)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert inside.wait(30)
        with ampcore.autocast("cpu", level="auto", dtype=BF16):
            seen.append(installed())
            model(torch.randn(8, 16))
        seen.append(installed())  # the other thread is still in its region
    finally:
        leave.set()
        thread.join(30)
    assert seen == [True, True]
    assert not installed() and torch_autocast.__dict__["__enter__"] is own


class _Helper(nn.Module):
    @ampcore.custom_fwd(device="cpu", cast_inputs=torch.float32)
    def cast(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @ampcore.custom_fwd(device="cpu")
    def plain(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Plain(nn.Module):
    @torch.amp.custom_fwd(device_type="cpu")
    def plain(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_which_roots_have_a_method_that_casts_its_inputs() -> None:
    """torch's and ampcore's ``custom_fwd(cast_inputs=...)``, in a submodule: no float32 default."""
    assert casts_inputs(nn.Sequential(nn.Linear(2, 2), _Helper()))
    assert casts_inputs(CustomFwd(wide=True))
    assert not casts_inputs(nn.Sequential(nn.Linear(2, 2), _Plain()))
    assert not casts_inputs(Decorated(wide=True))


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    return counting(monkeypatch)
