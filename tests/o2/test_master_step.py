"""``optimizer.step()`` of a decorated optimizer whose update ampcore runs itself (torch's
Adam, AdamW and momentum-free SGD without step hooks): torch's step does not run a second
time for its bookkeeping; what its wrapper does observably is done once, around ampcore's
update (the profiler's record, LR schedulers' step tracking, the graph-capture check), and
anything ampcore cannot reproduce (step hooks, an unknown wrapper of ``step``) sends the
step back through torch's code (issue 26: the O2 + decorate step row)."""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import ampcore
from ampcore._o2 import onepass_loop
from ampcore._o2.master import master_weights_of

BF16 = torch.bfloat16
Params = Iterable[torch.Tensor]
MakeOpt = Callable[[Params], torch.optim.Optimizer]

OPTIMIZERS: dict[str, MakeOpt] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*runs emulated", ampcore.AmpcoreWarning)
        yield


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 12), nn.LayerNorm(12), nn.ReLU(), nn.Linear(12, 5))


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 16, generator=gen), torch.randn(4, 5, generator=gen)) for _ in range(n)]


def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    with ampcore.autocast(device="cpu", level="O2"):
        out = model(x)
    nn.functional.mse_loss(out.float(), y).backward()


def train(opt: torch.optim.Optimizer, model: nn.Module, steps: int, sched: Any = None) -> None:
    for x, y in batches(steps):
        opt.zero_grad()
        backward(model, x, y)
        opt.step()
        if sched is not None:
            sched.step()


