"""``bench_o2_update.py --check`` on a device, kernel by kernel (issue 31).

Two questions the next GPU session answers in one run:

* **which formula torch's CUDA fused Adam computes** (``tests/o2/fused_adam_reference.py``:
  ``opmath``, torch's current source, or ``double``, the older one): the transcription of
  each against ``torch._fused_adam_``/``_fused_adamw_`` itself, per state tensor;
* **whether ampcore's Triton kernel is torch's kernel bit for bit**: ``launch_adam`` with
  each formula against the same call, per state tensor (and its low-precision copy against
  the master rounded), plainly and under a GradScaler's ``grad_scale``/``found_inf`` (a
  clean step, a skipped one, a clean one);

and a GradScaler training row: O2 with fused AdamW under ``ampcore.GradScaler`` (an
overflow at the second step) against torch's fused AdamW on float32 masters under
``torch.amp.GradScaler``, with torch's kernel and with the Triton kernel.

One tensor of 2**20 + 3 elements (both of torch's code paths: aligned, and the ragged
tail), gradients of mixed magnitude, 3 steps.  Each line: ``yes`` or which states differ
and in how many elements.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Final

import torch
from torch import nn

import ampcore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "o2"))
from fused_adam_reference import reference_step  # noqa: E402  (a module of the tests)

__all__ = ["kernel_rows", "scaler_rows"]

SIZE: Final = (1 << 20) + 3
#: (name, param group options, found_inf per step or None for no GradScaler)
CASES: Final[tuple[tuple[str, dict[str, Any], tuple[float, ...] | None], ...]] = (
    ("AdamW wd 0.01, GradScaler", {"weight_decay": 0.01}, (0.0, 1.0, 0.0)),
    ("Adam wd 0.01 amsgrad maximize", {"weight_decay": 0.01, "decoupled_weight_decay": False,
                                       "amsgrad": True, "maximize": True}, None),
)  # fmt: skip
Tensors = dict[str, torch.Tensor]


def _group(options: dict[str, Any]) -> dict[str, Any]:
    group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False}
    group.update({"maximize": False, "decoupled_weight_decay": True, **options})
    return group


def _state(device: str, amsgrad: bool) -> Tensors:
    names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg", "exp_avg_sq")
    return {"step": torch.zeros((), device=device), **{n: torch.zeros(SIZE, device=device) for n in names}}


def _torch_step(group: dict[str, Any], master: torch.Tensor, grad: torch.Tensor, state: Tensors, **scaler: Any) -> None:
    """torch's fused kernel as ``torch/optim/adam.py``'s ``_fused_adam`` calls it."""
    fused = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
    maxes = [state["max_exp_avg_sq"]] if group["amsgrad"] else []
    state["step"] += 1
    fused(
        [master], [grad.float()], [state["exp_avg"]], [state["exp_avg_sq"]], maxes, [state["step"]],
        lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1], weight_decay=group["weight_decay"],
        eps=group["eps"], amsgrad=group["amsgrad"], maximize=group["maximize"], **scaler,
    )  # fmt: skip
    if scaler.get("found_inf") is not None:
        state["step"] -= scaler["found_inf"]


def _verdict(got: Tensors, want: Tensors) -> str:
    """``yes``, or per state: equal, or how many elements differ and by how much at most."""
    parts, same = [], True
    for name, value in want.items():
        if torch.equal(got[name], value):
            parts.append(f"{name} equal")
            continue
        same = False
        differ = int((got[name] != value).sum())
        worst = float((got[name].double() - value.double()).abs().max())
        parts.append(f"{name} {differ} of {value.numel()} differ (by <= {worst:.3g})")
    return "yes" if same else "NO: " + "; ".join(parts)


def kernel_rows(device: str, triton: bool) -> None:
    """Print, per case, the transcriptions and (with ``triton``) the Triton kernel with each
    formula against torch's fused kernel on ``device``."""
    for name, options, flags in CASES:
        group = _group(options)
        gen = torch.Generator().manual_seed(0)
        start = torch.randn(SIZE, generator=gen).to(device)
        grads = [(torch.randn(SIZE, generator=gen) * 10.0 ** (k - 1)).to(device, torch.float16) for k in range(3)]
        runs: dict[str, Tensors] = {}
        for label in ("torch", "reference opmath", "reference double", "triton opmath", "triton double"):
            if label.startswith("triton") and not triton:
                continue
            runs[label] = _run(label, group, start, grads, flags, device)
        want = runs.pop("torch")
        for label, got in runs.items():
            line = f"fused {name}, {label} vs torch's {device} kernel: {_verdict(got, want)}"
            if "low" in got:
                line += f"; its float16 copy is the master rounded: {torch.equal(got['low'], got['master'].half())}"
            print(line)


