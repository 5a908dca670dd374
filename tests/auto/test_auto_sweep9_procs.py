"""Issue 27, ninth held-out sweep: separate processes on one disk cache, with the real clock,
with and without bf16 hardware (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``), for a held-out kind
the fifth sweep's processes did not run (a small diffusion U-Net block: GroupNorm, a
timestep embedding, ``F.scaled_dot_product_attention``, a ``checkpoint``-ed and a plain
block of one class): cold, warm, a cache damaged with this sweep's kinds (an entry of the
wrong JSON type, the file nested deeper than the JSON reader), healed, then quiet.  Each
process checks its last step against the fixed precision its plan gives
(``_auto_testing.fixed``, the checkpointed block left to the autocast state as its
recompute runs it).  The decisions are whatever this machine measures: the tests check
where they came from, never a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

_CHILD = r"""
import copy, json, math, sys, warnings
sys.path.insert(0, sys.argv[1])
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
import ampcore
from _auto_testing import fixed

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.conv, self.t = nn.GroupNorm(4, 16), nn.Conv2d(16, 16, 3, padding=1), nn.Linear(32, 16)
        self.qkv, self.proj = nn.Linear(16, 48), nn.Linear(16, 16)
    def forward(self, x, temb):
        h = self.conv(F.silu(self.norm(x))) + self.t(temb)[:, :, None, None]
        s = h.flatten(2).transpose(1, 2)
        q, k, v = self.qkv(s).chunk(3, -1)
        s = self.proj(F.scaled_dot_product_attention(q, k, v))
        return x + s.transpose(1, 2).reshape(h.shape)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.a, self.b, self.head = nn.Conv2d(3, 16, 3, padding=1), Block(), Block(), nn.Conv2d(16, 3, 1)
    def forward(self, x, t):
        freqs = torch.exp(-math.log(1e4) * torch.arange(16) / 16)
        temb = torch.cat([(t[:, None] * freqs).sin(), (t[:, None] * freqs).cos()], -1)
        h = checkpoint(self.a, self.stem(x), temb, use_reentrant=False)
        return self.head(self.b(h, temb))

torch.manual_seed(0)
model = Net()
reference = copy.deepcopy(model)
x, t = torch.randn(4, 3, 16, 16), torch.rand(4) * 1000
QUIET = ("measuring the costs", "warm-up budget")  # (notes, not damage: a busy machine spends the budget)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    due = sorted(ampcore.auto_plan("cpu").due)
    for step in range(3):
        model.zero_grad(set_to_none=True)
        with ampcore.autocast("cpu", level="auto"):
            out = model(x, t)
        out.float().sum().backward()
plan = ampcore.auto_plan("cpu")
handles = [m.register_forward_pre_hook(lambda mod, a: torch.set_autocast_enabled("cpu", True))
           for m in reference.a.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
verdicts = {c.verdict for c in plan.roots.values()}
same = None
if verdicts <= {"plan"}:  # (a whole-call verdict low or fp32 runs another program: not compared)
    with fixed(torch.bfloat16):
        want = reference(x, t)
    want.float().sum().backward()
    pairs = zip(model.parameters(), reference.parameters())
    same = torch.equal(out, want) and all(torch.equal(p.grad, q.grad) for p, q in pairs)
print(json.dumps({
    "measured": any("measuring the costs" in str(w.message) for w in caught),
    "warnings": [str(w.message) for w in caught if not any(s in str(w.message) for s in QUIET)],
    "sources": sorted({e.source for e in plan.entries.values()}),
    "same": same,
    "due": due,
}))
"""


def _child(cache: Path, isa: str | None) -> dict[str, Any]:
    env = {**os.environ, "AMPCORE_AUTO_CACHE": str(cache), "AMPCORE_AUTO_BUDGET": "60"}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa is not None:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    here = str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, here], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["same"] in (True, None), "the results differ from the plan's fixed precision"
    return found


def _quiet(found: dict[str, Any]) -> bool:
    """A warm process: nothing measured but the classes read provisional (measured busy)."""
    if not found["due"]:
        return not found["measured"] and found["sources"] == ["cache"]
    return set(found["sources"]) <= {"cache", "measured"}


@pytest.mark.parametrize("isa", [None, "AVX512_CORE"], ids=["own-isa", "no-bf16-hardware"])
def test_cold_warm_damaged_and_healed_caches_across_processes(isa: str | None, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = _child(cache, isa)
    assert cold["measured"] and cold["sources"] == ["measured"] and cold["warnings"] == []
    warm = _child(cache, isa)
    assert _quiet(warm) and warm["warnings"] == []
    (path,) = cache.glob("auto-*.json")
    data = json.loads(path.read_text())
    key = next(iter(data["entries"]))
    data["entries"][key] = [data["entries"][key]]  # an entry of the wrong JSON type
    path.write_text(json.dumps(data))
    healed = _child(cache, isa)
    assert healed["measured"] and any(key[:20] in w for w in healed["warnings"]), healed["warnings"]
    path.write_text("[" * 100_000 + "]" * 100_000)  # deeper than the JSON reader's recursion
    again = _child(cache, isa)
    assert again["measured"] and any("not readable JSON" in w for w in again["warnings"]), again["warnings"]
    quiet = _child(cache, isa)
    assert _quiet(quiet) and quiet["warnings"] == []
