"""Issue 27, sixth held-out sweep of ``level="auto"``: model kinds, uses and caches the
earlier sweeps (``test_auto_sweep*.py``) did not try.

* two roots of one class (two ``nn.Sequential``) with the same input signature but other
  layers: each gets its own whole-call check (before, the second ran the first one's
  verdict: the key of a check named the root's class, not what it holds);
* a cache directory shared by two processes deciding different models at once: neither
  write loses the other's entries (before, the last writer's plan replaced the file);
* held-out model kinds (an LSTM language model, a BatchNorm CNN in channels_last switched
  between train and eval, a depthwise-separable net, a U-Net with skip concatenations,
  Embedding + EmbeddingBag, weight tying, a module called twice, nested tuple outputs) and
  uses (part of the model frozen mid-training, two optimizers with gradient accumulation),
  each with its plan measured in the first steps (a fake clock) and compared, step by step,
  with the fixed precision its plan gives (``test_auto_sweep3.run``).

Timings are injected (fake clocks): the tests count measurements and check decisions and
numerics, never the wall clock.  Separate processes are in ``test_auto_sweep6_procs.py``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, Enter, _train, run
from test_auto_sweep3_models import measuring as measuring  # noqa: F401, PLC0414 (fixture)
from test_auto_sweep5 import Clock, _process
from torch import nn
from torch.utils.checkpoint import checkpoint

import ampcore
from ampcore._auto import _cache
from ampcore._auto._cache import cache_file, forget_plans

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

X = torch.randn(8, 32)

# --- (1) the whole-call check of one root class holding other layers ------------------------

#: the model whose forward ran last (the fake clock's root timings depend on it)
_RUNNING: list[str] = [""]


class _Tag(nn.Module):
    """Notes which model runs (an identity)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _RUNNING[0] = self.name
        return x


def _small() -> nn.Sequential:
    return nn.Sequential(_Tag("small"), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))


def _large() -> nn.Sequential:
    return nn.Sequential(_Tag("large"), nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 8))


IMAGE = torch.randn(2, 3, 16, 16)


def _strided(stride: int) -> nn.Sequential:
    """The same parameters (shapes) at another stride: 4 times the work at stride 1."""
    name = "large" if stride == 1 else "small"
    return nn.Sequential(_Tag(name), nn.Conv2d(3, 8, 3, stride=stride), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=stride))


class _RootClock(Clock):
    """Every class: low wins 4 to 1 (all-low programs, checked against float32).  Whole
    calls: float32 wins on the small model (0.5 against 1), loses on the large one (3 against 1)."""

    def __call__(self, run: Callable[[], None], label: str) -> float:
        run()
        self.labels.append(f"{label}:{_RUNNING[0]}" if label.startswith("root") else label)
        if label == "root-fp32":
            return 0.5 if _RUNNING[0] == "small" else 3.0
        return self.ms.get(label, 1.0)


def _dtypes(model: nn.Module, steps: int, x: torch.Tensor = X) -> list[torch.dtype]:
    """Train ``steps`` steps in this process; the output dtype of each."""
    found = []
    for _ in range(steps):
        with ampcore.autocast("cpu", level="auto"):
            out = model(x)
        out.float().sum().backward()
        found.append(out.dtype)
    return found


