"""Issue 27: ``level="auto"`` on model structures the benchmarks never use.

Each case runs a model under ``level="auto"`` with a plan given to ``ampcore.load_plan`` (no
timing, so the decisions are known) and compares with the *fixed precision* those decisions
give, computed independently (:func:`_fixed`: torch.autocast with each planned module call
switched by hand), for several steps: outputs and gradients equal, the dtypes the plan says,
and nothing of auto (hooks, autocast state) left behind after the region, also after an
exception inside it.  The recorded program of a root call must never replay a stale path:
control flow that changes which modules run, or at which shapes, while the root's tensor
inputs keep their shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, fixed, tiny_bert  # noqa: F401 (fixture)
from torch import nn

import ampcore
from ampcore._auto import Costs, _hooks, _program, _roots, _verify
from ampcore._auto._shapes import shape_class

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

LOW = torch.bfloat16


def _load(decisions: dict[str, str]) -> None:
    fp = ampcore.auto_plan("cpu").fingerprint
    entries = {k: {"decision": d} for k, d in decisions.items()}
    ampcore.load_plan({"format": 2, "fingerprint": fp, "entries": entries})


def _classes(module: nn.Module, *shapes: tuple[int, ...], grad: bool = True, dtypes: Any = (None, LOW)) -> list[str]:
    """The shape classes of ``module`` on inputs of ``shapes`` (float32 and bfloat16 inputs)."""
    found = []
    with torch.set_grad_enabled(grad):
        for shape in shapes:
            for dtype in dtypes:
                x = torch.zeros(shape, dtype=dtype or torch.float32)
                found.append(shape_class(module, (x,), "cpu") or "")
    return found


def _plan(pairs: list[tuple[nn.Module, tuple[int, ...], str]], grad: bool = True) -> None:
    decisions: dict[str, str] = {}
    for module, shape, decision in pairs:
        for key in _classes(module, shape, grad=grad):
            decisions[key] = decision
    _load(decisions)


def _fixed(run: Callable[[], Any]) -> Any:
    """``run()`` under torch.autocast with each planned module call in the plan's precision:
    float32 (autocast off, low inputs cast to float32) where the plan says ``fp32``."""
    with fixed_region():
        return run()


def fixed_region() -> contextlib.AbstractContextManager[None]:
    """The region of :func:`_fixed` (for code that enters regions itself)."""
    return fixed(LOW)


def _auto(run: Callable[[], Any]) -> Any:
    with ampcore.autocast("cpu", level="auto"):
        return run()


def _clean(*modules: nn.Module) -> None:
    """Nothing of auto is left: no global or instance hook, autocast off, no program running."""
    assert not _hooks.installed() and _program.local.run is None and _program.local.rec is None
    assert not torch.is_autocast_enabled("cpu") and _program.local.settled is None
    assert not nn.modules.module._global_forward_pre_hooks and not nn.modules.module._global_forward_hooks
    for root in modules:
        for m in root.modules():
            assert not m._forward_pre_hooks and not m._forward_hooks and not m._forward_pre_hooks_with_kwargs


def _flat(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flat(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _flat(v)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from _flat(getattr(value, f.name))


def _same(model: nn.Module, call: Callable[[int], Any], steps: int = 4) -> None:
    """``call(step)`` under auto equals the fixed precision for ``steps`` steps: outputs (values
    and dtypes) and the parameters' gradients; nothing left behind after each region."""
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        want = list(_flat(_fixed(lambda: call(step))))  # noqa: B023
        sum(t.float().sum() for t in want if t.requires_grad).backward() if any(t.requires_grad for t in want) else None
        want_grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        got = list(_flat(_auto(lambda: call(step))))  # noqa: B023
        _clean(model)
        sum(t.float().sum() for t in got if t.requires_grad).backward() if any(t.requires_grad for t in got) else None
        assert [t.dtype for t in got] == [t.dtype for t in want]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        grads = [None if p.grad is None else p.grad for p in model.parameters()]
        for g, w in zip(grads, want_grads, strict=True):
            assert (g is None) == (w is None)
            if g is not None:
                torch.testing.assert_close(g, w, rtol=0, atol=0)


