"""Issue 27, tenth held-out sweep of ``level="auto"``: uses the earlier sweeps did not try
(the model kinds are in ``test_auto_sweep10.py``).

* MAML-like fast weights: ``torch.func.functional_call`` with a params dict built from an
  inner gradient step (``create_graph=True``);
* ``load_state_dict`` mid-training (a rollback to an earlier snapshot), a submodule moved
  to bfloat16 and back mid-run (``module.to(dtype)``), progressive unfreezing
  (``requires_grad`` toggled layer by layer), gradient accumulation over micro-batches of
  uneven size;
* EMA teachers: ``torch.optim.swa_utils.AveragedModel`` (EMA averaging) called in the region,
  and a teacher deep-copied from the model every step;
* a ``torch.jit.trace``-d submodule, full backward pre-hooks scaling ``grad_output``, two
  optimizers with their LR schedulers, a frozen submodule quantized by
  ``torch.ao.quantization.quantize_dynamic`` in front of a float head;
* saved-tensor hooks of the user's own (``torch.autograd.graph.save_on_cpu`` and a
  ``saved_tensors_hooks`` pack/unpack pair) around the forward;
* forward-mode AD (``torch.func.jvp``), stochastic depth (blocks skipped at random), grad
  turned off for part of the forward (``torch.set_grad_enabled``), conv + batch norm fused
  for evaluation mid-run (``fuse_conv_bn_eval``).

Each case is compared step by step with the fixed precision its plan gives
(``test_auto_sweep3.run``), with measured plans (a fake clock) and given plans.  No wall clock.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Final

import pytest
import torch
import torch.nn.functional as F
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from test_auto_sweep9 import _rebuilt, _state
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


class Traced(nn.Module):
    """A ``torch.jit.trace``-d block between two plain Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.block = torch.jit.trace(nn.Sequential(nn.Linear(32, 32), nn.GELU()), torch.randn(2, 32))
        self.b = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.block(torch.relu(self.a(x))))


def _pre_hooked() -> nn.Module:
    m = _mlp()
    m[2].register_full_backward_pre_hook(lambda mod, g: (g[0] * 0.5,))
    m[4].register_full_backward_pre_hook(lambda mod, g: (g[0].clamp(-0.01, 0.01),))
    return m


class Quantized(nn.Module):
    """A frozen feature extractor quantized dynamically (int8 Linear), a float head trained."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.ao.quantization.quantize_dynamic(
            nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32)).eval(), {nn.Linear}, dtype=torch.qint8
        )
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.float()))


class Depth(nn.Module):
    """Stochastic depth: each residual block skipped with probability 0.3 in training."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(4))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            if not self.training or torch.rand(()) > 0.3:
                h = h + block(h)
        return self.head(h)


class PartlyFrozen(nn.Module):
    """Grad turned off for the first layers inside the forward (``torch.set_grad_enabled``)."""

    def __init__(self) -> None:
        super().__init__()
        self.front = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.back = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor, tune_front: bool) -> torch.Tensor:
        with torch.set_grad_enabled(tune_front and torch.is_grad_enabled()):
            h = self.front(x)
        return self.back(h)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.conv(x)))
        return self.head(F.relu(self.bn2(self.conv2(h))).mean((2, 3)))


