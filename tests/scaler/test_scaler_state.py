"""GradScaler checkpoints: exact resume (also in a new process), torch's format both ways,
and state dicts that are wrong in any way raising while leaving the scaler unchanged."""

from __future__ import annotations

import copy
import math
import pickle
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import ampcore

OVERFLOW_STEPS = frozenset({2, 3, 7, 8, 9, 14})
SETTINGS: dict[str, Any] = {
    "init_scale": 2.0**8,
    "growth_interval": 3,
    "hysteresis": 2,
    "min_scale": 1.0,
    "max_scale": 2.0**12,
}


@dataclass
class Run:
    """One training run: model, optimizer, scaler and the scale after every step."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    scaler: Any
    scales: list[float] = field(default_factory=list)

    @classmethod
    def new(cls, scaler: Any = None) -> Run:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        scaler = scaler if scaler is not None else ampcore.GradScaler("cpu", dtype=torch.float16, **SETTINGS)
        return cls(model, torch.optim.Adam(model.parameters(), lr=0.01), scaler)

    @classmethod
    def resume(cls, path: Path) -> Run:
        run = cls.new()
        run.load(path)
        return run

    def load(self, path: Path) -> None:
        saved = torch.load(path, weights_only=True)
        self.model.load_state_dict(saved["model"])
        self.opt.load_state_dict(saved["opt"])
        self.scaler.load_state_dict(saved["scaler"])

    def save(self, path: Path) -> None:
        torch.save(
            {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "scaler": self.scaler.state_dict()}, path
        )

    def train(self, start: int, stop: int) -> None:
        for step in range(start, stop):
            data = torch.Generator().manual_seed(step)
            x, y = torch.randn(16, 8, generator=data), torch.randn(16, 4, generator=data)
            self.opt.zero_grad()
            self.scaler.scale(torch.nn.functional.mse_loss(self.model(x), y)).backward()
            if step in OVERFLOW_STEPS:
                self.model.weight.grad[step % 4, 0] = math.inf
            self.scaler.step(self.opt)
            self.scaler.update()
            self.scales.append(self.scaler.get_scale())

    def params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


def resume_job(tests_dir: str, checkpoint: str, out: str) -> None:
    """What the new process runs: resume at step 10, train to 20, save the results."""
    run = Run.resume(Path(checkpoint))
    run.train(10, 20)
    torch.save({"scales": run.scales, "params": run.params()}, out)


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_resume_in_a_new_process_gives_the_same_trajectory(tmp_path: Path) -> None:
    whole = Run.new()
    whole.train(0, 10)
    whole.save(tmp_path / "ckpt.pt")
    whole.train(10, 20)
    out = tmp_path / "resumed.pt"
    script = "import sys; sys.path.insert(0, sys.argv[1]); import test_scaler_state as t; t.resume_job(*sys.argv[1:])"
    tests_dir = str(Path(__file__).parent)
    subprocess.run(
        [sys.executable, "-c", script, tests_dir, str(tmp_path / "ckpt.pt"), str(out)], check=True, timeout=120
    )
    resumed = torch.load(out, weights_only=True)
    assert resumed["scales"] == whole.scales[10:]
    assert same(resumed["params"], whole.params())
    moves = list(zip(whole.scales, whole.scales[11:], strict=False))
    assert any(b < a for a, b in moves) and any(b > a for a, b in moves)  # after the resume: both ways


def test_resume_in_process_including_the_hysteresis_counter(tmp_path: Path) -> None:
    whole = Run.new()
    whole.train(0, 8)  # step 7 overflowed once: one more overflow (step 8) backs off
    assert whole.scaler.state_dict()["_overflow_tracker"] == 1
    whole.save(tmp_path / "ckpt.pt")
    whole.train(8, 12)
    resumed = Run.resume(tmp_path / "ckpt.pt")  # loaded before its first scale(): pending values
    resumed.train(8, 12)
    assert resumed.scales == whole.scales[8:] and same(resumed.params(), whole.params())


def test_torch_loads_ours_and_we_load_torchs(tmp_path: Path) -> None:
    theirs = Run.new(torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3))
    ours = Run.new(ampcore.GradScaler("cpu", dtype=torch.float16, init_scale=2.0**8, growth_interval=3, max_scale=None))
    for run in (theirs, ours):
        run.train(0, 6)
    swapped_theirs = Run.new(torch.amp.GradScaler("cpu"))
    swapped_ours = Run.new(ampcore.GradScaler("cpu", dtype=torch.float16, max_scale=None))
    for source, target in ((ours, swapped_theirs), (theirs, swapped_ours)):
        source.save(tmp_path / "ckpt.pt")
        target.load(tmp_path / "ckpt.pt")
    for run in (theirs, ours, swapped_theirs, swapped_ours):
        run.train(6, 16)
    assert theirs.scales[6:] == ours.scales[6:] == swapped_theirs.scales == swapped_ours.scales
    assert same(theirs.params(), swapped_ours.params()) and same(ours.params(), swapped_theirs.params())


def test_state_dict_holds_the_documented_keys_as_plain_values() -> None:
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, **SETTINGS)
    state = scaler.state_dict()
    assert state == {
        "scale": 256.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
        "_growth_tracker": 0,
        "hysteresis": 2,
        "_overflow_tracker": 0,
        "min_scale": 1.0,
        "max_scale": 4096.0,
        "dynamic": True,
        "raise_at_min_scale": False,
    }


def _valid() -> dict[str, Any]:
    return ampcore.GradScaler("cpu", dtype=torch.float16, **SETTINGS).state_dict()


BROKEN: list[tuple[str, Any, str]] = [
    ("missing key", {k: v for k, v in _valid().items() if k != "hysteresis"}, r"missing keys \['hysteresis'\]"),
    ("extra key", {**_valid(), "loss_scale": 1.0}, r"unexpected keys \['loss_scale'\]"),
    (
        "torch keys missing one",
        {"scale": 1.0, "growth_factor": 2.0},
        r"missing keys \['_growth_tracker', 'backoff_factor', 'growth_interval'\]",
    ),
    ("scale is a string", {**_valid(), "scale": "256"}, r"scale='256'"),
    ("scale is a tensor", {**_valid(), "scale": torch.tensor(2.0)}, "scale=tensor"),
    ("scale is nan", {**_valid(), "scale": math.nan}, "scale=nan"),
    ("scale is zero", {**_valid(), "scale": 0.0}, "positive"),
    ("scale above max", {**_valid(), "scale": 2.0**13}, "outside the bounds"),
    ("interval is a float", {**_valid(), "growth_interval": 3.0}, "growth_interval=3.0"),
    ("tracker negative", {**_valid(), "_growth_tracker": -1}, "_growth_tracker=-1"),
    ("tracker too large", {**_valid(), "_growth_tracker": 3}, "must be below growth_interval"),
    ("overflow tracker too large", {**_valid(), "_overflow_tracker": 2}, "must be below hysteresis"),
    ("dynamic not a bool", {**_valid(), "dynamic": 1}, "dynamic=1"),
    ("growth factor <= 1", {**_valid(), "growth_factor": 1.0}, "growth factor must be > 1.0"),
    ("min above max", {**_valid(), "min_scale": 2.0**13}, "outside the bounds"),
    ("not a dict", [("scale", 1.0)], "expected a dict"),
]


@pytest.mark.parametrize(("case", "state", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_state_dicts_raise_and_leave_the_scaler_unchanged(case: str, state: Any, message: str) -> None:
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, init_scale=64.0, hysteresis=3)
    scaler.scale(torch.ones(()))
    before = scaler.state_dict()
    with pytest.raises(ampcore.AmpcoreError, match=message):
        scaler.load_state_dict(state)
    assert scaler.state_dict() == before


def test_empty_state_dict_raises_when_scaling_and_is_ignored_otherwise() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="The source state dict is empty"):
        ampcore.GradScaler("cpu", dtype=torch.float16).load_state_dict({})
    no_op = ampcore.GradScaler("cpu")  # bfloat16: no scaling
    no_op.load_state_dict({})
    no_op.load_state_dict(_valid())
    assert no_op.get_scale() == 1.0 and no_op.state_dict() == {}
    assert ampcore.GradScaler("cpu", dtype=torch.float16, enabled=False).state_dict() == {}


def test_a_torch_state_dict_keeps_our_own_settings() -> None:
    scaler = ampcore.GradScaler("cpu", dtype=torch.float16, hysteresis=3, min_scale=2.0)
    scaler.load_state_dict(torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=5).state_dict())
    state = scaler.state_dict()
    assert (state["scale"], state["growth_interval"], state["hysteresis"], state["min_scale"]) == (8.0, 5, 3, 2.0)


def test_pickle_and_deepcopy_between_iterations_only() -> None:
    run = Run.new()
    run.train(0, 8)
    for copy_of in (lambda s: pickle.loads(pickle.dumps(s)), copy.deepcopy):
        twin = copy_of(run.scaler)
        assert twin.state_dict() == run.scaler.state_dict() and repr(twin) == repr(run.scaler)
    other = Run.new(pickle.loads(pickle.dumps(run.scaler)))
    other.model.load_state_dict(run.model.state_dict())
    other.opt.load_state_dict(copy.deepcopy(run.opt.state_dict()))
    run.train(8, 12)
    other.train(8, 12)
    assert other.scales == run.scales[8:] and same(other.params(), run.params())
    run.scaler.scale(run.model(torch.ones(1, 8)).sum()).backward()
    run.scaler.step(run.opt)
    with pytest.raises(ampcore.AmpcoreError, match="only be pickled or copied at the beginning of an iteration"):
        pickle.dumps(run.scaler)
