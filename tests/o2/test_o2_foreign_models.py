"""Level O2 on model code ampcore did not write: norm-like layers of other libraries,
float32 constant buffers, registered float32 types, state dicts after in-place writes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import ampcore

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


class LlamaRMSNorm(nn.Module):
    """As in Hugging Face transformers: upcasts to float32 explicitly."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class FrozenBatchNorm2d(nn.Module):
    """As in torchvision: statistics as buffers, no _BatchNorm base class."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        for name in ("weight", "bias", "running_mean", "running_var"):
            self.register_buffer(
                name, torch.ones(channels) if name in ("weight", "running_var") else torch.zeros(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + 1e-5).rsqrt()
        return x * scale[:, None, None] + (self.bias - self.running_mean * scale)[:, None, None]


class AdaLayerNorm(nn.Module):
    """A norm-like layer with a child that has parameters: kept as a whole subtree."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.modulation = nn.Linear(size, size)
        self.norm = nn.LayerNorm(size, elementwise_affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * (1 + self.modulation(x))


class Rotary(nn.Module):
    """Hugging Face style rotary embedding (transformers 5): an inv_freq buffer, tables
    computed by plain ops that O2 would run in low precision, cast to the states' dtype."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("persistent_freq", inv_freq.clone())

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq.float()
        freqs2 = positions[:, None].float() * self.persistent_freq.float()
        return freqs.cos().to(x.dtype), freqs2.sin().to(x.dtype)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.rms = LlamaRMSNorm(16)
        self.ada = AdaLayerNorm(16)
        self.rotary = Rotary()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ada(self.rms(self.linear(x)))


@pytest.mark.parametrize(("dtype", "kept"), [(FP16, True), (BF16, False)])
def test_norm_like_classes_of_other_libraries_follow_the_norm_rule(dtype: torch.dtype, kept: bool) -> None:
    model = ampcore.decorate(Block(), level="O2", dtype=dtype, device="cpu")
    norm_dtype = FP32 if kept else dtype
    assert model.rms.weight.dtype == norm_dtype
    assert model.ada.modulation.weight.dtype == norm_dtype  # the whole subtree
    assert model.linear.weight.dtype == dtype
    with ampcore.autocast(device="cpu", level="O2", dtype=dtype):
        out = model(torch.randn(4, 16))
    assert out.dtype == dtype


def test_keep_norm_fp32_reaches_norm_like_classes() -> None:
    model = ampcore.decorate(Block(), level="O2", dtype=BF16, device="cpu", keep_norm_fp32=True)
    assert model.rms.weight.dtype == model.ada.modulation.weight.dtype == FP32


def test_batchnorm_like_classes_stay_float32_for_every_dtype() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 1), FrozenBatchNorm2d(4))
    ampcore.decorate(model, level="O2", dtype=BF16, device="cpu", cast_buffers=True)
    assert model[1].running_var.dtype == model[1].weight.dtype == FP32
    assert model[0].weight.dtype == BF16


def test_rotary_tables_are_exact_under_o2() -> None:
    positions = torch.arange(2048)
    x = torch.zeros(1, dtype=BF16)
    cos, sin = Rotary()(x, positions)  # float32 tables, then rounded once
    model = ampcore.decorate(nn.Sequential(nn.Linear(4, 4), Rotary()), level="O2", device="cpu")
    rotary = model[1]
    assert rotary.inv_freq.dtype == rotary.persistent_freq.dtype == FP32
    with ampcore.autocast(device="cpu", level="O2"):
        got_cos, got_sin = rotary(x, positions)
    assert torch.equal(got_cos, cos) and torch.equal(got_sin, sin)


def test_register_fp32_module_always_and_as_a_norm() -> None:
    class Stats(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale

    class Subclass(Stats):
        pass

    try:
        assert ampcore.register_fp32_module(Stats) is Stats
        model = ampcore.decorate(nn.Sequential(nn.Linear(4, 4), Subclass()), level="O2", dtype=BF16, device="cpu")
        assert model[1].scale.dtype == FP32 and model[0].weight.dtype == BF16
        with pytest.raises(ampcore.AmpcoreError, match="registered already with norm=False"):
            ampcore.register_fp32_module(Stats, norm=True)
        ampcore.unregister_fp32_module(Stats)
        ampcore.register_fp32_module(Stats, norm=True)
        bf16 = ampcore.decorate(nn.Sequential(Stats()), level="O2", dtype=BF16, device="cpu")
        fp16 = ampcore.decorate(nn.Sequential(Stats()), level="O2", dtype=FP16, device="cpu")
        assert bf16[0].scale.dtype == BF16 and fp16[0].scale.dtype == FP32
    finally:
        ampcore.unregister_fp32_module(Stats)
    assert ampcore.decorate(nn.Sequential(Stats()), level="O2", dtype=BF16, device="cpu")[0].scale.dtype == BF16


@pytest.mark.parametrize("bad", [nn.Linear(2, 2), int, "LayerNorm"])
def test_register_fp32_module_refuses_what_is_not_a_module_type(bad: object) -> None:
    with pytest.raises(ampcore.AmpcoreError, match="expected an nn.Module subclass"):
        ampcore.register_fp32_module(bad)  # type: ignore[arg-type]


def test_state_dict_is_not_stale_after_an_in_place_write() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ampcore.decorate(model, opt, level="O2", device="cpu")
    with torch.no_grad():
        model[0].weight.fill_(0.5)  # as nn.init or DDP's broadcast on another rank
    saved = model.state_dict()
    assert saved["0.weight"].dtype == FP32 and torch.equal(saved["0.weight"], torch.full((4, 4), 0.5))
    # the optimizer's masters agree, and a step continues from the written value
    assert torch.equal(opt.state_dict()["master_weights"][0], torch.full((4, 4), 0.5))


def test_a_deep_copy_does_not_adopt_its_rounded_weights() -> None:
    import copy

    model = nn.Sequential(nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ampcore.decorate(model, opt, level="O2", device="cpu")
    twin = copy.deepcopy(model)
    assert torch.equal(twin.state_dict()["0.weight"], model.state_dict()["0.weight"])


transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install ampcore[transformers])"
)


def tiny_llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.slow
def test_hf_llama_o2_float16_keeps_rmsnorm_and_rotary_float32_and_the_scale_stable() -> None:
    model = tiny_llama()
    reference = tiny_llama().model.rotary_emb
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = ampcore.decorate(model, opt, level="O2", dtype=FP16, device="cpu")
    assert model.model.norm.weight.dtype == FP32 and model.model.layers[0].input_layernorm.weight.dtype == FP32
    assert model.model.rotary_emb.inv_freq.dtype == FP32
    positions = torch.arange(512)[None]
    x = torch.zeros(1, 512, 32, dtype=FP16)  # the hidden states, whose dtype the tables take
    with ampcore.autocast(device="cpu", level="O2", dtype=FP16):
        cos, sin = model.model.rotary_emb(x, positions)
    want_cos, want_sin = reference(x, positions)  # computed in float32, then cast
    assert cos.dtype == want_cos.dtype == FP16
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    scaler = ampcore.GradScaler("cpu", dtype=FP16, collapse_patience=3, on_collapse="raise")
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ampcore.AmpcoreWarning)
        for _ in range(4):
            opt.zero_grad()
            with ampcore.autocast(device="cpu", level="O2", dtype=FP16):
                loss = model(input_ids=ids, labels=ids).loss
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
    assert scaler.get_scale() == 2.0**16  # no step overflowed
    assert losses[-1] < losses[0]