# --- control flow: the recorded program must not replay a stale path ----------------------


class Paths(nn.Module):
    """``a`` (Linear 16->16, low) or ``b`` (Linear 16->24, fp32), then ``c`` per path."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 24)
        self.ca = nn.Linear(16, 8)
        self.cb = nn.Linear(24, 8)

    def forward(self, x: torch.Tensor, path: Any = "a") -> torch.Tensor:
        if path == "a":
            return self.ca(torch.relu(self.a(x)))
        return self.cb(torch.relu(self.b(x)))


def _paths(decision_a: str = "low", decision_b: str = "fp32") -> tuple[Paths, torch.Tensor]:
    net, x = Paths(), torch.randn(4, 16)
    _plan(
        [
            (net.a, (4, 16), decision_a),
            (net.ca, (4, 16), decision_a),
            (net.b, (4, 16), decision_b),
            (net.cb, (4, 24), decision_b),
        ]
    )
    return net, x


@pytest.mark.parametrize("default", ["low", "fp32"])
def test_a_non_tensor_argument_that_picks_the_path_is_part_of_the_guard(default: str) -> None:
    other = "fp32" if default == "low" else "low"
    net, x = _paths(default, other)
    paths = ["a", "a", "b", "a", "b", "b", "a"]
    _same(net, lambda i: net(x, paths[i]), steps=7)
    _same(net, lambda i: net(x, path=paths[-1 - i]), steps=7)


def test_a_path_picked_by_train_or_eval_is_not_replayed_stale() -> None:
    class Heads(Paths):
        def forward(self, x: torch.Tensor, path: Any = None) -> torch.Tensor:
            return super().forward(x, "a" if self.training else "b")

    net, x = Heads(), torch.randn(4, 16)
    _plan([(net.a, (4, 16), "low"), (net.ca, (4, 16), "low"), (net.b, (4, 16), "fp32"), (net.cb, (4, 24), "fp32")])
    for mode in (True, False, True, False):
        net.train(mode)
        _same(net, lambda i: net(x), steps=2)


@pytest.mark.parametrize(
    "decisions",
    [("low", "low", "fp32", "fp32"), ("fp32", "fp32", "low", "fp32"), ("fp32", "fp32", "fp32", "low")],
    ids=["low-default", "fp32-default-low-then-fp32", "fp32-default-fp32-then-low"],
)
def test_a_path_picked_by_state_the_call_does_not_show_applies_the_plan(decisions: tuple[str, ...]) -> None:
    """Random layer drop, a step counter in the module: the same signature, other modules.
    Path ``a`` is recorded first (its program's default), path ``b`` mixes the precisions."""

    class Drop(Paths):
        def __init__(self) -> None:
            super().__init__()
            self.step = 0

        def forward(self, x: torch.Tensor, path: Any = None) -> torch.Tensor:
            return super().forward(x, "a" if self.step % 3 else "b")

    net, x = Drop(), torch.randn(4, 16)
    a, ca, b, cb = decisions
    _plan([(net.a, (4, 16), a), (net.ca, (4, 16), ca), (net.b, (4, 16), b), (net.cb, (4, 24), cb)])

    def call(step: int) -> Any:
        net.step = step + 1  # a, a, b, a, a, b, ... for the reference and auto alike
        return net(x)

    _same(net, call, steps=6)


def test_tensors_inside_containers_and_dataclasses_are_part_of_the_guard() -> None:
    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        extra: dict[str, torch.Tensor]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.out = nn.Linear(16, 4)

        def forward(self, batch: Batch, more: list[tuple[torch.Tensor, None]]) -> dict[str, Any]:
            h = self.lin(batch.x) + batch.extra["bias"]
            return {"y": self.out(h), "aux": (h.sum(), more[0][0])}

    net = Net()
    # batch 4: lin fp32, out low; batch 64: lin low, out fp32
    _plan(
        [(net.lin, (4, 16), "fp32"), (net.out, (4, 16), "low"), (net.lin, (64, 16), "low"), (net.out, (64, 16), "fp32")]
    )
    sizes = [4, 64, 4, 64, 64, 4, 4, 64]

    def call(step: int) -> Any:
        n = sizes[step]
        x = torch.linspace(-1, 1, n * 16).reshape(n, 16)
        return net(Batch(x, {"bias": torch.full((16,), 0.5)}), [(torch.ones(2), None)])

    _same(net, call, steps=8)


def test_a_module_called_twice_at_different_shapes() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.lin(x).sum(0) + self.lin(y).sum(0) + self.lin(torch.relu(self.lin(x))).sum(0)

    net, x, y = Shared(), torch.randn(4, 16), torch.randn(64, 16)
    _plan([(net.lin, (4, 16), "fp32"), (net.lin, (64, 16), "low")])
    _same(net, lambda i: net(x, y))
    _plan([(net.lin, (4, 16), "low"), (net.lin, (64, 16), "low")])
    _same(net, lambda i: net(x, y), steps=2)


def test_batch_size_and_sequence_length_change_every_step() -> None:
    net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    pairs = []
    for n in (3, 8, 33, 100):
        pairs += [(net[0], (n, 16), "fp32" if n < 32 else "low"), (net[2], (n, 32), "low" if n < 32 else "fp32")]
    _plan(pairs)
    shapes = [3, 100, 8, 33, 3, 100, 8, 8, 33, 100]
    _same(net, lambda i: net(torch.ones(shapes[i], 16)), steps=10)


# --- arguments, outputs, hooks -------------------------------------------------------------


class Kw(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.small = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, flag: bool = True) -> tuple[Any, ...]:
        x = x.mul_(1.0)  # in place on the input
        h = self.lin(x)
        if mask is not None:
            h = h * mask
        return (self.small(h) if flag else h), {"h": h}


def test_kwargs_none_and_in_place_ops_on_inputs() -> None:
    net = Kw()
    _plan([(net.lin, (8, 16), "low"), (net.small, (8, 16), "fp32")])
    calls: list[dict[str, Any]] = [{}, {"mask": torch.ones(16)}, {"flag": False}, {}, {"mask": None}]
    calls += [{"mask": torch.ones(16)}, {"flag": False}]
    _same(net, lambda i: net(torch.ones(8, 16), **calls[i]), steps=7)


def test_user_hooks_with_kwargs_and_always_call_added_and_removed_between_steps() -> None:
    net = Kw()
    _plan([(net.lin, (8, 16), "low"), (net.small, (8, 16), "fp32")])
    x = torch.randn(8, 16)
    seen: list[Any] = []
    _same(net, lambda i: net(x.clone()), steps=2)
    h1 = net.register_forward_pre_hook(lambda m, a, k: (a, {**k, "flag": False}), with_kwargs=True)
    h2 = net.small.register_forward_hook(lambda m, a, o: seen.append(o.dtype), always_call=True)
    h3 = net.lin.register_forward_pre_hook(lambda m, a: (a[0] * 2,))
    for _ in range(3):
        want = _fixed(lambda: net(x.clone()))
        got = _auto(lambda: net(x.clone()))
        assert list(_flat(got))[0].dtype == list(_flat(want))[0].dtype
        torch.testing.assert_close(list(_flat(got)), list(_flat(want)), rtol=0, atol=0)
        assert not torch.is_autocast_enabled("cpu") and not _hooks.installed()
    for h in (h1, h2, h3):
        h.remove()
    _same(net, lambda i: net(x.clone()), steps=2)
    _clean(net)


def test_an_exception_inside_the_region_leaves_nothing_behind() -> None:
    class Boom(Paths):
        def forward(self, x: torch.Tensor, path: Any = "a") -> torch.Tensor:
            out = super().forward(x, path)
            if path == "boom":
                raise ValueError("boom")
            return out

    net, x = Boom(), torch.randn(4, 16)
    _plan([(net.a, (4, 16), "low"), (net.ca, (4, 16), "low"), (net.b, (4, 16), "fp32"), (net.cb, (4, 24), "fp32")])
    for path in ("a", "boom", "a", "boom", "boom"):
        if path == "boom":
            with pytest.raises(ValueError, match="boom"), ampcore.autocast("cpu", level="auto"):
                net(x, path)
        else:
            _auto(lambda: net(x, path))  # noqa: B023
        _clean(net)
    _same(net, lambda i: net(x, "a"), steps=2)


# --- modes, regions, threads ---------------------------------------------------------------


def test_no_grad_inference_mode_and_inputs_without_grad() -> None:
    net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    decisions: dict[str, str] = {}
    for grad in (True, False):
        for key in _classes(net[0], (8, 16), grad=grad):
            decisions[key] = "fp32" if grad else "low"
        for key in _classes(net[2], (8, 16), grad=grad):
            decisions[key] = "low" if grad else "fp32"
    _load(decisions)
    x = torch.randn(8, 16)
    for _ in range(2):
        _same(net, lambda i: net(x), steps=1)
        with torch.no_grad():
            _same(net, lambda i: net(x), steps=1)
        with torch.inference_mode():
            want, got = _fixed(lambda: net(x)), _auto(lambda: net(x))
            assert got.dtype == want.dtype and torch.equal(got, want)
        _same(net, lambda i: net(x.detach().requires_grad_(True)), steps=1)


def test_checkpoint_inside_the_root() -> None:
    class Ckpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
            self.head = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
            return self.head(h)

    net, x = Ckpt(), torch.randn(8, 16)
    _plan([(net.block[0], (8, 16), "fp32"), (net.block[2], (8, 16), "low"), (net.head, (8, 16), "fp32")])
    _same(net, lambda i: net(x), steps=3)


def test_a_root_called_from_another_root() -> None:
    inner = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return inner(self.pre(x))

    outer, x = Outer(), torch.randn(8, 16)
    both = nn.ModuleList([outer, inner])
    _plan([(inner[0], (8, 16), "fp32"), (inner[2], (8, 16), "low"), (outer.pre, (8, 16), "low")])
    _same(both, lambda i: (inner(x), outer(x), inner(x)), steps=3)


def test_nested_regions_o1_inside_auto_and_auto_inside_o1() -> None:
    net, x = _paths("low", "fp32")
    for _ in range(3):
        with ampcore.autocast("cpu", level="auto"):
            first = net(x, "b")
            with ampcore.autocast("cpu", level="O1"):
                inner = net(x, "b")
            with ampcore.autocast("cpu", level="auto"):
                nested = net(x, "b")
            with ampcore.autocast("cpu", enabled=False):
                off = net(x, "b")
            last = net(x, "b")
        _clean(net)
        assert first.dtype == nested.dtype == last.dtype == torch.float32  # b and cb decided fp32
        assert inner.dtype == LOW and off.dtype == torch.float32
        torch.testing.assert_close(first, _fixed(lambda: net(x, "b")), rtol=0, atol=0)
        torch.testing.assert_close(nested, first, rtol=0, atol=0)
        with ampcore.autocast("cpu", level="O1"):
            outer = net(x, "a")
            with ampcore.autocast("cpu", level="auto"):
                a = net(x, "a")
                b = net(x, "b")
        _clean(net)
        assert outer.dtype == a.dtype == LOW and b.dtype == torch.float32


def test_the_same_model_in_two_threads() -> None:
    net, x = _paths("low", "fp32")
    want = {p: _fixed(lambda p=p: net(x, p)) for p in ("a", "b")}  # type: ignore[misc]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(paths: str) -> None:
        try:
            barrier.wait()
            for p in paths * 10:
                with torch.no_grad(), ampcore.autocast("cpu", level="auto"):
                    out = net(x, p)
                assert out.dtype == want[p].dtype and torch.equal(out, want[p].detach())
                assert not torch.is_autocast_enabled("cpu")
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    _load(
        {
            **{k: "low" for m, s in ((net.a, (4, 16)), (net.ca, (4, 16))) for k in _classes(m, s, grad=False)},
            **{k: "fp32" for m, s in ((net.b, (4, 16)), (net.cb, (4, 24))) for k in _classes(m, s, grad=False)},
        }
    )
    with torch.no_grad():
        want = {p: _fixed(lambda p=p: net(x, p)) for p in ("a", "b")}  # type: ignore[misc]
    threads = [threading.Thread(target=work, args=(p,)) for p in ("ab", "ba")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _clean(net)


def test_modules_replaced_and_reparented_between_steps() -> None:
    net, x = _paths("low", "fp32")
    _same(net, lambda i: net(x, "a"), steps=2)
    net.a = nn.Linear(16, 24)  # a path a of b's shapes now: the fp32 classes
    net.ca = net.cb
    _same(net, lambda i: net(x, "a"), steps=3)
    other = nn.Sequential(net.b)  # re-parented (shared) into another root
    _same(other, lambda i: other(x), steps=2)


def test_a_torch_compiled_submodule() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.head = torch.compile(nn.Linear(16, 4), backend="eager")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.lin(x))

    net, x = Net(), torch.randn(8, 16)
    _plan([(net.lin, (8, 16), "fp32")])
    for _ in range(3):
        got = _auto(lambda: net(x))
        _clean(net)
        # the compiled head runs with the O1 lists (the plan is not applied inside compiled code)
        assert got.dtype == LOW and torch.isfinite(got).all()


def test_a_model_auto_cannot_measure_runs_exactly_as_torch_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    net, x = _paths("low", "fp32")
    ampcore.load_plan({"format": 2, "fingerprint": ampcore.auto_plan("cpu").fingerprint, "entries": {}}, freeze=False)
    for how in ("budget", "clock"):
        if how == "budget":
            monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "0")
        else:
            monkeypatch.delenv("AMPCORE_AUTO_BUDGET")
            monkeypatch.setattr(_hooks, "_clock", lambda region: None)
        for p in ("a", "b", "a", "b"):
            with torch.autocast("cpu", dtype=LOW):
                want = net(x, p)
            got = _auto(lambda: net(x, p))  # noqa: B023
            _clean(net)
            assert got.dtype == want.dtype and torch.equal(got, want)
        assert not ampcore.auto_plan("cpu").entries


