"""transformers.Trainer with ampcore (AmpcoreTrainer), on a small Llama built from a config,
with gradient checkpointing and a checkpoint that carries the scaler.

    pip install "ampcore[transformers]" -c constraints.txt
    python examples/integration_hf_trainer.py [--level O1] [--dtype float16] [--steps 4]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import torch
import transformers

from ampcore.integrations import AmpcoreSettings
from ampcore.integrations.transformers import AmpcoreTrainer


def tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="O1", choices=["O0", "OD", "O1", "O2"])
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    rows = torch.randint(0, 128, (4 * args.steps, 32), generator=torch.Generator().manual_seed(0))
    dataset = [{"input_ids": row, "labels": row} for row in rows]
    settings = AmpcoreSettings(device="cpu", level=args.level, dtype=args.dtype, scaler={"init_scale": 2.0**12})
    with tempfile.TemporaryDirectory() as output:
        training = transformers.TrainingArguments(
            output, max_steps=args.steps, per_device_train_batch_size=4, learning_rate=1e-3, use_cpu=True,
            report_to=[], logging_steps=1, save_strategy="steps", save_steps=args.steps, gradient_checkpointing=True,
            disable_tqdm=True,
        )  # fmt: skip
        trainer = AmpcoreTrainer(model=tiny_llama(), args=training, train_dataset=dataset, ampcore=settings)
        trainer.train()
        saved = torch.load(f"{output}/checkpoint-{args.steps}/scaler.pt", weights_only=True)
        print(f"loss scale {trainer.accelerator.scaler.get_scale()} (checkpoint: {saved['scale']})")


if __name__ == "__main__":
    main()
