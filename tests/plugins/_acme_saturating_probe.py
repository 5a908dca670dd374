"""Run in a fresh process by test_saturating_device.py, with ``AMPCORE_ACME_FP16=saturate``.

Prints one JSON object: what the saturating fp16-only test device does on overflow, whether
GradScaler skips a step whose forward overflowed in any micro-batch (with and without
``unscale_`` + clipping), what ``check_numerics`` names, and how dtypes are chosen there.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import ampcore_testdevice
import torch

import ampcore
import ampcore.debugging

DEVICE = "acme"


def overflow() -> dict[str, Any]:
    ampcore_testdevice.clear_overflow_flag()
    clean = float(ampcore_testdevice.overflow_flag().cpu())
    y = torch.full((2,), 65504.0, dtype=torch.float16, device=DEVICE) * 2
    return {"clean": clean, "result": y.cpu().tolist(), "flag": float(ampcore_testdevice.overflow_flag().cpu())}


def accumulate(micro_batches: int, overflow_in: int | None, clip: bool) -> dict[str, Any]:
    """Issue 25's reproduction: a Linear whose fp16 output saturates (96000), init_scale=1."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4).to(DEVICE)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    scaler = ampcore.GradScaler(DEVICE, init_scale=1.0)
    for micro in range(micro_batches):
        x = torch.full((2, 4), 24000.0 if micro == overflow_in else 1.0).to(DEVICE)
        with ampcore.autocast(DEVICE):
            out = layer(x)
        scaler.scale(out.float().mean() * 1e-5).backward()
    if clip:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm=1.0)
    before = layer.weight.detach().cpu().clone()
    scaler.step(opt)
    scaler.update()
    return {"stepped": not torch.equal(before, layer.weight.detach().cpu()), "scale": scaler.get_scale()}


def numerics() -> dict[str, Any]:
    layer = torch.nn.Linear(4, 4).to(DEVICE)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    x = torch.full((2, 4), 24000.0).to(DEVICE)  # 96000 in float16: saturates at 65504
    ampcore_testdevice.clear_overflow_flag()
    found: dict[str, Any] = {}
    try:
        with ampcore.debugging.check_numerics(), ampcore.autocast(DEVICE):
            torch.relu(layer(x))
    except ampcore.debugging.NumericsError as error:
        found = {"op": error.op, "kind": error.finding.kind, "message": str(error)}
    found["flag_after"] = float(ampcore_testdevice.overflow_flag().cpu())  # raised again for the scaler
    ampcore_testdevice.clear_overflow_flag()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with ampcore.debugging.check_numerics(raise_on_error=False) as checker, ampcore.autocast(DEVICE):
            torch.relu(layer(x)).sum()
    found["report"] = [(f.op, f.kind) for f in checker.findings]
    found["flag_after_report"] = float(ampcore_testdevice.overflow_flag().cpu())
    ampcore_testdevice.clear_overflow_flag()
    return found


def dtypes() -> dict[str, Any]:
    with ampcore.autocast(DEVICE):
        default = str(torch.get_autocast_dtype(DEVICE))
    try:
        ampcore.autocast(DEVICE, dtype=torch.bfloat16)
        refused = ""
    except ampcore.AmpcoreError as exc:
        refused = str(exc)
    backend = ampcore.get_backend(DEVICE)
    return {
        "declared": [str(d) for d in backend.supported_dtypes],
        "device": [str(d) for d in ampcore.toolkit.device_dtypes(backend)],
        "default": default,
        "bf16_supported": ampcore.is_bfloat16_supported(DEVICE),
        "refused": refused,
    }


def main() -> None:
    ampcore.get_backend(DEVICE).require_available()
    scaler = {
        f"{k + 1}of{n}{'-clip' if clip else ''}": accumulate(n, k, clip)
        for n in (1, 2, 3) for k in range(n) for clip in (False, True)
    }  # fmt: skip
    scaler["clean"] = accumulate(2, None, False)
    print(json.dumps({"overflow": overflow(), "scaler": scaler, "numerics": numerics(), "dtypes": dtypes()}))


if __name__ == "__main__":
    main()
