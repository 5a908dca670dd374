"""AmpcoreTrainer (transformers.Trainer) trains a small GPT-2 built from a config exactly as the
raw ampcore loop, with and without gradient checkpointing, at O1 and O2; the scaler is in
the checkpoints."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ampcore

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install ampcore[transformers])"
)
pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (pip install ampcore[transformers])")
from ampcore.integrations import AmpcoreSettings  # noqa: E402
from ampcore.integrations.transformers import AmpcoreTrainer  # noqa: E402

STEPS = 3
BATCH = 4


def settings(level: str) -> AmpcoreSettings:
    return AmpcoreSettings(
        device="cpu", level=level, dtype="float16", custom_black_list={"tanh", "softmax"},
        scaler={"init_scale": 2.0**8, "growth_interval": 2},
    )  # fmt: skip


def build() -> Any:
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def dataset() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randint(0, 64, (16,), generator=gen) for _ in range(STEPS * BATCH)]
    return [{"input_ids": row, "labels": row} for row in rows]


def raw_loop(level: str, checkpointing: bool) -> tuple[list[float], Any, ampcore.GradScaler]:
    config = settings(level)
    model = build()
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = config.decorate_models(model, opt)
    scaler = config.make_scaler()
    assert scaler is not None
    rows, losses = dataset(), []
    for step in range(STEPS):
        part = rows[step * BATCH : (step + 1) * BATCH]
        batch = {key: torch.stack([row[key] for row in part]) for key in part[0]}
        with config.autocast():
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
        scaler.step(opt)
        scaler.update()
        model.zero_grad()
        losses.append(loss.item())
    return losses, model, scaler


class RecordingTrainer(AmpcoreTrainer):  # type: ignore[misc]
    """Records the losses, and feeds the rows in order (the raw loop's batches)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.losses: list[float] = []
        self.model_accepts_loss_kwargs = False  # the model's mean loss, as the raw loop

    def _get_train_sampler(self, *args: Any, **kwargs: Any) -> torch.utils.data.Sampler[int]:
        return torch.utils.data.SequentialSampler(self.train_dataset)

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.losses.append(loss.item())
        return loss


def trainer(level: str, checkpointing: bool, out: Path, **kwargs: Any) -> RecordingTrainer:
    args = transformers.TrainingArguments(
        str(out), max_steps=STEPS, per_device_train_batch_size=BATCH, learning_rate=0.05, optim="sgd",
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, use_cpu=True, report_to=[],
        logging_strategy="no", gradient_checkpointing=checkpointing, dataloader_num_workers=0, **kwargs,
    )  # fmt: skip
    return RecordingTrainer(model=build(), args=args, train_dataset=dataset(), ampcore=settings(level))


@pytest.fixture(autouse=True)
def _accelerate_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers 4.x's TrainingArguments writes its mixed precision into os.environ
    # (ACCELERATE_MIXED_PRECISION="bf16" after the refused bf16=True): restored after each test
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.slow
@pytest.mark.parametrize(("level", "checkpointing"), [("O1", False), ("O1", True), ("O2", True)])
def test_trainer_matches_the_raw_loop(level: str, checkpointing: bool, tmp_path: Path) -> None:
    want, model, scaler = raw_loop(level, checkpointing)
    run = trainer(level, checkpointing, tmp_path, save_strategy="no")
    run.train()
    assert run.losses == want  # bit-equal
    got = run.model.state_dict()
    for name, value in model.state_dict().items():
        # inside the Trainer the embeddings' (and the first LayerNorm's) gradients differ
        # from the raw loop's by one float32 ulp (the losses do not): not pinned down yet
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-8, msg=name)
    assert run.accelerator.scaler.get_scale() == scaler.get_scale() != 2.0**8


@pytest.mark.slow
@pytest.mark.xfail(
    "intel_extension_for_pytorch" in sys.modules,
    reason="open ampcore bug with IPEX 2.8 imported (python3 tasks.py compat): under O1 with custom lists, "
    "GPT-2 with transformers' (reentrant) gradient checkpointing trains differently from without it from the "
    "second step (4.1547418 vs 4.1547422); torch.autocast alone is bit-equal there, ampcore is without IPEX",
    strict=True,
)
def test_gradient_checkpointing_changes_nothing_under_custom_lists(tmp_path: Path) -> None:
    assert raw_loop("O1", True)[0] == raw_loop("O1", False)[0]


@pytest.mark.slow
def test_checkpoints_carry_the_scaler(tmp_path: Path) -> None:
    run = trainer("O1", False, tmp_path, save_strategy="steps", save_steps=STEPS)
    run.train()
    saved = torch.load(tmp_path / f"checkpoint-{STEPS}" / "scaler.pt", weights_only=True)
    assert saved["scale"] == run.accelerator.scaler.get_scale()


def test_the_trainers_own_mixed_precision_is_refused(tmp_path: Path) -> None:
    args = transformers.TrainingArguments(str(tmp_path), bf16=True, use_cpu=True, report_to=[])
    with pytest.raises(ampcore.AmpcoreError, match="leave both False"):
        AmpcoreTrainer(model=build(), args=args, train_dataset=dataset())


def test_the_accelerators_clip_unscales_as_transformers_4_calls_it(tmp_path: Path) -> None:
    # transformers 4.x clips in its loop with accelerator.clip_grad_norm_ (5.x: through
    # Trainer._clip_grad_norm), which unscales only accelerate's own fp16 mode (off here):
    # 4.51 clipped the loss-scaled gradients and trained differently from the raw loop
    run = trainer("O1", False, tmp_path, save_strategy="no")
    run.create_optimizer()
    part = dataset()[:BATCH]
    batch = {key: torch.stack([row[key] for row in part]) for key in part[0]}
    with run.autocast_smart_context_manager():
        loss = run.model(**batch).loss
    scaler = run.accelerator.scaler
    scaler.scale(loss).backward()
    grads = [p.grad / scaler.get_scale() for p in run.model.parameters() if p.grad is not None]
    want = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    got = run.accelerator.clip_grad_norm_(run.model.parameters(), float("inf"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