# --- measured in the process (a fake clock): unusual calls of the planned kinds --------------


class _Clock:
    """A device clock: ``fp32`` / ``low`` ms per measured run, the whole-call check's
    candidates 2 / 1 / 3 ms (plan / low / fp32: the O1 lists win a mixed program's check);
    where float32 wins per class, it wins the whole call too: 2 / 3 / 2 ms (an all-float32
    program's check, against the O1 lists alone, keeps it)."""

    def __init__(self, fp32: float, low: float) -> None:
        whole = (2.0, 3.0, 2.0) if fp32 < low else (2.0, 1.0, 3.0)
        self.ms = {"fp32": fp32, "low": low, **dict(zip(("root-plan", "root-low", "root-fp32"), whole, strict=True))}
        self.labels: list[str] = []

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(label)
        return self.ms.get(label, 0.01) * (1.0 + 0.01 * (len(self.labels) % 3))


class Odd(nn.Module):
    """Attention with masks as keyword arguments, a convolution, a frozen layer and a Linear
    subclass with a keyword of its own."""

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:  # type: ignore[override]
            return super().forward(x) * scale

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.conv = nn.Conv1d(16, 16, 3, padding=1)
        self.frozen = nn.Linear(16, 16).requires_grad_(False)
        self.scaled = Odd.Scaled(16, 8)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        h, _ = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return {"out": self.scaled(self.frozen(h), scale=0.5), "h": h}


