"""Run in a fresh process by test_plain_autocast_after_regions.py (``AMPCORE_ACME_AUTOCAST``
set by the caller): what plain ``torch.autocast`` gives on the test device before and after
ampcore regions of every kind.  Prints one JSON object."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.nn.functional as F

import ampcore
from ampcore import toolkit

DEVICE = "acme"
#: (label, ampcore.autocast keyword arguments) of the regions run between the two probes
REGIONS: list[tuple[str, dict[str, Any]]] = [
    ("empty OD", {"level": "OD"}),
    ("O2", {"level": "O2"}),
    ("custom white", {"level": "O1", "custom_white_list": {"add"}}),
    ("custom black", {"level": "O1", "custom_black_list": {"mm"}}),
    ("O1", {"level": "O1"}),
]


def plain() -> dict[str, Any]:
    """The dtype each op returns under plain torch.autocast, for float32 and float16 inputs."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 4, generator=gen).to(DEVICE)
    h = x.half()
    calls = {
        "softmax(fp16)": lambda: F.softmax(h, -1),
        "softmax": lambda: F.softmax(x, -1),
        "mm": lambda: torch.mm(x, x),
        "addmm": lambda: torch.addmm(x, x, x),
        "dot(fp16)": lambda: torch.dot(h[0], h[1]),
        "linear": lambda: F.linear(x, x),
        "add(mixed)": lambda: h + x,
        "mse_loss(fp16)": lambda: F.mse_loss(h, h),
        "exp(fp16)": lambda: torch.exp(h),
    }
    out: dict[str, Any] = {}
    with torch.autocast(DEVICE, dtype=torch.float16):
        for name, call in calls.items():
            try:
                out[name] = str(call().dtype)
            except RuntimeError as exc:  # mode "none": torch.autocast alone cannot run
                out[name] = f"error: {str(exc).splitlines()[0][:60]}"
    out["has_native_autocast"] = toolkit.has_native_autocast(DEVICE)
    return out


def main() -> None:
    before = plain()
    ampcore.get_backend(DEVICE).require_available()
    loaded = plain()
    after = {}
    for label, kwargs in REGIONS:
        with ampcore.autocast(DEVICE, dtype=torch.float16, **kwargs):
            torch.mm(torch.ones(2, 2, device=DEVICE), torch.ones(2, 2, device=DEVICE))
        after[label] = plain()
    print(json.dumps({"before": before, "loaded": loaded, "after": after}))


if __name__ == "__main__":
    main()
