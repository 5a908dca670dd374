"""level="auto" against fp32 and torch.autocast (issue 16).

Models (training steps: forward, MSE loss, backward, SGD):

* ``mixed``: 4 x ``Linear(1024)`` (ReLU between) on a batch of 512, plus 48 small residual
  ``Linear(64)`` layers (``y = y + tanh(linear(y))``: bounded, no overflow) on a batch of 16; the sizes are
  ``--big``/``--big-batch``/``--small``/``--small-batch``/``--layers``;
* ``transformer``: a 4-layer ``nn.TransformerEncoder`` (d_model 256, 4 heads, feed-forward
  1024, dropout 0.1, batch_first) on batch 16 x 64 tokens, run with
  ``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` (no bf16 instructions; ``--isa`` changes it);
* ``seed``: 9 x ``Linear(2048)`` on batch 512 (``--models seed``; slow without bf16 hardware).

Each model runs in its own process (the ISA variable must be set before torch is imported),
with ``torch.set_flush_denormal(True)``.  Every mode trains its own copy of the model from the
same initial weights; each round runs one step of every mode (the order rotates), the first
``--warmup`` rounds untimed.  auto's first step (which measures the shape classes it meets;
disk cache off, so it always measures) is reported separately.  fp32 and torch.autocast run
with ampcore's auto hooks removed, so they pay nothing for them.  The table gives medians of
the timed rounds and the ratios of those medians (one run).

    python benchmarks/bench_auto.py                          # mixed + transformer
    python benchmarks/bench_auto.py --models transformer --rounds 7
    python benchmarks/bench_auto.py --lead-patch    # with the change proposed for _autocast.py
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Final

MODES: Final = ("fp32", "torch.autocast", "auto")


def _build(name: str, args: argparse.Namespace) -> tuple[Any, Callable[[], tuple[Any, ...]], Callable[..., Any]]:
    import torch
    from torch import nn

    if name == "mixed":

        class Mixed(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.big = nn.ModuleList(nn.Linear(args.big, args.big) for _ in range(4))
                self.small = nn.ModuleList(nn.Linear(args.small, args.small) for _ in range(args.layers))

            def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                for i, layer in enumerate(self.big):
                    x = layer(x) if i == len(self.big) - 1 else torch.relu(layer(x))
                for layer in self.small:
                    y = y + torch.tanh(layer(y))
                return x, y

        data = (torch.rand(args.big_batch, args.big), torch.rand(args.small_batch, args.small))

        def loss(out: tuple[torch.Tensor, torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
            return nn.functional.mse_loss(out[0].float(), inputs[0]) + nn.functional.mse_loss(out[1].float(), inputs[1])

        return Mixed(), lambda: data, loss
    if name == "transformer":
        layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.1, batch_first=True)
        model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        data = (torch.randn(16, 64, 256),)
        return model, lambda: data, lambda out, inputs: nn.functional.mse_loss(out.float(), inputs[0])
    if name == "seed":
        from ampcore._cli.experiment import SeedNet

        data = (torch.rand(512, 2048),)
        return SeedNet(2048), lambda: data, lambda out, inputs: nn.functional.mse_loss(out.float(), inputs[0])
    raise SystemExit(f"unknown model {name!r}; valid: mixed, transformer, seed")


def _emulate_lead_patch() -> None:
    """The change proposed for the lead-owned ampcore/_policy/autocast.py: an auto region without
    custom lists uses torch's own kernels (as uncustomised O1) instead of ampcore's Python
    policy kernels; its plan acts through the module hooks either way."""
    from ampcore._policy import autocast as _autocast
    original = _autocast.autocast._policy_of

    def policy_of(self: Any, white: frozenset[str], black: frozenset[str]) -> Any:
        if (
            self.enabled and self.level == "auto" and not white and not black
            and not self.backend.op_list_adjustments(self.dtype) and _autocast.has_native_autocast(self.device_type)
        ):
            return None
        return original(self, white, black)

    _autocast.autocast._policy_of = policy_of  # type: ignore[method-assign]


def child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one model's modes in this process; return the measurements."""
    import torch

    import ampcore
    from ampcore._auto import _hooks

    if args.lead_patch:
        _emulate_lead_patch()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base, data, loss_of = _build(name, args)
    regions: dict[str, Callable[[], Any]] = {
        "fp32": lambda: torch.autocast("cpu", enabled=False),
        "torch.autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    }
    auto_region = ampcore.autocast("cpu", dtype=torch.bfloat16, level="auto")  # installs the hooks
    regions["auto"] = lambda: auto_region
    models = {mode: copy.deepcopy(base) for mode in MODES}
    opts = {mode: torch.optim.SGD(models[mode].parameters(), lr=1e-4) for mode in MODES}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    losses: dict[str, float] = {}
    first_auto_ms = None
    for round_ in range(args.warmup + args.rounds):
        order = MODES[round_ % len(MODES) :] + MODES[: round_ % len(MODES)]
        for mode in order:
            if mode == "auto":
                _hooks.install()
            else:
                _hooks.uninstall()
            inputs = data()
            start = time.perf_counter()
            with regions[mode]():
                out = models[mode](*inputs)
                loss = loss_of(out, inputs)
            loss.backward()
            opts[mode].step()
            opts[mode].zero_grad(set_to_none=True)
            elapsed = (time.perf_counter() - start) * 1e3
            losses[mode] = float(loss)
            if mode == "auto" and first_auto_ms is None:
                first_auto_ms = elapsed
            elif round_ >= args.warmup:
                times[mode].append(elapsed)
    plan = ampcore.auto_plan("cpu")
    return {
        "model": name,
        "median_ms": {mode: statistics.median(t) for mode, t in times.items()},
        "times": times,
        "losses": losses,
        "first_auto_ms": first_auto_ms,
        "measure_s": _hooks._process.spent_s,
        "decisions": {key: e.decision for key, e in plan.entries.items()},
        "table": plan.table(),
        "threads": torch.get_num_threads(),
    }


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mixed", "transformer"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--isa", default="AVX512_CORE", help="ONEDNN_MAX_CPU_ISA for the transformer ('' to leave unset)")
    parser.add_argument("--big", type=int, default=1024)
    parser.add_argument("--big-batch", type=int, default=512)
    parser.add_argument("--small", type=int, default=64)
    parser.add_argument("--small-batch", type=int, default=16)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable on a shared machine)")
    parser.add_argument("--lead-patch", action="store_true", help="emulate the proposed change to ampcore/_policy/autocast.py (see _emulate_lead_patch)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the measurements as JSON")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    print(f"load average at start: {_load()} ({os.cpu_count()} CPUs)" + (", lead patch emulated" if args.lead_patch else ""))
    results = []
    for name in args.models:
        env = {**os.environ, "AMPCORE_AUTO_CACHE": "off"}
        if name == "transformer" and args.isa:
            env["ONEDNN_MAX_CPU_ISA"] = args.isa
        cmd = [sys.executable, __file__, "--child", name, *_passthrough(args)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stderr}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["isa"] = env.get("ONEDNN_MAX_CPU_ISA", "")
        results.append(result)
        _print(result)
    print(f"load average at end: {_load()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _passthrough(args: argparse.Namespace) -> list[str]:
    out = ["--rounds", str(args.rounds), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    if args.lead_patch:
        out.append("--lead-patch")
    for name in ("big", "big_batch", "small", "small_batch", "layers"):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return out


def _print(r: dict[str, Any]) -> None:
    med = r["median_ms"]
    isa = f", ONEDNN_MAX_CPU_ISA={r['isa']}" if r["isa"] else ""
    low = sum(1 for d in r["decisions"].values() if d == "low")
    print(f"\n{r['model']}{isa} ({r['threads']} threads), median of {len(r['times']['fp32'])} interleaved rounds")
    print(f"{'mode':<16}{'ms/step':>10}{'/ fp32':>9}{'/ torch.autocast':>18}{'final loss':>12}")
    for mode in MODES:
        print(f"{mode:<16}{med[mode]:>10.1f}{med[mode] / med['fp32']:>9.2f}{med[mode] / med['torch.autocast']:>18.2f}{r['losses'][mode]:>12.5f}")
    print(
        f"auto: first step {r['first_auto_ms']:.0f} ms (measuring {r['measure_s']:.1f} s); "
        f"{len(r['decisions'])} shape classes, {low} low precision, {len(r['decisions']) - low} float32"
    )
    print(r["table"])


if __name__ == "__main__":
    main()