@pytest.mark.parametrize(("fp32_ms", "low_ms"), [(1.0, 4.0), (4.0, 1.0)], ids=["fp32-wins", "low-wins"])
@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode", "frozen-input"])
def test_measured_unusual_calls_match_the_fixed_precision(
    monkeypatch: pytest.MonkeyPatch, fp32_ms: float, low_ms: float, mode: str
) -> None:
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "30")
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: _Clock(fp32_ms, low_ms))
    monkeypatch.setattr(_hooks._process, "clocks", {})
    monkeypatch.setattr(_hooks._process, "spent_s", 0.0)
    net, x = Odd(), torch.randn(2, 5, 16)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, torch.enable_grad)
    with context():
        first = _auto(lambda: net(x, pad))
    _clean(net)
    expected = torch.float32 if fp32_ms < low_ms else LOW
    assert first["out"].dtype == first["h"].dtype == expected  # measured on this call: its decision's dtype
    plan = ampcore.auto_plan("cpu")
    assert {e.decision for e in plan.entries.values()} == {"fp32" if fp32_ms < low_ms else "low"}
    assert len(plan.entries) >= 4  # attention, convolution, frozen, scaled
    with context():
        if mode in ("no_grad", "inference_mode"):
            for _ in range(2):
                want, got = _fixed(lambda: net(x, pad)), _auto(lambda: net(x, pad))
                _clean(net)
                assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in want.items()}
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        else:
            _same(net, lambda i: net(x if mode == "grad" else x.requires_grad_(False), pad), steps=3)


