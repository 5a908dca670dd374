"""Held-out sweep (issue 31): state dicts of O2 runs are interchangeable with torch's and
resume exactly, for every optimizer and flavour of the sweep (``o2_sweep_harness.py``).

A decorated run and torch's float32 reference train a few steps; then each checkpoint
(``torch.save``d: model, optimizer, scaler) is loaded into a fresh decorated model and
optimizer, into a fresh plain float32 model and optimizer, and (the reference's) into a
model and optimizer before they are decorated; every resumed run continues with the
reference, bit for bit after every step.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from o2_sweep_harness import CASES, OWN, Options, Side, build, same_run, step, train_both

FIRST, MORE = 3, 3


def _checkpoint(side: Side) -> bytes:
    buffer = io.BytesIO()
    state = {"model": side.model.state_dict(), "opt": side.opt.state_dict()}
    if side.scaler is not None:
        state["scaler"] = side.scaler.state_dict()
    torch.save(state, buffer)
    return buffer.getvalue()


def _read(saved: bytes) -> dict[str, Any]:
    """A checkpoint as ``torch.load`` gives it (its own tensors: torch's optimizers keep them)."""
    return torch.load(io.BytesIO(saved), weights_only=True)  # type: ignore[no-any-return]


def _load(side: Side, checkpoint: bytes) -> Side:
    saved = _read(checkpoint)
    side.model.load_state_dict(saved["model"])
    side.opt.load_state_dict(saved["opt"])
    if side.scaler is not None:
        side.scaler.load_state_dict(saved["scaler"])
    return side


def _resumed(name: str, options: Options) -> None:
    case = CASES[name]
    dec, ref = train_both(case, Options(**{**options.__dict__, "steps": FIRST}))
    from_dec, from_ref = _checkpoint(dec), _checkpoint(ref)

    def before(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        saved = _read(from_ref)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])

    early = build(case, options, seed=5, before=before)[0]
    if early.scaler is not None:
        early.scaler.load_state_dict(_read(from_ref)["scaler"])
    runs = {
        "decorated from decorated": _load(build(case, options, seed=5)[0], from_dec),
        "float32 from decorated": _load(build(case, options, seed=5)[1], from_dec),
        "decorated from float32": _load(build(case, options, seed=5)[0], from_ref),
        "loaded before decorate": early,
    }
    for index in range(FIRST, FIRST + MORE):
        step(ref, index, options, widen=True, closure=case.closure)
        for label, side in runs.items():
            plain = side.model.emb.weight.dtype == torch.float32
            step(side, index, options, widen=plain, closure=case.closure)
            same_run(side, ref, f"{label}, step {index}")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_resume_without_a_scaler(name: str, dtype: str) -> None:
    _resumed(name, Options(dtype=dtype))


@pytest.mark.parametrize("name", OWN)
def test_resume_with_torchs_scaler(name: str) -> None:
    _resumed(name, Options(dtype="fp16", scaler="torch"))


@pytest.mark.parametrize("name", ["adam-fused", "sgd-momentum-loop", "rmsprop-foreach"])
def test_resume_with_ampcores_scaler(name: str) -> None:
    _resumed(name, Options(dtype="fp16", scaler="ampcore"))
