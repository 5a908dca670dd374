"""Find the op that overflows in float16 with ``ampcore.debugging`` (docs/debugging.md).

A classifier pools tokens with a hand-written softmax, ``exp(score) / sum(exp(score))``,
without subtracting the maximum score.  In float32 that is fine; under float16 autocast
``exp`` of a score above log(65504) ~ 11.09 is inf, and the loss becomes nan.

    python examples/debug_overflow.py [--device cpu]
"""

from __future__ import annotations

import argparse
import warnings

import torch
from torch import nn

import ampcore
import ampcore.debugging as dbg


class NaivePool(nn.Module):
    """Attention pooling over tokens with a softmax written by hand (the bug)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.score = nn.Linear(width, 1)
        self.subtract_max = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.score(x)  # [batch, tokens, 1]
        if self.subtract_max:  # the fix: what torch.softmax does
            scores = scores - scores.amax(dim=1, keepdim=True)
        weights = torch.exp(scores)  # overflows float16 for scores above 11.09
        weights = weights / weights.sum(dim=1, keepdim=True)
        return (weights * x).sum(dim=1)


class Classifier(nn.Module):
    def __init__(self, width: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        self.pool = NaivePool(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.encoder(x)))


def build(device: str) -> tuple[Classifier, torch.Tensor]:
    torch.manual_seed(0)
    model = Classifier().to(device).eval()
    with torch.no_grad():
        model.pool.score.weight.mul_(60)  # a confident scorer, as after some training
    return model, torch.randn(8, 16, 32, device=device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    device = parser.parse_args().device
    warnings.filterwarnings("ignore", message=".*runs emulated")  # fp16 on a CPU without AVX512-FP16
    model, x = build(device)

    with torch.no_grad():
        print("float32 finite:", torch.isfinite(model(x)).all().item())
        with ampcore.autocast(device=device, dtype=torch.float16):
            print("float16 finite:", torch.isfinite(model(x)).all().item())

    print("\n# 1. What ran in which dtype")
    with dbg.collect_operator_stats() as stats, torch.no_grad():
        with ampcore.autocast(device=device, dtype=torch.float16):
            model(x)
    stats.print()

    print("\n# 2. The first op that produced inf or nan")
    try:
        with dbg.check_numerics(), torch.no_grad():
            with ampcore.autocast(device=device, dtype=torch.float16):
                model(x)
    except dbg.NumericsError as error:
        print(error)

    print("\n# 3. Which module's output differs most from float32")
    print(dbg.compare_accuracy(model, x, level="O1", dtype=torch.float16).table())

    print("\n# 3b. The float32 model, checked against the float16 range")
    with warnings.catch_warnings(record=True):  # report mode ends with one NumericsWarning
        with dbg.check_numerics(raise_on_error=False, check_fp16_range=True) as checker, torch.no_grad():
            model(x)  # float32, no autocast
    for finding in checker.findings:
        print(finding.kind, finding.op, finding.module_path, finding.outputs[0])

    print("\n# 4. After the fix")
    model.pool.subtract_max = True
    with dbg.check_numerics(), torch.no_grad():
        with ampcore.autocast(device=device, dtype=torch.float16):
            model(x)
    print("check_numerics: no finding")
    print(dbg.compare_accuracy(model, x, level="O1", dtype=torch.float16).table(limit=3))


if __name__ == "__main__":
    main()