def test_a_mixed_measured_program_with_a_whole_call_check_runs_as_the_fixed_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured decisions differ per module (float32 for the small layer): the program is
    mixed, the whole-call check says the O1 lists win (fake clock), and the root runs them."""
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "30")
    clock = _Clock(1.0, 1.0)
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    monkeypatch.setattr(_hooks._process, "clocks", {})
    monkeypatch.setattr(_hooks._process, "spent_s", 0.0)
    net, x = Paths(), torch.randn(4, 16)
    plan = ampcore.auto_plan("cpu")
    plan.set(shape_class(net.a, (x,), "cpu") or "", Costs(1.0, 4.0, 0.1), source="given")
    plan.set(shape_class(net.ca, (x,), "cpu") or "", Costs(4.0, 1.0, 0.1), source="given")
    for step in range(3):
        got = _auto(lambda: net(x, "a"))
        _clean(net)
        if step:
            with torch.autocast("cpu", dtype=LOW):
                want = net(x, "a")
            assert got.dtype == want.dtype and torch.equal(got, want)
    assert any(label.startswith("root-") for label in clock.labels)
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.verdict == "low"


def test_layers_with_low_precision_weights_run_as_torch_autocast_runs_them() -> None:
    """A layer whose weights are not float32 (``model.bfloat16()``, one layer converted, or the
    model converted after its program was recorded) cannot run in float32 by switching
    autocast off: it follows the O1 lists, whatever its class's decision."""
    net, x = _paths("fp32", "fp32")  # every class float32
    for dtype in (None, LOW):
        _plan([(m, s, "fp32") for m, s in ((net.a, (4, 16)), (net.ca, (4, 16)), (net.b, (4, 16)), (net.cb, (4, 24)))])
        for p in ("a", "b", "a"):
            if dtype is not None:
                net.ca.to(dtype)  # one layer converted after the program of path a was recorded
            with torch.autocast("cpu", dtype=LOW):
                want = _fixed(lambda: net(x, p)) if dtype is None else None  # noqa: B023
            got = _auto(lambda: net(x, p))  # noqa: B023
            _clean(net)
            if want is not None:
                assert got.dtype == want.dtype and torch.equal(got, want)
            else:
                assert got.dtype == (LOW if p == "a" else torch.float32)
    net.to(LOW)
    for p in ("a", "b", "a", "b"):
        with torch.autocast("cpu", dtype=LOW):
            want = net(x, p)
        got = _auto(lambda: net(x, p))  # noqa: B023
        assert got.dtype == want.dtype == LOW and torch.equal(got, want)
        _clean(net)


