"""What a root's watched settings cost a settled ``level="auto"`` step (issue 27, thirteenth stop).

A root of the user's class whose forward picks its work from three plain attributes
(``depth``: int, ``use_gate``: bool, ``mode``: str) has them in its program's guard: each
root call compares them (one C ``map``).  The same root with the three attributes private
(``_depth``, ...: no setting, nothing watched) is the baseline; the same private root
holding 30 blocks of five settings each (150 values watched, as the attention blocks of a
``transformers`` model hold) shows a many-module model; a ``transformers``-like one (12
blocks of five settings, each with an attention of four, all holding one config object of
40 simple fields: 108 settings and the config's 40 fields, watched since the fourteenth
stop) shows config objects; a root holding a config of 120 fields (60 private: a
``transformers`` config's size; the first 64 watched, and past them the fields its code
names: none here) and one holding a ``__slots__`` config of five (watched since the
sixteenth stop) show wide and slotted configs.  Each trains the same tiny
MLP (two ``Linear(32)``, batch 8: the region's own cost shows), in one process, steps
interleaved round by round; medians over rounds, in us per step, and their ratio; then the
settled guard of each alone (``timeit``, ns a call: the part the settings add to).  A third
root of torch's classes only (``nn.Sequential``: nothing watched either way) shows the
path of roots without settings.

Run it against an older checkout (``PYTHONPATH=<old worktree>``) to compare: there both
roots watch nothing.

Usage::

    python benchmarks/bench_auto_settings.py [--rounds 15] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any


def _models() -> dict[str, Any]:
    import torch
    from torch import nn

    class Public(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.head = nn.Linear(32, 32), nn.Linear(32, 32)
            self.depth, self.use_gate, self.mode = 1, False, "short"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(self.depth):
                x = torch.relu(self.fc(x))
            if self.use_gate and self.mode == "long":
                x = x * 2
            return self.head(x)

    class Private(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.head = nn.Linear(32, 32), nn.Linear(32, 32)
            self._depth, self._use_gate, self._mode = 1, False, "short"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(self._depth):
                x = torch.relu(self.fc(x))
            if self._use_gate and self._mode == "long":
                x = x * 2
            return self.head(x)

    class Knobs(nn.Module):  # five settings, no work (a block's hyper-parameters)
        def __init__(self) -> None:
            super().__init__()
            self.heads, self.size, self.causal, self.kind, self.scale = 12, 64, False, "abs", 0.125

    class Many(Private):  # the private root holding 30 such blocks: 150 settings watched
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Knobs() for _ in range(30))

    class Config:  # a transformers-like PretrainedConfig: 40 simple fields
        def __init__(self) -> None:
            self.hidden_size, self.num_attention_heads, self.use_cache, self.hidden_act = 32, 4, True, "gelu"
            for i in range(36):
                setattr(self, f"option_{i}", i)

    class Attention(nn.Module):  # four settings and the model's config
        def __init__(self, config: Config) -> None:
            super().__init__()
            self.config, self.heads, self.head_dim, self.is_causal, self.layer_idx = config, 4, 8, True, 0

    class Block(Knobs):  # five settings, the config, an attention holding it too
        def __init__(self, config: Config) -> None:
            super().__init__()
            self.config, self.attn = config, Attention(config)

    class Transformer(Private):  # 12 such blocks sharing one config (a transformers model's layout)
        def __init__(self) -> None:
            super().__init__()
            config = Config()
            self.config, self.blocks = config, nn.ModuleList(Block(config) for _ in range(12))

    class Wide:  # a transformers config as it is: 60 public and 60 private fields
        def __init__(self) -> None:
            for i in range(60):
                setattr(self, f"option_{i}", i)
                setattr(self, f"_internal_{i}", i)

    class WideRoot(Private):  # the private root holding it: the fields past the 64th unnamed
        def __init__(self) -> None:
            super().__init__()
            self.config = Wide()

    class Slots:  # a dataclass(slots=True)-like config of five fields
        __slots__ = ("heads", "size", "causal", "kind", "scale")

        def __init__(self) -> None:
            self.heads, self.size, self.causal, self.kind, self.scale = 12, 64, False, "abs", 0.125

    class SlotsRoot(Private):
        def __init__(self) -> None:
            super().__init__()
            self.config = Slots()

    torch.manual_seed(0)
    return {
        "3 settings": Public(),
        "150 settings": Many(),
        "12 blocks+config": Transformer(),
        "wide config": WideRoot(),
        "slots config": SlotsRoot(),
        "private": Private(),
        "torch only": nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32)),
    }


def _steps(model: Any, x: Any, n: int) -> float:
    import ampcore

    start = time.perf_counter()
    for _ in range(n):
        with ampcore.autocast("cpu", level="auto"):
            out = model(x)
        out.float().sum().backward()
    return (time.perf_counter() - start) / n * 1e6


def _guard_ns(model: Any) -> float:
    """The settled program's guard (``_guard.unchanged``: tree, weights, plain containers and
    watched settings) of ``model``'s last call, in ns a call (best of 400 timeit repeats of 500)."""
    import timeit

    from ampcore._auto import _roots_state
    from ampcore._auto._guard import unchanged

    last = _roots_state._local.last[id(model)]
    args = (last.tree, last.values, last.weights, last.plain)
    return min(timeit.repeat(lambda: unchanged(*args), number=500, repeat=400)) / 500 * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    options = parser.parse_args()
    os.environ.setdefault("AMPCORE_CACHE_DIR", tempfile.mkdtemp(prefix="ampcore-bench-settings-"))
    import torch

    import ampcore

    torch.set_num_threads(1)
    models = _models()
    x = torch.randn(8, 32)
    for model in models.values():  # recorded, measured, checked, settled
        _steps(model, x, 30)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(options.rounds):
        for name, model in models.items():
            times[name].append(_steps(model, x, options.steps))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"ampcore {ampcore.__file__}")
    print(f"load {os.getloadavg()[0]:.2f}, {options.rounds} rounds of {options.steps} steps, us per step (median)")
    for name, value in med.items():
        print(f"  {name:16s} {value:8.1f}")
    print("the guard of each settled root, ns a call:", {n: round(_guard_ns(m)) for n, m in models.items()})
    print(f"3 settings / private: {med['3 settings'] / med['private']:.3f}")
    print(f"150 settings / private: {med['150 settings'] / med['private']:.3f}")
    print(f"12 blocks+config / private: {med['12 blocks+config'] / med['private']:.3f}")
    print(f"wide config / private: {med['wide config'] / med['private']:.3f}")
    print(f"slots config / private: {med['slots config'] / med['private']:.3f}")
    print(f"torch only / private: {med['torch only'] / med['private']:.3f}")


if __name__ == "__main__":
    main()