def _cases() -> dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module, int, Enter], Any]]]:
    x, image = torch.randn(8, 16), torch.randn(2, 3, 8, 8)
    store: dict[int, Any] = {}

    def maml(m: nn.Module, i: int, enter: Enter) -> Any:
        support, query = torch.randn(8, 16), torch.randn(8, 16)
        params = dict(m.named_parameters())
        with enter(BF16):
            inner = torch.func.functional_call(m, params, (support,)).float().pow(2).mean()
        grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
        fast = {k: p - 0.1 * g for (k, p), g in zip(params.items(), grads, strict=True)}
        with enter(BF16):
            out = torch.func.functional_call(m, fast, (query,))
        out.float().pow(2).mean().backward()
        return out, inner

    def rollback(m: nn.Module, i: int, enter: Enter) -> Any:
        opt, snaps = _state(m, lambda m: (torch.optim.SGD(m.parameters(), 0.1), {}), store)
        if i == 1:
            snaps["one"] = copy.deepcopy(m.state_dict())
        if i == 4 and "one" in snaps:
            m.load_state_dict(snaps["one"])
        out = _train(m, x, enter)
        opt.step()
        opt.zero_grad()
        return out

    def moved(m: nn.Module, i: int, enter: Enter) -> Any:
        m[2].to(BF16 if i in (2, 3) else torch.float32)
        return _train(m, x, enter)

    def unfreeze(m: nn.Module, i: int, enter: Enter) -> Any:
        layers = [m[4], m[2], m[0]]
        for k, layer in enumerate(layers):
            layer.requires_grad_(k <= i // 2)
        return _train(m, x, enter)

    def accumulate(m: nn.Module, i: int, enter: Enter) -> Any:
        opt = _state(m, lambda m: torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), store)
        outs = []
        for micro in (x[:3], x[3:7], x[7:]):
            with enter(BF16):
                out = m(micro)
            (out.float().pow(2).sum() / 8).backward()
            outs.append(out)
        opt.step()
        opt.zero_grad()
        return outs

    def averaged(m: nn.Module, i: int, enter: Enter) -> Any:
        ema, opt = _state(
            m,
            lambda m: (
                torch.optim.swa_utils.AveragedModel(m, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9)),
                torch.optim.SGD(m.parameters(), 0.1),
            ),
            store,
        )
        out = _train(m, x, enter)
        opt.step()
        opt.zero_grad()
        ema.update_parameters(m)
        with torch.no_grad(), enter(BF16):
            teacher = ema(x)
        return out, teacher

    def deepcopied(m: nn.Module, i: int, enter: Enter) -> Any:
        teacher = copy.deepcopy(m).eval()
        with enter(BF16):
            with torch.no_grad():
                t = teacher(x.flip(0))
            out = m(x)
        F.mse_loss(out.float(), t.float()).backward()
        return out, t

    def schedulers(m: nn.Module, i: int, enter: Enter) -> Any:
        (o1, s1), (o2, s2) = _state(
            m,
            lambda m: tuple(
                (opt, torch.optim.lr_scheduler.StepLR(opt, 2, 0.5))
                for opt in (torch.optim.SGD(m[:3].parameters(), 0.1), torch.optim.AdamW(m[3:].parameters(), 1e-2))
            ),
            store,
        )
        out = _train(m, x, enter)
        for opt, sched in ((o1, s1), (o2, s2)):
            opt.step()
            opt.zero_grad()
            sched.step()
        return out

    def on_cpu(m: nn.Module, i: int, enter: Enter) -> Any:
        with torch.autograd.graph.save_on_cpu():
            return _train(m, x, enter)

    def packed(m: nn.Module, i: int, enter: Enter) -> Any:
        def pack(t: torch.Tensor) -> tuple[torch.dtype, torch.Tensor]:
            return t.dtype, t.clone()

        def unpack(saved: tuple[torch.dtype, torch.Tensor]) -> torch.Tensor:
            return saved[1].to(saved[0])

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return _train(m, x, enter)

    def jvp(m: nn.Module, i: int, enter: Enter) -> Any:
        tangent = torch.randn(8, 16)
        with enter(BF16):
            out, dout = torch.func.jvp(m, (x,), (tangent,))
        return out, dout

    def partly(m: nn.Module, i: int, enter: Enter) -> Any:
        return _train(m, x, enter, tune_front=i % 3 == 0)

    def fused(m: nn.Module, i: int, enter: Enter) -> Any:
        if i < 3 and not isinstance(m.bn, nn.Identity):  # (fused: evaluated from then on)
            return _train(m, image, enter)
        if not isinstance(m.bn, nn.Identity):
            m.eval()
            m.conv = torch.nn.utils.fusion.fuse_conv_bn_eval(m.conv, m.bn)
            m.conv2 = torch.nn.utils.fusion.fuse_conv_bn_eval(m.conv2, m.bn2)
            m.bn, m.bn2 = nn.Identity(), nn.Identity()
        with torch.no_grad(), enter(BF16):
            return m(image)

    def depth(m: nn.Module, i: int, enter: Enter) -> Any:
        if i == 5:
            m.eval()
        out = _train(m, x, enter)
        m.train()
        return out

    return {
        "maml-functional-call-fast-weights": (_mlp, maml),
        "load-state-dict-rollback": (_mlp, rollback),
        "submodule-to-bf16-and-back": (_mlp, moved),
        "progressive-unfreezing": (_mlp, unfreeze),
        "accumulation-uneven-micro-batches": (_mlp, accumulate),
        "averaged-model-ema": (_mlp, averaged),
        "deepcopy-teacher-each-step": (_mlp, deepcopied),
        "jit-traced-submodule": (Traced, lambda m, i, enter: _train(m, x, enter)),
        "full-backward-pre-hooks": (_pre_hooked, lambda m, i, enter: _train(m, x, enter)),
        "two-optimizers-schedulers": (_mlp, schedulers),
        "dynamic-quantized-submodule": (Quantized, lambda m, i, enter: _train(m, x, enter)),
        "save-on-cpu": (_mlp, on_cpu),
        "saved-tensors-hooks": (_mlp, packed),
        "forward-mode-jvp": (_mlp, jvp),
        "stochastic-depth": (Depth, depth),
        "grad-off-in-forward": (PartlyFrozen, partly),
        "fuse-conv-bn-eval": (ConvBN, fused),
    }


#: how the reference is made where a deep copy is not the same model
_CLONES: Final = {
    "jit-traced-submodule": _rebuilt(Traced),
    "full-backward-pre-hooks": _rebuilt(_pre_hooked),
    "dynamic-quantized-submodule": _rebuilt(Quantized),
}


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_uses_measured_match_the_fixed_precision(case: str, measuring: Any, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,), measured=True, clone=_CLONES.get(case, copy.deepcopy))


@pytest.mark.parametrize("case", list(_cases()))
def test_heldout_uses_with_given_plans_match_the_fixed_precision(case: str, recordings: list[Any]) -> None:
    make, step = _cases()[case]
    run(make, step, 6, recordings, (BF16,), clone=_CLONES.get(case, copy.deepcopy))


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