def decorated(name: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model()
    opt = OPTIMIZERS[name](model.parameters())
    model, opt = ampcore.decorate(model, opt, device="cpu")
    return model, opt


def weights(opt: torch.optim.Optimizer, model: nn.Module) -> list[torch.Tensor]:
    return [*(p for g in opt.param_groups for p in g["params"]), *model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture
def torch_steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every run of torch's own step body (each calls ``_init_group`` once per param group).

    Each class gets its own spy: once torch.compile has run in the process, dynamo's patcher
    gives every optimizer class an ``_init_group`` of its own, which a spy on the base class
    would not see.  A spy that calls another (a subclass's reaching its base's) counts once.
    """
    calls: list[str] = []
    depth = [0]
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        original = cls._init_group

        def spy(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if not depth[0]:
                calls.append(type(self).__name__)
            depth[0] += 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(cls, "_init_group", spy)
    return calls


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_torchs_step_runs_once_not_again_for_bookkeeping(name: str, torch_steps: list[str]) -> None:
    model, opt = decorated(name)
    train(opt, model, 3)
    assert torch_steps == []  # ampcore's own update, no second (empty) step of torch's
    generic_model, generic = decorated(name)
    generic.register_step_pre_hook(lambda *args: None)  # a hook: torch's path, which updates
    train(generic, generic_model, 3)
    assert len(torch_steps) == 3
    assert same(weights(opt, model), weights(generic, generic_model))


@pytest.mark.parametrize("order", ["scheduler-first", "decorate-first"])
@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_lr_schedulers_see_the_step_in_either_order(name: str, order: str, torch_steps: list[str]) -> None:
    def run(generic: bool) -> tuple[list[torch.Tensor], list[float]]:
        model = make_model()
        opt = OPTIMIZERS[name](model.parameters())
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()", "overridden"
            # torch's, with IPEX 2.8 imported (its CPU layer_norm kernel has no autograd kernel)
            warnings.filterwarnings("ignore", "aten::layer_norm: an autograd kernel was not registered", UserWarning)
            if order == "scheduler-first":
                sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
                model, opt = ampcore.decorate(model, opt, device="cpu")
            else:
                model, opt = ampcore.decorate(model, opt, device="cpu")
                sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            if generic:
                opt.register_step_pre_hook(lambda *args: None)
            train(opt, model, 3, sched)
        return weights(opt, model), [group["lr"] for group in opt.param_groups]

    got, lrs = run(generic=False)
    assert torch_steps == []
    want, want_lrs = run(generic=True)
    assert len(torch_steps) == 3
    assert lrs == want_lrs == [pytest.approx(OPTIMIZERS[name]([torch.zeros(1)]).defaults["lr"] * 0.5**3)]
    assert same(got, want)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_a_deep_copy_steps_itself_not_the_original_through_its_scheduler_wrapper(name: str) -> None:
    """An LR scheduler wrapped ``step`` before decorate (the wrapper refers to the original
    by a weak reference): a deep copy of the decorated optimizer is a torch optimizer of its
    own, as torch deep-copies any optimizer (its state and param groups), whose step updates
    the copy's float32 weights and neither touches nor marks the original."""
    model = make_model()
    opt = OPTIMIZERS[name](model.parameters())
    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt = ampcore.decorate(model, opt, device="cpu")
    train(opt, model, 2)
    twin = copy.deepcopy(opt)
    original = [t.detach().clone() for t in weights(opt, model)]
    opt._opt_called = False  # type: ignore[attr-defined]
    masters = [p for g in twin.param_groups for p in g["params"]]
    for master in masters:
        master.grad = torch.ones_like(master)
    kept = [m.detach().clone() for m in masters]
    twin.step()
    assert same(weights(opt, model), original) and not opt._opt_called  # type: ignore[attr-defined]
    assert all(m.dtype == torch.float32 for m in masters) and not same(masters, kept)


def test_an_unknown_step_wrapper_still_runs_with_torchs_step(torch_steps: list[str]) -> None:
    """ampcore cannot know what a wrapper installed on the instance before decorate does:
    it keeps calling it (and torch's step behind it), as before."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen: list[int] = []
    original = opt.step

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen.append(len(seen))
        return original(*args, **kwargs)

    opt.step = counting  # type: ignore[method-assign]
    model, opt = ampcore.decorate(model, opt, device="cpu")
    train(opt, model, 2)
    assert seen == [0, 1] and len(torch_steps) == 2


def test_a_patched_class_step_still_runs_for_its_bookkeeping(
    torch_steps: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library that patches the class's ``step`` (e.g. to log each step) still sees every
    step: ampcore stands in only for torch's own code."""
    seen: list[int] = []
    original = torch.optim.AdamW.step

    def logged(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(seen))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", logged)
    model, opt = decorated("adamw")
    train(opt, model, 2)
    assert seen == [0, 1] and len(torch_steps) == 2  # each an update of nothing
    monkeypatch.undo()
    plain_model, plain = decorated("adamw")
    train(plain, plain_model, 2)
    assert same(weights(opt, model), weights(plain, plain_model))


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_the_profiler_records_the_step_once_around_the_update(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's kernels, whose refresh copy the profiler sees (the one-pass kernels write the
    # parameters in C++, no aten op: test_onepass_loop.py)
    monkeypatch.setattr(onepass_loop, "_module", lambda: None)
    model, opt = decorated(name)
    train(opt, model, 1)  # state created
    label = f"Optimizer.step#{type(opt).__name__}.step"
    from torch.profiler import profile

    with profile() as prof:
        train(opt, model, 2)
    events = prof.events()
    steps = [e for e in events if e.name == label]
    assert len(steps) == 2
    # the refresh of the low-precision parameters (ampcore's update) runs inside the record
    refreshes = [e for e in events if e.name == "aten::_foreach_copy_" and e.cpu_parent is not None]
    inside = [e for e in refreshes if any(s.time_range.start <= e.time_range.start <= s.time_range.end for s in steps)]
    assert inside and len(inside) >= 2


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_step_hooks_and_global_hooks_run_and_take_torchs_path(name: str, torch_steps: list[str]) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    model, opt = decorated(name)
    seen: list[str] = []
    handles = [
        opt.register_step_pre_hook(lambda o, a, k: seen.append("pre") if o is opt else None),
        opt.register_step_post_hook(lambda o, a, k: seen.append("post") if o is opt else None),
        register_optimizer_step_pre_hook(lambda o, a, k: seen.append("global-pre") if o is opt else None),
        register_optimizer_step_post_hook(lambda o, a, k: seen.append("global-post") if o is opt else None),
    ]
    try:
        train(opt, model, 2)
    finally:
        for handle in handles:
            handle.remove()
    assert seen == ["global-pre", "pre", "post", "global-post"] * 2
    assert len(torch_steps) == 2
    plain_model, plain = decorated(name)
    train(plain, plain_model, 2)
    assert same(weights(opt, model), weights(plain, plain_model))


def test_the_profilers_python_hook_runs_once_per_step() -> None:
    model, opt = decorated("adamw")
    calls: list[int] = []
    opt._optimizer_step_code = lambda: calls.append(1)  # type: ignore[method-assign]
    train(opt, model, 3)
    assert calls == [1, 1, 1]


def _health_check_name() -> str:
    for name in ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"):
        if name in inspect.unwrap(torch.optim.Adam.step).__code__.co_names:
            return name
    pytest.skip("this torch's Adam.step runs no graph-capture health check")


def test_adams_graph_capture_check_runs_before_the_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in torch: under a graph capture with capturable=False, Adam raises before it
    updates anything."""
    model, opt = decorated("adamw")
    train(opt, model, 1)
    before = [t.detach().clone() for t in weights(opt, model)]

    def capturing(self: Any) -> None:
        raise RuntimeError("graph capture of step() but param_groups' capturable is False")

    monkeypatch.setattr(torch.optim.Optimizer, _health_check_name(), capturing)
    x, y = batches(1)[0]
    opt.zero_grad()
    backward(model, x, y)
    with pytest.raises(RuntimeError, match="capturable is False"):
        opt.step()
    assert same(weights(opt, model), before)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_small_parameters_take_one_untimed_walk(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No parameter larger than the CPU adapter's chunk: chunks and whole tensors are the
    same walk, so the update is never timed and goes whole."""
    import ampcore._o2.own_update as master_module

    calls: list[int | None] = []
    for function in ("fused_adam_update", "fused_sgd_update"):
        original = getattr(master_module, function)
        monkeypatch.setattr(
            master_module, function, lambda *a, _original=original, **k: calls.append(a[2]) or _original(*a, **k)
        )
    model, opt = decorated(name)
    found = master_weights_of(opt)
    assert found is not None and found.walk.adaptive

    def clock() -> float:
        raise AssertionError("the update was timed")

    found.walk._clock = clock
    train(opt, model, 4)
    assert calls == [None] * 4
