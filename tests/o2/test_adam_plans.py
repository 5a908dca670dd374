"""What the whole-tensor Adam/AdamW master update keeps between steps (``adam_plans.py``,
issue 26): every change the kept plan must see (a param group added, a state dict
loaded, the state cleared, a parameter dropped from a group or its ``.data`` replaced,
``requires_grad`` toggled, gradients set to None, clipping's float32 copies, an LR
scheduler) leaves the update bit-identical to torch's optimizer on float32 masters fed the
same gradients, step after step; and the steps between such changes run from the plan."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from test_master_adam import assert_same_state, masters_of
from test_master_step import batches, make_model
from torch import nn

import ampcore
from ampcore._o2 import adam_plans, master_adam, onepass, onepass_loop
from ampcore._o2.master import master_weights_of

MakeOpt = Callable[[Any], torch.optim.Optimizer]

OPTIMIZERS: dict[str, MakeOpt] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adam-amsgrad-maximize": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, maximize=True, weight_decay=0.1),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
}


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*runs emulated", ampcore.AmpcoreWarning)
        yield


class Twin:
    """A model decorated at O2 with its optimizer, and torch's optimizer of the same kind
    on float32 copies of the weights, fed the decorated model's gradients (widened), the
    low-precision model refreshed from them after each step: two runs that must agree bit
    for bit.  An extra float32 parameter, outside the model, joins the loss (for
    ``add_param_group``)."""

    def __init__(self, make_opt: MakeOpt) -> None:
        model = make_model()
        self.extra = [nn.Parameter(torch.linspace(-1, 1, 6)) for _ in range(2)]
        self.ref_masters = [p.detach().clone().requires_grad_() for p in model.parameters()]
        self.ref_model = ampcore.decorate(copy.deepcopy(model), device="cpu", master_weight=False)
        self.ref_lows = list(self.ref_model.parameters())
        self.ref_opt = make_opt(self.ref_masters)
        self.model, self.opt = ampcore.decorate(model, make_opt(model.parameters()), device="cpu")
        self.lows = list(self.model.parameters())
        self.batches = iter(batches(40))

    def step(self, between: Callable[[Twin], None] | None = None) -> None:
        """One step of each; ``between`` runs after backward, before the steps."""
        x, y = next(self.batches)
        for model, extra in ((self.model, self.extra[0]), (self.ref_model, self.extra[1])):
            with ampcore.autocast(device="cpu", level="O2"):
                out = model(x)
            (nn.functional.mse_loss(out.float(), y) + (extra * extra).sum()).backward()
        for master, low in zip(self.ref_masters, self.ref_lows, strict=True):
            master.grad = None if low.grad is None else low.grad.to(master.dtype)
        if between is not None:
            between(self)
        self.opt.step()
        self.ref_opt.step()
        with torch.no_grad():
            for low, master in zip(self.ref_lows, self.ref_masters, strict=True):
                low.copy_(master)
        self.opt.zero_grad()
        self.ref_opt.zero_grad()
        self.ref_model.zero_grad()
        for extra in self.extra:
            extra.grad = None

    def steps(self, count: int) -> None:
        """``count`` steps of each, checked after every one."""
        for _ in range(count):
            self.step()
            self.check()

    def step_with(self, event: str) -> None:
        """The change ``event`` (:data:`EVENTS`, at its time), a step of each, checked."""
        change, between = EVENTS[event]
        if between:
            self.step(change)
        else:
            change(self)
            self.step()
        self.check()

    def check(self) -> None:
        got, want = masters_of(self.opt), [p for g in self.ref_opt.param_groups for p in g["params"]]
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
        for low, ref_low in zip(self.lows, self.ref_lows, strict=True):
            assert torch.equal(low, ref_low)
        assert_same_state(self.opt, self.ref_opt)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often a plan was made, and how often a group took the walk without one (with
    torch's kernels: ``fused=True`` groups that the one-pass kernel takes keep no plan,
    ``test_onepass.py``)."""
    monkeypatch.setattr(onepass, "_module", lambda: None)
    monkeypatch.setattr(onepass_loop, "_module", lambda: None)  # (and that of the for-loop flavour)
    counts = {"made": 0, "walked": 0}
    make, work = adam_plans.GroupPlan.make.__func__, master_adam._work  # type: ignore[attr-defined]

    def made(cls: Any, *args: Any) -> Any:
        counts["made"] += 1
        return make(cls, *args)

    def walked(*args: Any) -> Any:
        counts["walked"] += 1
        return work(*args)

    monkeypatch.setattr(adam_plans.GroupPlan, "make", classmethod(made))
    monkeypatch.setattr(master_adam, "_work", walked)
    return counts


def _drop_grads(twin: Twin) -> None:
    """Gradients of the first layer set to None after backward, on both sides."""
    for index in (0, 1):
        twin.lows[index].grad = None
        twin.ref_masters[index].grad = None


def _clip(twin: Twin) -> None:
    """Clipping the optimizer's parameters: the masters get float32 gradient copies."""
    for opt in (twin.opt, twin.ref_opt):
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 0.05)