def test_a_low_precision_model_is_measured_without_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "30")
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: _Clock(1.0, 4.0))
    monkeypatch.setattr(_hooks._process, "clocks", {})
    monkeypatch.setattr(_hooks._process, "spent_s", 0.0)
    net, x = Paths().to(LOW), torch.randn(4, 16, dtype=LOW)
    for _ in range(3):
        with torch.autocast("cpu", dtype=LOW):
            want = net(x, "b")
        got = _auto(lambda: net(x, "b"))
        assert got.dtype == LOW and torch.equal(got, want)
        _clean(net)
    assert not ampcore.auto_plan("cpu").entries  # nothing to decide: it cannot run in float32


def test_a_forward_that_consumes_its_list_argument_settles_on_a_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signature is taken before the forward runs: a forward that pops its list argument
    still finds its program at the next call (it recorded every call before)."""

    class Pop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.head = nn.Linear(16, 4)

        def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
            return self.head(self.lin(xs.pop(0)) + xs.pop(0))

    net, x = Pop(), torch.randn(4, 16)
    _plan([(net.lin, (4, 16), "fp32"), (net.head, (4, 16), "fp32")])
    _same(net, lambda i: net([x, x]), steps=3)
    calls: list[str] = []
    pre = _hooks._pre
    monkeypatch.setattr(_hooks, "_pre", lambda *a: calls.append(type(a[0]).__name__) or pre(*a))
    _auto(lambda: net([x, x]))
    assert calls == []  # the program ran: no global hook


def test_the_whole_call_check_leaves_the_call_s_arguments_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-call check of a mixed program runs the root's forward again before the real
    call: on copies of its list and dict arguments (a forward that pops its list argument
    failed there), and a forward that cannot run again makes the program run as recorded."""

    class Pop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.head = nn.Linear(16, 4)
            self.once = False

        def forward(self, xs: list[torch.Tensor], extra: dict[str, torch.Tensor]) -> torch.Tensor:
            if self.once and ampcore._auto._program.local.measuring:
                raise RuntimeError("not twice")
            return self.head(self.lin(xs.pop(0)) + xs.pop(0) + extra.pop("b"))

    monkeypatch.setenv("AMPCORE_AUTO_BUDGET", "30")
    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: _Clock(1.0, 1.0))
    monkeypatch.setattr(_hooks._process, "clocks", {})
    monkeypatch.setattr(_hooks._process, "spent_s", 0.0)
    for once in (False, True):
        ampcore.auto_plan("cpu").roots.clear()
        _roots.forget()
        net, x = Pop(), torch.randn(4, 16)
        net.once = once
        plan = ampcore.auto_plan("cpu")
        plan.set(shape_class(net.lin, (x,), "cpu") or "", Costs(1.0, 4.0, 0.1), source="given")
        plan.set(shape_class(net.head, (x,), "cpu") or "", Costs(4.0, 1.0, 0.1), source="given")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ampcore.AmpcoreWarning)
            for _ in range(2 + _verify.CHECK_TRIES):  # (a check that raised is tried again at the next calls)
                got = _auto(lambda: net([x, x], {"b": x}))  # noqa: B023
                _clean(net)
                assert got.dtype == LOW
        assert bool(plan.roots) != once  # checked, or (the forward cannot run again) not
        failed = [w for w in caught if "whole-call check of Pop failed" in str(w.message)]
        assert len(failed) == once


def test_a_transformers_model_with_keyword_inputs_and_a_model_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hugging Face encoder called with keyword tensors, returning a ``ModelOutput``: equal to
    the fixed precision, and after the first call its program runs (no global hook)."""
    model = tiny_bert().eval()
    ids, mask = torch.randint(0, 100, (2, 10)), torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    decisions = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            for key in _classes(module, (2, 10, module.in_features), grad=False):
                decisions[key] = "fp32" if "intermediate" in name else "low"
    _load(decisions)
    calls: list[str] = []
    pre = _hooks._pre
    with torch.no_grad():
        for step in range(3):
            want = _fixed(lambda: model(input_ids=ids, attention_mask=mask))
            if step:
                monkeypatch.setattr(_hooks, "_pre", lambda *a: calls.append(type(a[0]).__name__) or pre(*a))
            got = _auto(lambda: model(input_ids=ids, attention_mask=mask))
            monkeypatch.setattr(_hooks, "_pre", pre)
            _clean(model)
            assert type(got) is type(want) and got.last_hidden_state.dtype == want.last_hidden_state.dtype
            torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=0)
            torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=0, atol=0)
    assert calls == []
