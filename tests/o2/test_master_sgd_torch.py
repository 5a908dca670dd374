"""``torch.optim.SGD`` with ``fused=True`` or with momentum on O2 master weights (issue 31).

torch's SGD takes gradients in the parameters' dtype only, so the generic path gave every
master a freshly allocated float32 copy of its gradient each step (on the CPU the page
faults of those copies cost more than the update).  ampcore now calls torch's SGD itself
on the masters (the group's flavour: fused kernel, foreach or for-loop), widening the
low-precision gradients chunk by chunk (the CPU) or in one multi-tensor copy per slice
(whole tensors): no master holds a float32 gradient, and the results, momentum buffers
included, are torch's SGD's of the same flavour on float32 masters bit for bit, so state
dicts go either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch
from test_master_update_whole import (
    WHOLE,
    _CountOps,
    _whole_tensor_adapter,
    backward,
    decorated,
    reference_optimizer,
)
from test_scaler_fused import FloatAllocations
from torch import nn

import ampcore
from ampcore._o2 import onepass, onepass_loop
from ampcore._o2.master import master_weights_of

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
__all__ = ["_whole_tensor_adapter"]  # (the fixture registering the whole-tensor adapter)
MakeOpt = Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]

FUSED_SGD: dict[str, MakeOpt] = {
    "fused": lambda p: torch.optim.SGD(p, lr=0.05, fused=True),
    "fused-decay-maximize": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.01, maximize=True, fused=True),
    "fused-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
    "fused-nesterov-decay": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, fused=True
    ),
    "fused-dampening": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, dampening=0.3, fused=True),
    # momentum, torch's default flavour (for-loop on the CPU), for-loop and foreach
    "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "momentum-forloop-nesterov-decay": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=False
    ),
    "momentum-foreach-dampening-maximize": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.5, dampening=0.3, maximize=True, foreach=True
    ),
    "momentum-foreach-nesterov-decay": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=True
    ),
}
#: 1031: weights of 1.06M elements, 4 CPU chunks and a partial one
WIDTHS = (96, 1031)


def trained(make_opt: MakeOpt, width: int, steps: int, dtype: torch.dtype, device: str) -> torch.optim.Optimizer:
    model, opt = decorated(make_opt, width, device=device, dtype=dtype)
    for step in range(steps):
        opt.zero_grad()
        backward(model, device, step)
        opt.step()
    return opt


def tensors_of(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    masters = [p for g in opt.param_groups for p in dict.__getitem__(g, "params")]
    state = [v for p in masters for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
    return masters + state


@pytest.mark.parametrize("device", ["cpu", WHOLE], ids=["chunks", "whole"])
@pytest.mark.parametrize("name", list(FUSED_SGD))
def test_fused_sgd_makes_no_float32_gradient_copy(name: str, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the generic path, a float32 copy of every gradient on the masters.  Now
    ampcore's update runs, and on the CPU's chunks the float32 it allocates stays within
    one chunk of scratch (whole tensors widen a slice, as Adam's update does)."""
    import ampcore._o2.own_update as master_module

    monkeypatch.setattr(onepass, "_module", lambda: None)  # torch's kernels (the one-pass kernel: test_onepass.py)
    monkeypatch.setattr(onepass_loop, "_module", lambda: None)  # (and that of the for-loop flavour)
    calls: list[int] = []
    original = master_module.fused_sgd_update
    monkeypatch.setattr(master_module, "fused_sgd_update", lambda *a: calls.append(1) or original(*a))
    model, opt = decorated(FUSED_SGD[name], 1031, device=device, dtype=FP16)
    weights = master_weights_of(opt)
    assert weights is not None
    for seed in (1, 2):  # the first step creates the momentum buffers
        opt.zero_grad()
        backward(model, device, seed)
        watch = FloatAllocations(weights.masters, floor=16)
        with watch, _CountOps() as counter:
            opt.step()
    assert calls == [1, 1]
    assert watch.most_grad_bytes == 0 and all(p.grad is None for p in weights.masters)
    assert counter.ops["_to_copy"] == 0, counter.ops  # (the generic path's copies)
    chunk = ampcore.get_backend("cpu").master_update_chunk_elements
    assert isinstance(chunk, int)
    if device == "cpu":  # a chunk of scratch and torch's SGD temporaries of one chunk
        total = sum(p.numel() * 4 for p in weights.masters)
        assert 0 < watch.most_live <= 4 * chunk * 4 < total, (watch.most_live, total)


@pytest.mark.parametrize("device", ["cpu", WHOLE], ids=["chunks", "whole"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(FUSED_SGD))
def test_fused_sgd_is_torchs_fused_sgd_bit_for_bit(name: str, dtype: torch.dtype, width: int, device: str) -> None:
    got = tensors_of(trained(FUSED_SGD[name], width, 3, dtype, device))
    want = tensors_of(reference_optimizer(FUSED_SGD[name], width, 3, dtype, device))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == FP32 and torch.equal(a, b)


@pytest.mark.parametrize("name", ["fused-nesterov-decay", "momentum-foreach-nesterov-decay", "momentum"])
@pytest.mark.parametrize("device", ["cpu", WHOLE], ids=["chunks", "whole"])
def test_state_dicts_go_either_way(device: str, name: str) -> None:
    """After 2 steps O2's state dict loads into torch's fused SGD on float32 parameters and
    torch's into O2's, each giving the other's float32 momentum buffers exactly."""
    make = FUSED_SGD[name]
    ours = trained(make, 96, 2, BF16, device)
    theirs = reference_optimizer(make, 96, 2, BF16, device)
    count = len(ours.state)
    _, resumed = decorated(make, 96, device=device, dtype=BF16)
    resumed.load_state_dict(theirs.state_dict())
    plain = make([nn.Parameter(t.detach().clone()) for t in tensors_of(ours)[:-count]])
    plain.load_state_dict(ours.state_dict())
    buffers = [tensors_of(opt)[-count:] for opt in (ours, theirs, resumed, plain)]
    assert all(len(b) == count and all(t.dtype == FP32 for t in b) for b in buffers)
    for got in buffers[1:]:
        assert all(torch.equal(a, b) for a, b in zip(buffers[0], got, strict=True))


@pytest.mark.parametrize("name", ["fused-nesterov-decay", "momentum-foreach-nesterov-decay"])
def test_whole_tensor_updates_dispatch_a_few_ops_per_group(name: str) -> None:
    """The GPU walk: widen, torch's fused or foreach SGD, refresh per group, whatever the
    sizes and depth."""
    from test_master_update_whole import ops_of_one_step

    make = FUSED_SGD[name]
    small, large, deeper = (ops_of_one_step(make, w, layers=n) for w, n in ((64, 3), (1031, 3), (64, 9)))
    assert small == large == deeper, (small, large, deeper)
    assert small["_foreach_copy_"] == 2 and sum(small.values()) <= 8, small
    assert all(op.startswith("_foreach") or op.startswith("_fused") for op in small), small


def test_a_step_hook_keeps_the_generic_path() -> None:
    """What ampcore does not run itself still gets torch's fused step, on float32 copies."""
    model, opt = decorated(FUSED_SGD["fused-momentum"], 96, device="cpu")
    opt.register_step_pre_hook(lambda *_: None)
    backward(model, "cpu")
    with _CountOps() as counter:
        opt.step()
    assert counter.ops["_foreach_copy_"] == 2 and counter.ops["_fused_sgd_"] == 1  # copies, step, refresh