def _add_group(twin: Twin) -> None:
    for opt, extra in ((twin.opt, twin.extra[0]), (twin.ref_opt, twin.extra[1])):
        opt.add_param_group({"params": [extra], "lr": 5e-3})


def _reload(twin: Twin) -> None:
    """Each optimizer loads its own state dict: new param groups and new state tensors."""
    for opt in (twin.opt, twin.ref_opt):
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))


def _clear_state(twin: Twin) -> None:
    twin.opt.state.clear()
    twin.ref_opt.state.clear()


def _drop_param(twin: Twin) -> None:
    """The last parameter leaves the group with its state (its master is no longer updated)."""
    for opt in (twin.opt, twin.ref_opt):
        del opt.state[dict.__getitem__(opt.param_groups[0], "params").pop()]


def _freeze(twin: Twin) -> None:
    """The first layer stops taking gradients (before the next backward)."""
    for low in (*twin.lows[:2], *twin.ref_lows[:2]):
        low.requires_grad_(False)


def _wider_master(twin: Twin) -> None:
    """A master's ``.data`` replaced by a float64 tensor, its state dropped, on both sides:
    its widened gradient must now be float64 (a kept float32 scratch tensor would not do)."""
    for opt in (twin.opt, twin.ref_opt):
        master = dict.__getitem__(opt.param_groups[0], "params")[0]
        master.data = master.data.double()
        del opt.state[master]


#: event -> (what it does, whether it runs between backward and the step, or before backward)
EVENTS: dict[str, tuple[Callable[[Twin], None], bool]] = {
    "grads-set-to-none": (_drop_grads, True),
    "clipping-copies": (_clip, True),
    "add-param-group": (_add_group, False),
    "load-state-dict": (_reload, False),
    "state-cleared": (_clear_state, False),
    "param-dropped-from-group": (_drop_param, False),
    "requires-grad-toggled": (_freeze, False),
    "master-data-replaced": (_wider_master, False),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("event", list(EVENTS))
def test_a_change_between_steps_keeps_the_update_bit_identical_to_torch(
    event: str, name: str, counted: dict[str, int]
) -> None:
    """Three steps, the change, three more: equal to torch's optimizer after every step;
    the steps before the change (but the first, which creates the state) run from one
    plan, and the steps after it from a plan again."""
    twin = Twin(OPTIMIZERS[name])
    twin.steps(3)
    assert counted == {"made": 1, "walked": 1}  # the first step creates the state: walked
    twin.step_with(event)
    twin.steps(3)
    if event == "requires-grad-toggled":
        for low in (*twin.lows[:2], *twin.ref_lows[:2]):
            low.requires_grad_(True)
        twin.step()
        twin.check()
    counts = dict(counted)
    twin.step()
    assert counted == counts  # steady again: from the plan, nothing made, nothing walked


def test_an_lr_scheduler_drives_the_planned_update(counted: dict[str, int]) -> None:
    twin = Twin(OPTIMIZERS["adamw"])
    scheds = [torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i)) for opt in (twin.opt, twin.ref_opt)]
    for _ in range(6):
        twin.step()
        for sched in scheds:
            sched.step()
        twin.check()
    assert counted == {"made": 1, "walked": 1}


def test_a_plan_is_made_again_when_a_master_changes_shape_or_dtype() -> None:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters())
    model, opt = ampcore.decorate(model, opt, device="cpu")
    weights = master_weights_of(opt)
    assert weights is not None
    group = opt.param_groups[0]
    plan = weights.adam_plans.plan(0, group)
    params = dict.__getitem__(group, "params")
    assert weights.adam_plans.plan(0, group) is plan and plan.holds(group, params)
    master = params[0]
    for data in (master.data.clone(), master.data.reshape(-1), master.data.double()):
        kept = master.data
        master.data = data
        assert plan.holds(group, params) == (data.shape == kept.shape and data.dtype == kept.dtype)
        master.data = kept
    assert not plan.holds(dict(group), params)  # another group object (load_state_dict)
    assert not plan.holds(group, [*params[1:], params[0]])  # other tensors in the list


@pytest.mark.parametrize("event", list(EVENTS))
def test_a_change_between_steps_under_the_onepass_kernel(event: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same changes where the one-pass CPU kernel takes the ``fused=True`` group
    (it keeps no plan): bit-identical to torch's fused optimizer after every step."""
    if not onepass.ready():
        pytest.skip(f"the one-pass CPU kernel does not run here: {onepass.describe()}")
    taken: list[int] = []
    real = onepass.adam_update

    def spy(group: Any, work: Any, *rest: Any) -> Any:
        rest_of = real(group, work, *rest)
        taken.append(len(work) - len(rest_of))
        return rest_of

    monkeypatch.setattr(onepass, "adam_update", spy)
    twin = Twin(OPTIMIZERS["adam-fused"])
    twin.steps(2)
    twin.step_with(event)
    twin.steps(2)
    assert sum(taken) > 0  # the kernel took the masters
