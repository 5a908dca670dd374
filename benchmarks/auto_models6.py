"""The held-out models of issue 27's sixth sweep for ``bench_auto.py`` (its docstring
describes each): kinds the earlier sweeps' benchmarks did not have."""

from __future__ import annotations

from typing import Any, Final


def _unet(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-unet``: a 2-level U-Net on 8 x 3 x 64 x 64 images (convolutions 3 -> 32 ->
    64, a ``ConvTranspose2d`` up, skip concatenations), its output compared with the image."""
    import torch
    from torch import nn

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc1 = nn.Conv2d(3, 32, 3, padding=1)
            self.enc2 = nn.Conv2d(32, 64, 3, padding=1)
            self.up = nn.ConvTranspose2d(64, 32, 2, stride=2)
            self.dec = nn.Conv2d(64, 32, 3, padding=1)
            self.out = nn.Conv2d(32 + 3, 3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            e1 = torch.relu(self.enc1(x))
            e2 = torch.relu(self.enc2(nn.functional.max_pool2d(e1, 2)))
            d = torch.relu(self.dec(torch.cat([self.up(e2), e1], 1)))
            return self.out(torch.cat([d, x], 1))

    return UNet().to(device), (torch.rand(8, 3, 64, 64, device=device),)


def _lstm_lm(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-lstm-lm``: an LSTM language model: ``Embedding(4096, 256)``, a 2-layer
    ``nn.LSTM(256, 256)``, a ``Linear(256, 256)`` and a head tied to the embedding, on 16 x 32
    tokens."""
    import torch
    from torch import nn

    class LstmLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(4096, 256)
            self.lstm = nn.LSTM(256, 256, num_layers=2, batch_first=True)
            self.proj = nn.Linear(256, 256)
            self.head = nn.Linear(256, 4096, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.head(torch.tanh(self.proj(self.lstm(self.emb(ids))[0])))

    ids = torch.randint(0, 4096, (16, 32), device=device)
    return LstmLM().to(device), (ids, torch.rand(16, 32, 4096, device=device))


def _bags(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-bags``: DLRM-like: ``EmbeddingBag(65536, 64)`` sums of 8 ids per sample
    beside 13 dense features, an MLP 77 -> 512 -> 256 -> 1, batch 2048."""
    import torch
    from torch import nn

    class Bags(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag = nn.EmbeddingBag(65536, 64, mode="sum")
            self.mlp = nn.Sequential(nn.Linear(77, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 1))

        def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, target: torch.Tensor) -> Any:
            return self.mlp(torch.cat([dense, self.bag(ids, offsets)], 1))

    batch = 2048
    ids = torch.randint(0, 65536, (batch * 8,), device=device)
    offsets = torch.arange(0, batch * 8, 8, device=device)
    data = (torch.rand(batch, 13, device=device), ids, offsets, torch.rand(batch, 1, device=device))
    return Bags().to(device), data


def _bert(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-bert``: a ``transformers.BertModel`` built from a config (2 layers, hidden
    256, 4 heads, feed-forward 1024, no download) on 4 x 64 tokens; the last hidden state
    is compared with a target."""
    import torch
    import transformers
    from torch import nn

    cfg = transformers.BertConfig(
        vocab_size=8192,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=64,
    )

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel(cfg)

        def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 8192, (4, 64), device=device)
    return Bert().to(device), (ids, torch.rand(4, 64, 256, device=device))


def _strided(device: str) -> tuple[Any, tuple[Any, ...]]:
    """``heldout-strided``: a CNN of unpadded strided convolutions on 16 x 3 x 64 x 64
    (``Conv2d(3, 32, 5, stride=2)`` to 30 x 30, ``Conv2d(32, 64, 3, stride=2)`` to 14 x 14,
    ``Conv2d(64, 64, 3)`` to 12 x 12: inner shapes that do not follow the input's, guarded
    per call), pooling and a ``Linear(64, 3)`` head."""
    import torch
    from torch import nn

    class Strided(nn.Sequential):
        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return super().forward(x)

    model = Strided(
        nn.Conv2d(3, 32, 5, stride=2), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 3),
    )  # fmt: skip
    return model.to(device), (torch.rand(16, 3, 64, 64, device=device), torch.rand(16, 3, device=device))


#: model name -> builder (the sixth sweep of issue 27)
SWEEP6: Final = {
    "heldout-unet": _unet,
    "heldout-lstm-lm": _lstm_lm,
    "heldout-bags": _bags,
    "heldout-bert": _bert,
    "heldout-strided": _strided,
}
