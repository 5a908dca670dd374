"""Custom lists and O2 on real model families against torch.autocast (issue 26's real-model row).

Small randomly initialised Hugging Face GPT-2, BERT and Llama models (``transformers``, the
``integrations`` extra) and a small CNN, one AdamW training step each: torch.autocast,
``custom_white_list={"add"}, custom_black_list={"softmax"}`` (O1 with custom lists) and
level O2 with ``ampcore.decorate`` (float32 master weights).  The variants of a model run
interleaved in one process (the order rotates every round); the table gives medians and
ratios against torch.autocast measured in the same process (``torch.autocast (again)``: the
noise).

    python benchmarks/bench_real_models.py --rounds 15 --clock cpu
    python benchmarks/bench_real_models.py --models gpt2 cnn --device cuda --dtype float16
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any, Final

import torch
from torch import nn

import ampcore

MODELS: Final = ("gpt2", "bert", "llama", "cnn")


def _hf(name: str) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    import transformers  # noqa: PLC0415 - optional (integrations extra)

    size = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}
    if name == "gpt2":
        config: Any = transformers.GPT2Config(
            n_embd=128, n_layer=2, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=0, eos_token_id=0
        )
        model: nn.Module = transformers.GPT2LMHeadModel(config)
    elif name == "bert":
        config = transformers.BertConfig(intermediate_size=256, **size)
        model = transformers.BertForMaskedLM(config)
    else:
        config = transformers.LlamaConfig(intermediate_size=256, num_key_value_heads=4, **size)
        model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 1000, (4, 64))
    return model, lambda: ids


def _cnn() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    model = nn.Sequential(block(3, 32), block(32, 64), block(64, 64), nn.Flatten(), nn.Linear(64 * 4 * 4, 10))
    x = torch.randn(16, 3, 32, 32)
    return model, lambda: x


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    if batch.dtype == torch.long:  # a language model: labels are the inputs
        out = model(input_ids=batch, labels=batch)
        return out.loss  # type: ignore[no-any-return]
    return model(batch).float().pow(2).mean()  # type: ignore[no-any-return]


def _step(device: str, dtype: torch.dtype, base: nn.Module, batch: torch.Tensor, variant: str) -> Callable[[], None]:
    model = copy.deepcopy(base).to(device)
    opt: Any = torch.optim.AdamW(model.parameters(), lr=1e-4)
    region: Callable[[], Any]
    if variant.startswith("torch.autocast"):
        region = lambda: torch.autocast(torch.device(device).type, dtype=dtype)  # noqa: E731
    elif variant == "custom lists":
        lists = {"custom_white_list": {"add"}, "custom_black_list": {"softmax"}}
        region = lambda: ampcore.autocast(device=device, dtype=dtype, **lists)  # noqa: E731
    else:
        model, opt = ampcore.decorate(model, opt, level="O2", dtype=dtype, device=device)
        region = lambda: ampcore.autocast(device=device, dtype=dtype, level="O2")  # noqa: E731
    batch = batch.to(device)

    def step() -> None:
        with region():
            loss = _loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run_model(name: str, device: str, dtype: torch.dtype, rounds: int, clock: Callable[[], float]) -> None:
    torch.manual_seed(0)
    base, batch = _cnn() if name == "cnn" else _hf(name)
    names = ("torch.autocast", "torch.autocast (again)", "custom lists", "O2 + decorate")
    variants = {v: _step(device, dtype, base, batch(), v) for v in names}
    sync = torch.cuda.synchronize if device.startswith("cuda") else lambda: None
    times: dict[str, list[float]] = {v: [] for v in names}
    for r in range(rounds + 3):
        order = list(names[r % len(names) :] + names[: r % len(names)])
        for v in order:
            sync()
            start = clock()
            variants[v]()
            sync()
            if r >= 3:
                times[v].append(clock() - start)
    medians = {v: statistics.median(t) for v, t in times.items()}
    base_time = medians["torch.autocast"]
    cells = " | ".join(f"{medians[v] / base_time:.3f}" for v in names[1:])
    print(f"| {name} | {base_time * 1e3:.2f} | {cells} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="cpu: thread CPU time (CPU only)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    warnings.simplefilter("ignore")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    print(f"torch {torch.__version__}, ampcore {ampcore.__version__}, device {args.device}, {args.dtype}")
    print(f"policy kernel: {ampcore._policy.executor.describe()}\n")
    print("| model | torch.autocast ms | torch.autocast (again) | custom lists | O2 + decorate |")
    print("|---|---:|---:|---:|---:|")
    for name in args.models:
        run_model(name, args.device, getattr(torch, args.dtype), args.rounds, clock)


if __name__ == "__main__":
    main()
