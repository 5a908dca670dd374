"""Adam and AdamW master-weight updates, chunk by chunk (the CPU adapter) and on whole
tensors (an adapter that leaves ``master_update_chunk_elements`` at its default, as GPU
adapters do): exact, copy-free where chunked, resumable."""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import ampcore
from ampcore._o2 import onepass, onepass_loop
from ampcore._o2.master import master_weights_of

BF16, FP32 = torch.bfloat16, torch.float32
Params = Iterable[torch.Tensor]
MakeOpt = Callable[[Params], torch.optim.Optimizer]

#: The CPU adapter's chunk of the master-weight update (elements).
ADAM_CHUNK = ampcore.get_backend("cpu").master_update_chunk_elements
assert isinstance(ADAM_CHUNK, int)
#: One Linear weight spans several chunks and ends in a partial one (odd sizes: SIMD tails).
BIG_IN, BIG_OUT = 1031, 601
assert BIG_IN * BIG_OUT > 2 * ADAM_CHUNK and (BIG_IN * BIG_OUT) % ADAM_CHUNK
#: A CPU adapter with BackendSpec's defaults: whole-tensor master-weight updates.
WHOLE = "wholecpu"


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*runs emulated", ampcore.AmpcoreWarning)
        yield


@pytest.fixture(scope="module", autouse=True)
def _whole_tensor_adapter() -> Iterator[None]:
    from conftest import make_adapter  # (not at import: the resume test runs this file as a script)

    ampcore.register_plugin(make_adapter(WHOLE), name=WHOLE)
    try:
        yield
    finally:
        ampcore.unregister_plugin(WHOLE)


def make_model(norm: bool = True) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(BIG_IN, BIG_OUT), nn.ReLU(), nn.Linear(BIG_OUT, 7)]
    if norm:  # BatchNorm stays float32: a parameter of the group without a master
        layers.insert(1, nn.BatchNorm1d(BIG_OUT))
    return nn.Sequential(*layers)


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(16, BIG_IN, generator=gen), torch.randn(16, 7, generator=gen)) for _ in range(n)]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x).float(), y)


ADAMS: dict[str, MakeOpt] = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam-wd-amsgrad-maximize": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, amsgrad=True, maximize=True),
    "adam-foreach-wd": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, foreach=True),
    "adam-fused-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, fused=True),
    "adam-tensor-lr": lambda p: torch.optim.Adam(p, lr=torch.tensor(1e-2), betas=(0.8, 0.99)),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw-wd-amsgrad": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.5, amsgrad=True),
    "adamw-foreach-maximize-amsgrad": lambda p: torch.optim.AdamW(
        p, lr=1e-2, maximize=True, amsgrad=True, foreach=True
    ),
    "adamw-fused-wd": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.5, fused=True),
    "adam-decoupled": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.3, decoupled_weight_decay=True),
}


def reference(make_opt: MakeOpt, steps: int, norm: bool = True) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """torch's own optimizer on fp32 masters, fed the bf16 model's gradients upcast."""
    model = make_model(norm)
    masters = [p.detach().clone().requires_grad_() for p in model.parameters()]
    low = ampcore.decorate(copy.deepcopy(model), device="cpu", master_weight=False)  # same forward
    opt = make_opt(masters)
    for x, y in batches(steps):
        low.zero_grad()
        with ampcore.autocast(device="cpu", level="O2"):
            loss = loss_of(low, x, y)
        loss.backward()
        for master, param in zip(masters, low.parameters(), strict=False):
            master.grad = param.grad.float()
        opt.step()
        with torch.no_grad():
            for param, master in zip(low.parameters(), masters, strict=False):
                param.copy_(master)
    return masters, opt


def train_decorated(
    make_opt: MakeOpt, steps: int, generic: bool = False, norm: bool = True, device: str = "cpu"
) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model(norm)
    opt = make_opt(model.parameters())
    model, opt = ampcore.decorate(model, opt, device=device)
    if generic:  # a step hook makes ampcore leave the step to torch (fp32 gradient copies)
        opt.register_step_pre_hook(lambda *args: None)
    for x, y in batches(steps):
        opt.zero_grad()
        with ampcore.autocast(device="cpu", level="O2"):
            loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
    return model, opt


