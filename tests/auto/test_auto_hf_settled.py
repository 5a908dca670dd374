"""Issue 27, seventeenth stop: a settled step of a Hugging Face model costs the fixed choice's step.

On the GPU hf-llama's classes decided one kind low (the key/value projections) and the rest
float32; its whole-call check measured plan 10.5 ms, low 9.6, fp32 9.9, and the root "runs
as low".  The question: is that settled program torch.autocast's step, the same ops, dtypes
and casts (no cast per call instead of one per step, no guard left on the attention's
layers, no recording or measurement in later steps)?  It is, and so is the float32 choice
(the CPU's verdict on the same model); the 1.16 of that GPU row was the benchmark's
warm-up (``test_auto_bench_settle.py``).  These pin it for Llama (rotary cache, grouped
key/value heads) and T5 (relative position bias, the decoder's shifted labels, a tied head).

Class figures and whole-call figures are given by fake clocks: no wall-clock threshold.
"""

from __future__ import annotations

import collections
import copy
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, counting  # noqa: F401 (fixture)
from test_auto_hf import build
from test_auto_root_check import budget  # noqa: F401 (an autouse fixture: the budget unspent)
from test_auto_warm_census import Census
from torch import nn

import ampcore
from ampcore._auto import Costs, _deciding, _hooks, _verify

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py
_LOW, _FP32 = Costs(2.0, 1.0, 0.1), Costs(1.0, 2.0, 0.1)  # (fp32 ms, low ms, cast ms)
#: whole-call figures (ms): the GPU's hf-llama (plan lost to both, low best) and the CPU's (float32 best)
_GPU, _CPU = {"plan": 10.5, "low": 9.6, "fp32": 9.9}, {"plan": 26.3, "low": 26.2, "fp32": 20.5}
_LOW_NAMES = (".k_proj", ".v_proj", ".k", ".v")  # the key/value projections decide low, as on the GPU


def _batch(family: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 64, (2, 8), generator=g)
    labels = torch.randint(1, 64, (2, 5), generator=g) if family == "t5" else ids.clone()
    return {"input_ids": ids, "labels": labels}


def _step(model: nn.Module, batch: dict[str, Any], enter: Callable[[], Any]) -> None:
    with enter():
        loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def _given(model: nn.Module, monkeypatch: pytest.MonkeyPatch, whole: dict[str, float]) -> list[str]:
    """Class figures by layer name, whole-call figures by candidate (a little jitter): the
    labels of the whole-call runs the clock timed."""
    low = {id(m) for name, m in model.named_modules() if name.endswith(_LOW_NAMES)}
    monkeypatch.setattr(_deciding, "_measure", lambda module, *rest: _LOW if id(module) in low else _FP32)
    labels: list[str] = []
    jitter = itertools.cycle([1.0, 1.01, 0.99])

    def clock(run: Callable[[], None], label: str) -> float:
        run()
        labels.append(label)
        return whole[label.removeprefix("root-")] * next(jitter)

    monkeypatch.setattr(_hooks, "device_clock", lambda backend, index: clock)
    monkeypatch.setattr(_hooks._process, "clocks", {})
    return labels


@pytest.mark.parametrize("family", ["llama", "t5"])
@pytest.mark.parametrize(("whole", "fixed"), [(_GPU, "low"), (_CPU, "fp32")], ids=["runs-as-low", "runs-as-fp32"])
def test_a_settled_step_is_the_fixed_choices_step(
    monkeypatch: pytest.MonkeyPatch, family: str, whole: dict[str, float], fixed: str
) -> None:
    model, batch = build(family), _batch(family)
    ref_model = copy.deepcopy(model)
    labels = _given(model, monkeypatch, whole)
    region = ampcore.autocast("cpu", level="auto")
    for _ in range(3):  # the new root (classes measured), the recording, the whole-call check
        _step(model, batch, lambda: region)
    (check,) = ampcore.auto_plan("cpu").roots.values()
    assert check.verdict == fixed and labels  # (checked, by the given figures)
    checks, made = collections.Counter[str](), counting(monkeypatch)
    real = _verify._check
    monkeypatch.setattr(_verify, "_check", lambda *a, **k: checks.update(["check"]) or real(*a, **k))
    for _ in range(4):  # settled: nothing recorded, checked or measured again
        _step(model, batch, lambda: region)
    assert made == [] and not checks
    auto, ref = Census(), Census()
    with auto:
        _step(model, batch, lambda: region)
    with ref:
        _step(ref_model, batch, lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=fixed == "low"))
    assert auto.ops == ref.ops  # op by op with its dtypes: the same casts, no more
    assert any("bfloat16" in op for op in auto.ops) == (fixed == "low")