@pytest.mark.parametrize("layers", ["linear-sizes", "conv-strides"])
def test_two_roots_of_one_class_with_other_layers_get_their_own_whole_call_check(
    layers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, large, x = (
        (_small, _large, X) if layers == "linear-sizes" else (lambda: _strided(2), lambda: _strided(1), IMAGE)
    )
    clock = _RootClock()
    _process(monkeypatch, clock, nn.Identity(), n=0)  # a new process
    _dtypes(small(), 3, x)
    assert _dtypes(small(), 3, x)[-1] == torch.float32  # its verdict, settled (a new model, the same layers)
    small_checks = [label for label in clock.labels if label.startswith("root")]
    assert small_checks and all(label.endswith(":small") for label in small_checks)
    for fresh in (False, True):  # in the same process, then in the next (its cache)
        if fresh:
            _process(monkeypatch, clock, nn.Identity(), n=0)
        clock.labels.clear()
        assert _dtypes(large(), 5, x) == [BF16] * 5, "the large model ran the small one's float32 verdict"
        assert any(label.endswith(":large") for label in clock.labels) != fresh  # checked once, then cached
    roots = ampcore.auto_plan("cpu").roots
    assert sorted(check.verdict for check in roots.values()) == ["fp32", "low"], roots


def test_a_float32_verdict_runs_every_planned_call_in_float32_also_those_guarded_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Strided convolutions without padding: their inner shapes (7 x 7, 3 x 3 from 16 x 16)
    do not follow the root's arguments, so the recording guards them per call.  The
    whole-call check's ``fp32`` choice left those guards out of its switched modules: they
    ran with the O1 lists (bfloat16) under a float32 verdict, in the check's float32 runs
    too (so the check never timed float32)."""
    _process(monkeypatch, _RootClock(), nn.Identity(), n=0)
    model = _strided(2)
    reference = copy.deepcopy(model)
    for step in range(5):
        with ampcore.autocast("cpu", level="auto"):
            out = model(IMAGE)
        out.float().sum().backward()
        if step >= 2:  # settled: the whole-call check said float32
            want = reference(IMAGE)
            assert out.dtype == torch.float32
            torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert [c.verdict for c in ampcore.auto_plan("cpu").roots.values()] == ["fp32"]


class _Checkpointed(nn.Module):
    """Two Linears inside ``torch.utils.checkpoint``, a head outside."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.tag, self.a, self.b, self.c = _Tag("small"), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        self.reentrant = reentrant

    def inner(self, t: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(torch.relu(self.a(t))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(checkpoint(self.inner, self.tag(x), use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_float32_verdict_runs_the_calls_inside_a_checkpoint_in_float32(
    reentrant: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned calls inside ``torch.utils.checkpoint`` follow the autocast state of its
    entry (its recompute does): under a float32 verdict of a low-default program they ran
    in bfloat16 (forward and recompute).  The float32 choice now switches autocast off for
    the whole root (float32 inputs and weights): exactly the float32 step."""
    _process(monkeypatch, _RootClock(), nn.Identity(), n=0)
    model = _Checkpointed(reentrant)
    reference = copy.deepcopy(model)
    x = torch.randn(8, 32, requires_grad=True)
    for step in range(5):
        model.zero_grad()
        with ampcore.autocast("cpu", level="auto"):
            out = model(x)
        out.float().sum().backward()
        if step >= 2:  # settled: the whole-call check said float32
            reference.zero_grad()
            want = reference(x)
            want.sum().backward()
            torch.testing.assert_close(out, want, rtol=0, atol=0)
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
    assert [c.verdict for c in ampcore.auto_plan("cpu").roots.values()] == ["fp32"]


class _Branch(nn.Module):
    """A layer on a path the first steps do not take (a private attribute picks it: neither
    in the signature nor a setting the program's guard watches)."""

    def __init__(self) -> None:
        super().__init__()
        self.tag, self.a, self.b, self.extra = _Tag("small"), nn.Linear(32, 32), nn.Linear(32, 8), nn.Linear(32, 32)
        self._use_extra = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(self.tag(x)))
        return self.b(self.extra(h) if self._use_extra else h)


def test_a_float32_verdict_runs_a_layer_on_another_path_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program's guard on a planned module the recording did not see applied the
    module's class decision (low) under a float32 verdict, on every later step of that path
    (the program did not record again): a fixed choice now applies to it too."""
    _process(monkeypatch, _RootClock(), nn.Identity(), n=0)
    model = _Branch()
    reference = copy.deepcopy(model)
    for step in range(6):
        model._use_extra = reference._use_extra = step >= 4  # the other path, after the check
        with ampcore.autocast("cpu", level="auto"):
            out = model(X)
        out.float().sum().backward()
        if step >= 2:
            torch.testing.assert_close(out, reference(X), rtol=0, atol=0, msg=f"step {step}")
    assert [c.verdict for c in ampcore.auto_plan("cpu").roots.values()] == ["fp32"]


# --- (2) one cache directory, two processes deciding different models at once ---------------


def test_two_processes_deciding_different_models_keep_each_others_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Process B read the cache before process A wrote it (both start cold), A writes its
    model's classes, then B writes its own: A's entries must stay in the file."""
    _process(monkeypatch, Clock(), _small())  # "B" so far: measured, written
    path = cache_file(ampcore.auto_plan("cpu").fingerprint)
    assert path is not None
    b_plan = ampcore.auto_plan("cpu")  # B's plan in memory, without A's classes
    b_wrote, b_seen = json.loads(path.read_text()), dict(_cache._seen)  # (what B last wrote)
    path.unlink()  # A starts from the same cold cache: its write comes first
    forget_plans()
    _cache._seen.clear()
    _process(monkeypatch, Clock(), _large())
    a_keys = set(json.loads(path.read_text())["entries"])
    assert a_keys - set(b_wrote["entries"])
    _cache.install_plan(b_plan)  # back in B: its next measurement writes the cache
    _cache._seen.clear()
    _cache._seen.update(b_seen)
    for _ in range(2):  # (the second write: the file as B wrote it, with what B took from A)
        _cache.write_cache(b_plan)
        on_disk = set(json.loads(path.read_text())["entries"])
        assert a_keys <= on_disk and set(b_wrote["entries"]) <= on_disk, "a write lost the other process's entries"
    clock = Clock()  # a third process running A's model measures nothing
    _process(monkeypatch, clock, _large())
    assert [label for label in clock.labels if label in ("fp32", "low")] == []


# --- (3) held-out model kinds and uses, measured in their first steps ------------------------


class LstmLM(nn.Module):
    """An LSTM language model: Embedding, a 2-layer LSTM (not a planned kind: the O1 lists),
    a projection and a tied head (the head's weight is the embedding's)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(60, 24)
        self.lstm = nn.LSTM(24, 24, num_layers=2, batch_first=True)
        self.proj = nn.Linear(24, 24)
        self.head = nn.Linear(24, 60, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(ids))
        return self.head(torch.tanh(self.proj(out)))


def _bn_cnn() -> nn.Module:
    """A BatchNorm CNN in channels_last."""
    return nn.Sequential(
        nn.Conv2d(3, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU(),
        nn.Conv2d(12, 12, 3, padding=1, bias=False), nn.BatchNorm2d(12), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 5),
    ).to(memory_format=torch.channels_last)  # fmt: skip


def _depthwise() -> nn.Module:
    """MobileNet-like: a stem, depthwise (groups = channels) and pointwise convolutions."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU6(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.ReLU6(),
        nn.Conv2d(16, 24, 1), nn.ReLU6(),
        nn.Conv2d(24, 24, 3, padding=1, groups=24), nn.Conv2d(24, 24, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 4),
    )  # fmt: skip


class UNet(nn.Module):
    """Two levels, skip concatenations of a float32-decided (3 in-channels) and low layers."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Conv2d(3, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Conv2d(16, 8, 3, padding=1)
        self.out = nn.Conv2d(8 + 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = torch.relu(self.enc1(x))
        e2 = torch.relu(self.enc2(nn.functional.max_pool2d(e1, 2)))
        d = torch.relu(self.dec(torch.cat([self.up(e2), e1], 1)))
        return self.out(torch.cat([d, x], 1))


class Bags(nn.Module):
    """Embedding + EmbeddingBag (offsets, per-sample weights) into a Linear stack."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 16)
        self.bag = nn.EmbeddingBag(40, 16, mode="sum")
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, ids: torch.Tensor, bag: torch.Tensor, offsets: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.emb(ids).mean(1), self.bag(bag, offsets, per_sample_weights=w)], 1))


class Twice(nn.Module):
    """One Linear called twice per forward (same shapes), a nested tuple and dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(16, 32)
        self.mid = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> Any:
        a, b = self.mid(self.shared(x)), self.mid(self.shared(x.flip(0)))
        return (self.head(a), (b, {"sum": (a + b).float()}))


def _step_inputs() -> dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module, int, Enter], Any]]]:
    ids = [torch.randint(0, 60, (4, n)) for n in (7, 5, 9)]  # the sequence length changes every step
    images = [torch.randn(b, 3, 8, 8).to(memory_format=torch.channels_last) for b in (4, 2, 4)]
    bag = torch.randint(0, 40, (10,))
    offsets, w = torch.tensor([0, 3, 7]), torch.rand(10)
    tokens = torch.randint(0, 40, (3, 4))
    x = torch.randn(8, 16)

    def train_eval(m: nn.Module, i: int, enter: Enter) -> Any:
        m.train(i % 3 != 2)  # every third step in eval, no grad
        if m.training:
            return _train(m, images[i % 3], enter)
        with torch.no_grad():
            return _train(m, images[i % 3], enter)

    def inference(m: nn.Module, i: int, enter: Enter) -> Any:
        m.eval()
        with torch.inference_mode():
            with enter(BF16):
                return m(images[i % 3].contiguous())

    def frozen(m: nn.Module, i: int, enter: Enter) -> Any:
        if i == 2:  # fine-tuning: the first layer frozen mid-training
            m.shared.requires_grad_(False)
        return _train(m, x, enter)

    opts: dict[int, Any] = {}

    def two_optimizers(m: nn.Module, i: int, enter: Enter) -> Any:
        if id(m) not in opts:
            opts[id(m)] = (
                torch.optim.SGD(m.shared.parameters(), lr=0.1),
                torch.optim.Adam([*m.mid.parameters(), *m.head.parameters()], lr=0.01),
            )
        outs = [_train(m, x[j::2], enter) for j in range(2)]  # two micro-steps accumulated
        for opt in opts[id(m)]:
            opt.step()
            opt.zero_grad()
        return outs

    return {
        "lstm-lm": (LstmLM, lambda m, i, enter: _train(m, ids[i % 3], enter)),
        "bn-cnn-channels-last-train-eval": (_bn_cnn, train_eval),
        "bn-cnn-inference-mode": (_bn_cnn, inference),
        "depthwise": (_depthwise, lambda m, i, enter: _train(m, images[i % 3], enter)),
        "unet": (UNet, lambda m, i, enter: _train(m, images[i % 3].contiguous(), enter)),
        "embedding-bag": (Bags, lambda m, i, enter: _train(m, tokens, enter, bag=bag, offsets=offsets, w=w)),
        "twice-nested-output": (Twice, lambda m, i, enter: _train(m, x, enter)),
        "frozen-mid-training": (Twice, frozen),
        "two-optimizers-accumulated": (Twice, two_optimizers),
    }


@pytest.mark.parametrize("case", list(_step_inputs()))
def test_heldout_models_and_uses_measured_match_the_fixed_precision(
    case: str, measuring: Any, recordings: list[Any]
) -> None:
    make, step = _step_inputs()[case]
    run(make, step, 6, recordings, measured=True)
    assert "low" in measuring.labels, measuring.labels


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from _auto_testing import counting

    return counting(monkeypatch)
