"""Checkpoints of O2-decorated models carry the fp32 masters; a resume is exact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ampcore

BF16, FP32 = torch.bfloat16, torch.float32


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def decorated(seed: int = 0, **kwargs: object) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return ampcore.decorate(model, opt, device="cpu", **kwargs)  # type: ignore[arg-type]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)


def train(
    model: nn.Module, opt: torch.optim.Optimizer, scaler: ampcore.GradScaler, sched: object, steps: range
) -> None:
    for step in steps:
        x, y = batch(step)
        opt.zero_grad()
        with ampcore.autocast(device="cpu", level="O2"):
            loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()  # type: ignore[attr-defined]


def masters(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def trained(steps: int = 3, **kwargs: object) -> tuple[nn.Module, torch.optim.Optimizer]:
    model, opt = decorated(**kwargs)
    scaler = ampcore.GradScaler("cpu")
    train(model, opt, scaler, torch.optim.lr_scheduler.StepLR(opt, 2), range(steps))
    return model, opt


def test_state_dict_has_the_undecorated_keys_and_the_exact_fp32_masters() -> None:
    model, opt = trained()
    state = model.state_dict()
    assert list(state) == list(make_model().state_dict())
    linear = masters(opt)[0]
    assert state["0.weight"].dtype == FP32 and torch.equal(state["0.weight"], linear)
    assert state["0.weight"].data_ptr() == linear.data_ptr()  # aliases, like torch's state dicts
    assert not torch.equal(linear, linear.to(BF16).float())  # more than the bf16 weights hold
    assert state["1.num_batches_tracked"].dtype == torch.long
    assert model.state_dict(keep_vars=True)["0.weight"] is linear


def test_save_dtype_casts_every_floating_entry() -> None:
    model, _ = trained(save_dtype=BF16)
    state = model.state_dict()
    assert {k: v.dtype for k, v in state.items() if k != "1.num_batches_tracked"} == dict.fromkeys(
        [k for k in state if k != "1.num_batches_tracked"], BF16
    )
    assert state["1.num_batches_tracked"].dtype == torch.long


def test_submodule_state_dicts_carry_masters_too() -> None:
    model, opt = trained()
    assert torch.equal(model[3].state_dict()["weight"], masters(opt)[-2])


def test_a_plain_fp32_model_loads_a_decorated_checkpoint_exactly() -> None:
    model, opt = trained()
    plain = make_model(seed=5)
    plain.load_state_dict(model.state_dict())
    assert torch.equal(plain[0].weight, masters(opt)[0]) and plain[0].weight.dtype == FP32


def test_a_decorated_model_loads_an_fp32_checkpoint_into_its_masters() -> None:
    source = make_model(seed=7)
    model, opt = decorated()
    model.load_state_dict(source.state_dict())
    assert torch.equal(masters(opt)[0], source[0].weight)
    assert torch.equal(model[0].weight, source[0].weight.to(BF16))
    x, y = batch(0)
    nn.functional.mse_loss(model(x).float(), y).backward()
    opt.step()  # the load is not mistaken for an outside change to adopt (which would round)
    assert not torch.equal(masters(opt)[0], masters(opt)[0].to(BF16).float())


def test_optimizer_state_dict_carries_the_masters_and_restores_them() -> None:
    model, opt = trained(save_dtype=BF16)
    saved_model, saved_opt = model.state_dict(), opt.state_dict()
    assert sorted(saved_opt["master_weights"]) == [0, 1, 2, 3, 4, 5]  # with BatchNorm's fp32 ones
    assert all(v.dtype == FP32 for v in saved_opt["master_weights"].values())
    assert all(t.dtype == FP32 for s in saved_opt["state"].values() for k, t in s.items() if k != "step")
    fresh_model, fresh_opt = decorated(seed=9, save_dtype=BF16)
    fresh_model.load_state_dict(saved_model)  # bf16 checkpoint: the masters lose precision...
    assert not all(torch.equal(a, b) for a, b in zip(masters(fresh_opt), masters(opt), strict=False))
    fresh_opt.load_state_dict(saved_opt)  # ...which the optimizer's masters give back
    assert all(torch.equal(a, b) for a, b in zip(masters(fresh_opt), masters(opt), strict=False))
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.parameters(), model.parameters(), strict=False))
    assert masters(fresh_opt)[0] is not fresh_model[0].weight
    assert fresh_opt.state[masters(fresh_opt)[0]]["exp_avg"].dtype == FP32


def test_a_plain_optimizer_loads_a_decorated_optimizer_state() -> None:
    model, opt = trained()
    plain = make_model()
    plain.load_state_dict(model.state_dict())
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
    plain_opt.load_state_dict(opt.state_dict())
    assert torch.equal(plain_opt.state[plain[0].weight]["exp_avg"], opt.state[masters(opt)[0]]["exp_avg"])


def test_a_master_weight_of_the_wrong_shape_loads_nothing() -> None:
    model, opt = trained()
    saved = opt.state_dict()
    saved["master_weights"] = {**saved["master_weights"], 1: torch.zeros(3)}
    before = [m.clone() for m in masters(opt)]
    with pytest.raises(
        ampcore.AmpcoreError, match=r"master weight 1 has shape \(3,\), .* shape \(16,\); nothing was loaded"
    ):
        opt.load_state_dict(saved)
    assert all(torch.equal(a, b) for a, b in zip(masters(opt), before, strict=False))


def test_load_with_assign_is_refused() -> None:
    model, _ = decorated()
    with pytest.raises(ampcore.AmpcoreError, match=r"assign=True"):
        model.load_state_dict(make_model().state_dict(), assign=True)


# -- resume in a new process ------------------------------------------------------------


def run_phase(phase: str, path: Path, start: int, stop: int) -> None:
    """Train steps [start, stop), loading ``path`` first unless starting at 0; save after."""
    torch.set_num_threads(1)
    model, opt = decorated(seed=3)
    scaler = ampcore.GradScaler("cpu")
    sched = torch.optim.lr_scheduler.StepLR(opt, 20, gamma=0.5)
    if start:
        saved = torch.load(path)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        scaler.load_state_dict(saved["scaler"])
        sched.load_state_dict(saved["scheduler"])
    train(model, opt, scaler, sched, range(start, stop))
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict(),
            "scheduler": sched.state_dict(),
            "params": [p.detach().clone() for p in model.parameters()],
        },
        path,
    )


@pytest.mark.slow
def test_resume_in_a_new_process_continues_exactly(tmp_path: Path) -> None:
    straight, first, second = tmp_path / "straight.pt", tmp_path / "half.pt", tmp_path / "resumed.pt"
    for args in [(straight, 0, 100), (first, 0, 50)]:
        subprocess.run([sys.executable, __file__, str(args[0]), str(args[1]), str(args[2])], check=True)
    second.write_bytes(first.read_bytes())
    subprocess.run([sys.executable, __file__, str(second), "50", "100"], check=True)
    want, got = torch.load(straight), torch.load(second)
    assert all(torch.equal(a, b) for a, b in zip(want["params"], got["params"], strict=False))
    assert all(torch.equal(a, b) for a, b in zip(want["model"].values(), got["model"].values(), strict=False))
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            want["optimizer"]["master_weights"].values(), got["optimizer"]["master_weights"].values(), strict=False
        )
    )
    half = torch.load(first)["optimizer"]["master_weights"][0]
    assert not torch.equal(half, half.to(BF16).float())  # a bf16-only resume would differ


if __name__ == "__main__":
    run_phase("cli", Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