def _run(
    label: str, group: dict[str, Any], start: torch.Tensor, grads: list[torch.Tensor],
    flags: tuple[float, ...] | None, device: str,
) -> Tensors:  # fmt: skip
    master, state = start.clone(), _state(device, group["amsgrad"])
    low = master.half()
    for step, grad in enumerate(grads):
        scaler: dict[str, Any] = {}
        if flags is not None:
            scaler = {"grad_scale": torch.tensor(1024.0, device=device)}
            scaler["found_inf"] = torch.tensor(flags[step], device=device)
        if label == "torch":
            _torch_step(group, master, grad, state, **scaler)
        elif label.startswith("reference"):
            reference_step(group, state, master, grad, label.split()[1], **scaler)
        else:
            from ampcore._o2.triton_adam import launch_adam

            launch_adam(group, [master], [grad], [low], [state], label.split()[1], **scaler)
    out = {"master": master, **state}
    if label.startswith("triton"):
        out["low"] = low
    return out


def scaler_rows(device: str, low: torch.dtype, kernels: list[str]) -> None:
    """O2 + fused AdamW under ampcore's GradScaler against torch's fused AdamW on float32
    masters under torch's GradScaler (4 steps, the second overflowing), per kernel."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(1031, 601, device=device), nn.Linear(601, 7, device=device))
    want = _scaled_reference(base, low, device)
    for kernel in kernels:
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
        model, opt = ampcore.decorate(model, opt, level="O2", device=device, dtype=low)
        ampcore.set_master_update_kernel(opt, kernel)  # type: ignore[arg-type]
        scaler = ampcore.GradScaler(device, dtype=low, init_scale=1024.0)
        for step in range(4):
            opt.zero_grad()
            with ampcore.autocast(device=device, level="O2", dtype=low):
                loss = _loss(model, step, device)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        masters = [p for g in opt.param_groups for p in g["params"]]
        got = _flatten(masters, opt.state, float(scaler.get_scale()))
        print(f"O2 fused AdamW under GradScaler, {kernel} kernel, vs torch on fp32 masters: {_verdict(got, want)}")


def _loss(model: nn.Module, step: int, device: str) -> torch.Tensor:
    x = torch.randn(16, 1031, generator=torch.Generator().manual_seed(step)).to(device)
    return model(x).float().pow(2).mean() * (1e9 if step == 1 else 1.0)


def _scaled_reference(base: nn.Module, low: torch.dtype, device: str) -> Tensors:
    lowm = ampcore.decorate(copy.deepcopy(base), level="O2", device=device, dtype=low, master_weight=False)
    masters = [p.detach().clone().requires_grad_() for p in base.parameters()]
    ref = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.01, fused=True)
    scaler = torch.amp.GradScaler(device, init_scale=1024.0, enabled=low == torch.float16)
    for step in range(4):
        lowm.zero_grad()
        with ampcore.autocast(device=device, level="O2", dtype=low):
            loss = _loss(lowm, step, device)
        scaler.scale(loss).backward()
        for master, param in zip(masters, lowm.parameters(), strict=True):
            master.grad = param.grad.float()
        scaler.step(ref)
        scaler.update()
        with torch.no_grad():
            for param, master in zip(lowm.parameters(), masters, strict=True):
                param.copy_(master)
    return _flatten(masters, ref.state, float(scaler.get_scale()) if low == torch.float16 else 1.0)


def _flatten(masters: list[torch.Tensor], state: Any, scale: float) -> Tensors:
    out = {"masters": torch.cat([m.detach().reshape(-1) for m in masters]), "scale": torch.tensor(scale)}
    for name in ("exp_avg", "exp_avg_sq", "step"):
        out[name] = torch.cat([state[m][name].reshape(-1).to("cpu") for m in masters])
    out["masters"] = out["masters"].to("cpu")
    return out