def masters_of(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def assert_same_state(got: torch.optim.Optimizer, want: torch.optim.Optimizer) -> None:
    a, b = got.state_dict()["state"], want.state_dict()["state"]
    assert a.keys() == b.keys()
    for index in a:
        assert a[index].keys() == b[index].keys()
        for key, value in a[index].items():
            other = b[index][key]
            assert value.dtype == other.dtype and value.device == other.device, key
            assert torch.equal(value, other), (index, key)


@pytest.mark.parametrize("device", ["cpu", WHOLE], ids=["chunks", "whole"])
@pytest.mark.parametrize("name", list(ADAMS))
def test_update_is_bit_identical_to_torch_on_fp32_masters(
    name: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ampcore._o2.own_update as master_module

    calls: list[int | None] = []
    original = master_module.fused_adam_update
    monkeypatch.setattr(master_module, "fused_adam_update", lambda *a, **k: calls.append(a[2]) or original(*a, **k))
    model, opt = train_decorated(ADAMS[name], 4, device=device)
    # the CPU adapter's walk: an untimed step and a timed one in chunks, one whole, then the faster
    assert calls[:3] == ([ADAM_CHUNK, ADAM_CHUNK, None] if device == "cpu" else [None] * 3) and len(calls) == 4
    want, ref_opt = reference(ADAMS[name], 4)
    for master, expected, param in zip(masters_of(opt), want, model.parameters(), strict=False):
        assert master.dtype == FP32 and torch.equal(master, expected)
        assert torch.equal(param, expected.to(param.dtype))
    assert_same_state(opt, ref_opt)


@pytest.mark.parametrize("device", ["cpu", WHOLE], ids=["chunks", "whole"])
@pytest.mark.parametrize("name", ["adam-wd-amsgrad-maximize", "adamw-foreach-maximize-amsgrad", "adamw-fused-wd"])
def test_the_generic_path_gives_the_same_weights_and_state(name: str, device: str) -> None:
    fast_model, fast = train_decorated(ADAMS[name], 3, device=device)
    slow_model, slow = train_decorated(ADAMS[name], 3, generic=True, device=device)
    for a, b in zip(
        [*masters_of(fast), *fast_model.parameters()], [*masters_of(slow), *slow_model.parameters()], strict=False
    ):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert_same_state(fast, slow)


class _LargestFloat32(TorchDispatchMode):
    """Records the largest float32 tensor any op allocates (views and in-place results,
    which share an input's storage, allocate nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves = tree_leaves((args, kwargs))
        inputs = {t.untyped_storage().data_ptr() for t in leaves if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.dtype == FP32:
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in inputs:
                    self.largest = max(self.largest, storage.nbytes() // tensor.element_size())
        return out


@pytest.mark.parametrize("name", ["adam", "adamw-wd-amsgrad", "adamw-foreach-maximize-amsgrad", "adamw-fused-wd"])
def test_the_step_creates_no_full_size_float32_gradient(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onepass, "_module", lambda: None)  # torch's kernels (the one-pass kernel: test_onepass.py)
    monkeypatch.setattr(onepass_loop, "_module", lambda: None)  # (and that of the for-loop flavour)
    model, opt = train_decorated(ADAMS[name], 1, norm=False)  # state exists after one step
    x, y = batches(1)[0]
    with ampcore.autocast(device="cpu", level="O2"):
        loss = loss_of(model, x, y)
    loss.backward()
    with _LargestFloat32() as seen:
        opt.step()
    assert 0 < seen.largest <= ADAM_CHUNK < BIG_IN * BIG_OUT
    weights = master_weights_of(opt)
    assert weights is not None and all(p.grad is None for p in weights.masters)  # (no sync on read)
    assert model[0].weight.grad.dtype == BF16


def test_the_generic_path_does_make_full_size_float32_gradients() -> None:
    """(The measuring tool sees the copies where they exist.)"""
    model, opt = train_decorated(ADAMS["adam"], 1, generic=True, norm=False)
    x, y = batches(1)[0]
    loss_of(model, x, y).backward()
    with _LargestFloat32() as seen:
        opt.step()
    assert seen.largest >= BIG_IN * BIG_OUT


def test_clipping_the_optimizer_parameters_before_the_step_is_honoured() -> None:
    """Reading the param groups (here: clipping) makes fp32 copies; the step uses them."""
    make_opt = ADAMS["adamw-wd-amsgrad"]

    def run(generic: bool) -> list[torch.Tensor]:
        model, opt = train_decorated(make_opt, 1, generic=generic)
        for x, y in batches(2):
            opt.zero_grad()
            loss_of(model, x, y).backward()
            torch.nn.utils.clip_grad_norm_(masters_of(opt), 1e-3)
            opt.step()
        return [*masters_of(opt), *model.parameters()]

    for a, b in zip(run(False), run(True), strict=False):
        assert torch.equal(a, b)


@pytest.mark.skipif(
    not hasattr(torch.Tensor, "grad_dtype"),
    reason=f"master_grad=True needs Tensor.grad_dtype; torch {torch.__version__}",
)
def test_master_grad_true_runs_the_chunked_update_from_the_shared_fp32_gradients() -> None:
    def run(generic: bool) -> list[torch.Tensor]:
        model = make_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        model, opt = ampcore.decorate(model, opt, device="cpu", master_grad=True)
        if generic:
            opt.register_step_pre_hook(lambda *args: None)
        for x, y in batches(3):
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()
        return [*masters_of(opt), *model.parameters()]

    for a, b in zip(run(False), run(True), strict=False):
        assert torch.equal(a, b)


def test_an_lr_scheduler_sees_the_step_and_drives_the_update() -> None:
    def run(generic: bool) -> list[torch.Tensor]:
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        model, opt = ampcore.decorate(model, opt, device="cpu")
        if generic:
            opt.register_step_pre_hook(lambda *args: None)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()"
            for x, y in batches(3):
                opt.zero_grad()
                loss_of(model, x, y).backward()
                opt.step()
                sched.step()
        return [*masters_of(opt), *model.parameters()]

    for a, b in zip(run(False), run(True), strict=False):
        assert torch.equal(a, b)


def test_parameters_without_gradients_are_skipped_like_torch_does() -> None:
    model, opt = train_decorated(ADAMS["adamw"], 0)
    x, _ = batches(1)[0]
    model[0](x.to(BF16)).float().sum().backward()  # only the first Linear gets gradients
    before = [p.detach().clone() for p in masters_of(opt)]
    opt.step()
    assert len(opt.state) == 2 and not torch.equal(before[0], masters_of(opt)[0])
    assert all(torch.equal(a, b) for a, b in zip(before[2:], masters_of(opt)[2:], strict=False))


# -- resume in a new process, for every optimizer ----------------------------------------

RESUME: dict[str, MakeOpt] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw-amsgrad-fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5),
}


def run_phase(path: Path, start: int, stop: int) -> None:
    """For every optimizer of RESUME, train steps [start, stop), loading ``path`` first
    unless starting at 0; save models, optimizers and parameters after."""
    torch.set_num_threads(1)
    saved = torch.load(path) if start else {}
    out = {}
    for name, make_opt in RESUME.items():
        model = make_model()
        opt = make_opt(model.parameters())
        model, opt = ampcore.decorate(model, opt, device="cpu")
        if start:
            model.load_state_dict(saved[name]["model"])
            opt.load_state_dict(saved[name]["optimizer"])
        for x, y in batches(stop)[start:]:
            opt.zero_grad()
            with ampcore.autocast(device="cpu", level="O2"):
                loss = loss_of(model, x, y)
            loss.backward()
            opt.step()
        params = [p.detach().clone() for p in model.parameters()]
        out[name] = {"model": model.state_dict(), "optimizer": opt.state_dict(), "params": params}
    torch.save(out, path)


def _equal_nested(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal_nested(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal_nested(x, y) for x, y in zip(a, b, strict=False))
    return bool(a == b)


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every RESUME optimizer trained 4 steps straight, and 2 + 2 with a resume in between,
    each phase in a process of its own."""
    folder = tmp_path_factory.mktemp("resume")
    straight, resumed = folder / "straight.pt", folder / "resumed.pt"
    for path, start, stop in [(straight, 0, 4), (resumed, 0, 2), (resumed, 2, 4)]:
        subprocess.run([sys.executable, __file__, str(path), str(start), str(stop)], check=True)
    return torch.load(straight), torch.load(resumed)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESUME))
def test_resume_in_a_new_process_continues_exactly(
    name: str, resumed_runs: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    want, got = resumed_runs[0][name], resumed_runs[1][name]
    assert _equal_nested(got["params"], want["params"])
    assert _equal_nested(got["model"], want["model"])
    assert _equal_nested(got["optimizer"], want["optimizer"])


if __name__ == "__main__":
    run_phase(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
