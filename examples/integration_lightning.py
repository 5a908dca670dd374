"""Lightning Trainer with ampcore's precision plugin, on a small Llama built from a config.

    pip install "ampcore[lightning,transformers]" -c constraints.txt   # keep your torch
    python examples/integration_lightning.py [--level O1] [--dtype bfloat16] [--steps 5]

The plugin carries the device, level, dtype, custom lists and scaler options; the scaler's
state goes into Lightning's checkpoints.  At level O2 the plugin decorates the module and
its optimizer when the Trainer connects them.
"""

from __future__ import annotations

import argparse
import warnings

import lightning
import torch
import transformers

from ampcore.integrations import AmpcoreSettings
from ampcore.integrations.lightning import AmpcorePrecision


def tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


class LanguageModel(lightning.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_llama()

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        print(f"step {index}: loss {loss.item():.4f}")
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="O1", choices=["O0", "OD", "O1", "O2"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module="lightning")
    settings = AmpcoreSettings(device="cpu", level=args.level, dtype=args.dtype, custom_black_list={"softmax"})
    plugin = AmpcorePrecision(settings)
    data = torch.randint(0, 128, (args.steps, 4, 32), generator=torch.Generator().manual_seed(0))
    trainer = lightning.Trainer(
        accelerator="cpu", devices=1, max_steps=args.steps, plugins=[plugin], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(LanguageModel(), train_dataloaders=torch.utils.data.DataLoader(list(data), batch_size=None))
    print(f"loss scale {plugin.scaler.get_scale() if plugin.scaler else None}")


if __name__ == "__main__":
    main()
