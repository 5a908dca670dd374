"""Issue 27, seventeenth stop: config flags that change at different steps settle.

A model whose forward picks its work from flags of its config (Hugging Face's
``output_hidden_states`` and ``output_attentions``: the outputs it gathers, the softmax it
returns), changed by the training loop at different steps of a cycle (one flag on at steps
1-2, another at step 2 of a cycle of 4).  The first change of a flag before its program's
first look re-baselines the program (a step number and a flag look alike then:
:mod:`ampcore._auto._early`); at the next look the flag is back, but the other flag changed
since, so the program as recorded did not fit the values now.  Before, both programs were
then dropped (only the re-baselined one kept by the recording that followed), and each was
recorded again in the next cycles: 4-5 recordings over the first 2-3 cycles before settling.
Now each is kept for its values: every distinct combination of values is recorded once.

Two flags, three flags and flags on a nested sub-config; the whole-call checks use a fake
clock (no wall clock).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_leftovers import _Clock, _step
from test_auto_leftovers import recordings as recordings  # noqa: F401, PLC0414 (fixture)
from test_auto_sweep5 import _process
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


class _Layer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.a = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.a(x)
        return (h, h.softmax(-1)) if self._attentions() else (h,)

    def _attentions(self) -> bool:
        return bool(self.config.output_attentions)


class _NestedLayer(_Layer):
    def _attentions(self) -> bool:
        return bool(self.config.attn.output_attentions)


class _Net(nn.Module):
    """HF-like: ``config.output_hidden_states`` gathers each layer's output,
    ``config.output_attentions`` each layer's softmax, ``config.double`` (three flags)
    doubles each layer's output; ``nested``: the attention flag in ``config.attn``."""

    def __init__(self, nested: bool = False) -> None:
        super().__init__()
        attn = SimpleNamespace(output_attentions=False)
        self.config = SimpleNamespace(output_hidden_states=False, output_attentions=False, double=False, attn=attn)
        self.nested = nested
        layer = _NestedLayer if nested else _Layer
        self.layers = nn.ModuleList(layer(self.config) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden: list[torch.Tensor] = []
        attentions: list[torch.Tensor] = []
        attn = self.config.attn.output_attentions if self.nested else self.config.output_attentions
        for layer in self.layers:
            out = layer(x)
            x = out[0]
            if self.config.output_hidden_states:
                hidden.append(x)
            if attn:
                attentions.append(out[1])
            if self.config.double:
                x = x * 2
        return x + sum(h.sum() for h in hidden) + sum(a.sum() for a in attentions)

    def set(self, hidden: bool, attentions: bool, double: bool = False) -> None:
        self.config.output_hidden_states = hidden
        if self.nested:
            self.config.attn.output_attentions = attentions
        else:
            self.config.output_attentions = attentions
        self.config.double = double


F, T = False, True
_CYCLES: dict[str, list[tuple[bool, ...]]] = {
    "two-flags": [(F, F), (T, F), (T, T), (F, F)],  # hidden on at steps 1-2, attentions at step 2
    "two-flags-shifted": [(F, F), (F, T), (T, T), (T, F)],
    "two-flags-other-first": [(F, F), (T, F), (F, T), (F, F)],
    "three-flags": [(F, F, F), (T, F, F), (T, T, F), (F, T, T), (F, F, T), (F, F, F)],
    "three-flags-together": [(F, F, F), (T, F, T), (T, T, F), (F, F, F)],
}


@pytest.mark.parametrize("nested", [False, True], ids=["config", "nested-config"])
@pytest.mark.parametrize("cycle", list(_CYCLES))
def test_flags_changing_at_different_steps_record_each_combination_once(
    cycle: str, nested: bool, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """Over 3 cycles: at most one recording per distinct combination of the flags' values,
    all in the first cycle (a combination first met while a program awaits its first look
    may run that program re-baselined: :mod:`ampcore._auto._early`)."""
    clock = _Clock()
    _process(monkeypatch, clock, nn.Identity(), n=0)
    model = _Net(nested)
    steps = _CYCLES[cycle]
    per_cycle: list[int] = []
    for _ in range(3):
        before = len(recordings)
        for values in steps:
            model.set(*values)
            _step(model)
        per_cycle.append(len(recordings) - before)
    assert per_cycle[1:] == [0, 0], per_cycle  # before: 1-2 more in the second cycle
    assert per_cycle[0] <= len(set(steps)), per_cycle
