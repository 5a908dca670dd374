"""Hugging Face Accelerate with ampcore (AmpcoreAccelerator), on a small GPT-2 built from a
config: gradient accumulation, clipping, and a checkpoint that carries the scaler.

    pip install "ampcore[transformers]" -c constraints.txt   # accelerate comes with it
    python examples/integration_accelerate.py [--level O1] [--dtype float16] [--steps 6]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import torch
import transformers

from ampcore.integrations import AmpcoreSettings
from ampcore.integrations.accelerate import AmpcoreAccelerator


def tiny_gpt2() -> transformers.GPT2LMHeadModel:
    config = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="O1", choices=["O0", "OD", "O1", "O2"])
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    settings = AmpcoreSettings(device="cpu", level=args.level, dtype=args.dtype, scaler={"init_scale": 2.0**12})
    accelerator = AmpcoreAccelerator(cpu=True, gradient_accumulation_steps=2, ampcore=settings)
    model = tiny_gpt2()
    model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    data = torch.randint(0, 128, (args.steps, 4, 32), generator=torch.Generator().manual_seed(0))
    for step, batch in enumerate(data):
        with accelerator.accumulate(model):
            with accelerator.autocast():
                loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}")
    with tempfile.TemporaryDirectory() as directory:
        accelerator.save_state(directory)  # model, optimizer and ampcore's scaler (scaler.pt)
    print(f"loss scale {accelerator.scaler.get_scale() if accelerator.scaler else None}")


if __name__ == "__main__":
    main()
