"""Run in a fresh process by test_privateuse1_device.py (one PrivateUse1 device per process).

``python _acme_probe.py MODE`` (``AMPCORE_ACME_AUTOCAST=MODE`` is set by the caller) prints
one JSON object: the dtype every probe op returned in every region, with the dtype the
backend's lists say; whether GradScaler skipped a step with an inf; an O2 training run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import ampcore

DEVICE = "acme"
#: probe name -> (ATen op whose list decides, call on float32 inputs x, y, w, b, input dtype)
PROBES: dict[str, tuple[str, Callable[..., torch.Tensor], bool]] = {
    "torch.mm": ("mm", lambda x, y, w, b, low: torch.mm(x, y), False),
    "F.linear": ("linear", lambda x, y, w, b, low: F.linear(x, w, b), False),
    "x + y": ("add", lambda x, y, w, b, low: x + y, False),
    "F.softmax": ("softmax", lambda x, y, w, b, low: F.softmax(x, -1), False),
    "F.softmax(low)": ("softmax", lambda x, y, w, b, low: F.softmax(x.to(low), -1), True),
    "F.mse_loss": ("mse_loss", lambda x, y, w, b, low: F.mse_loss(x, y), False),
}
#: (label, level, custom white, custom black)
REGIONS: list[tuple[str, str, set[str] | None, set[str] | None]] = [
    ("O1 first", "O1", None, None),
    ("O1 custom", "O1", {"add"}, {"mm"}),
    ("O1 after custom", "O1", None, None),
    ("OD", "OD", None, None),
    ("O2", "O2", None, None),
    ("O2 custom", "O2", None, {"linear"}),
    ("O1 last", "O1", None, None),
]


def expected(lists: ampcore.OpLists, op: str, low: torch.dtype, input_low: bool) -> torch.dtype:
    """What the lists say ``op`` returns for float32 (or ``low``) inputs."""
    category = lists.category(op)
    given = low if input_low else torch.float32
    return {
        "white": low,
        "black": torch.float32,
        "promote": given,
        "follow-inputs": given,
        "float32": torch.float32,
        "low-precision": low,
    }[category]


def dtypes(low: torch.dtype) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(4, 4, generator=gen).to(DEVICE) for _ in range(2))
    w, b = torch.randn(3, 4, generator=gen).to(DEVICE), torch.randn(3, generator=gen).to(DEVICE)
    rows = []
    for label, level, white, black in REGIONS:
        lists = ampcore.oplists(DEVICE, dtype=low, level=level, custom_white_list=white, custom_black_list=black)
        with ampcore.autocast(DEVICE, dtype=low, level=level, custom_white_list=white, custom_black_list=black):
            for probe, (op, call, input_low) in PROBES.items():
                got = call(x, y, w, b, low).dtype
                want = expected(lists, op, low, input_low)
                rows.append({"dtype": str(low), "region": label, "probe": probe, "got": str(got), "want": str(want)})
    return rows


def scaler_skips_inf() -> dict[str, Any]:
    model = torch.nn.Linear(4, 2).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampcore.GradScaler(DEVICE, dtype=torch.float16, init_scale=1024.0)
    with ampcore.autocast(DEVICE, dtype=torch.float16):
        loss = model(torch.ones(3, 4, device=DEVICE)).float().sum()
    scaler.scale(loss).backward()
    model.weight.grad[0, 0] = float("inf")  # planted
    before = model.weight.detach().cpu().clone()
    scaler.step(opt)
    scaler.update()
    return {"unchanged": bool(torch.equal(before, model.weight.detach().cpu())), "scale": float(scaler.get_scale())}


def o2_trains() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = ampcore.decorate(model, opt, level="O2", device=DEVICE, dtype=torch.bfloat16)
    x = torch.randn(64, 8).to(DEVICE)
    target = x.sum(1, keepdim=True).tanh()
    losses = []
    for _ in range(30):
        with ampcore.autocast(DEVICE, dtype=torch.bfloat16, level="O2"):
            loss = F.mse_loss(model(x).float(), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"first": losses[0], "last": losses[-1], "param_dtype": str(next(model.parameters()).dtype)}


def main() -> None:
    ampcore.get_backend(DEVICE).require_available()  # installs the device
    rows = dtypes(torch.bfloat16) + dtypes(torch.float16)
    print(json.dumps({"mode": sys.argv[1], "rows": rows, "scaler": scaler_skips_inf(), "o2": o2_trains()}))


if __name__ == "__main__":
    main()
