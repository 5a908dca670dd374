"""decorate's O2 contract (docs/o2.md) with a real, matching Intel Extension for PyTorch
imported in the process.  Runs in ``python3 tasks.py compat`` (torch 2.8 + IPEX 2.8); skips
where no matching IPEX is installed (torch 2.13: IPEX is archived at 2.8)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import ampcore
from ampcore_backends import _ipex

_COMPATIBILITY = _ipex.ipex_compatibility(_ipex.installed_ipex_version(), torch.__version__)
pytestmark = pytest.mark.skipif(
    _COMPATIBILITY.kind != "compatible",
    reason=f"needs intel-extension-for-pytorch matching torch {torch.__version__} ({_COMPATIBILITY})",
)


@pytest.fixture(scope="module")
def ipex() -> Any:
    """The real IPEX, imported as a user's program would (its kernels then sit on AutocastCPU)."""
    return pytest.importorskip(_ipex.MODULE)


@pytest.fixture(autouse=True)
def default_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(_ipex.ENV, raising=False)
    _ipex._warn_once.cache_clear()
    yield
    _ipex._warn_once.cache_clear()


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def convnet() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 4))


def _batch(model: nn.Module, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    shape = (4, 8) if isinstance(model[0], nn.Linear) else (4, 3, 6, 6)
    return torch.randn(shape, generator=generator), torch.randn(4, 4, generator=generator)


def _step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> float:
    x, y = _batch(model, step)
    opt.zero_grad()
    with ampcore.autocast("cpu", level="O2"):
        loss = nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    opt.step()
    return float(loss)


def test_decorate_is_in_place_with_fp32_masters(ipex: Any) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out_model, out_opt = ampcore.decorate(model, opt, level="O2", device="cpu")
    assert out_model is model and out_opt is opt
    assert model[0].weight.dtype == torch.bfloat16 and model[0].weight.shape == (16, 8)
    masters = [p for g in opt.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in masters)
    assert [tuple(p.shape) for p in masters] == [tuple(p.shape) for p in model.parameters()]


def test_decorating_twice_is_refused(ipex: Any) -> None:
    model = mlp()
    ampcore.decorate(model, level="O2", device="cpu")
    with pytest.raises(ampcore.AmpcoreError, match="already decorated"):
        ampcore.decorate(model, level="O2", device="cpu")


@pytest.mark.parametrize("train", [True, False])
def test_decorate_without_an_optimizer(ipex: Any, train: bool) -> None:
    model = mlp().train(train)
    assert ampcore.decorate(model, level="O2", device="cpu") is model
    assert type(model) is nn.Sequential and model[2].weight.dtype == torch.bfloat16


def test_a_float32_input_outside_autocast_gives_bf16(ipex: Any) -> None:
    model = ampcore.decorate(mlp(), level="O2", device="cpu")
    out = model(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16


def test_small_updates_reach_the_masters(ipex: Any) -> None:
    model = nn.Linear(1, 1, bias=False)
    nn.init.constant_(model.weight, 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ampcore.decorate(model, opt, level="O2", device="cpu")
    for _ in range(10):
        opt.zero_grad()
        model(torch.ones(1, 1)).float().sum().backward()
        opt.step()
    (master,) = opt.param_groups[0]["params"]
    assert master.dtype == torch.float32 and master.item() == pytest.approx(1.0 - 10e-4, abs=1e-6)


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
}


@pytest.mark.parametrize("build", [mlp, convnet], ids=["mlp", "conv"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_resume_is_exact(ipex: Any, build: Callable[[], nn.Module], optimizer: str) -> None:
    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = build()
        return ampcore.decorate(model, OPTIMIZERS[optimizer](model.parameters()), level="O2", device="cpu")

    model, opt = fresh()
    for step in range(3):
        _step(model, opt, step)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)
    continued = [_step(model, opt, step) for step in range(3, 6)]

    resumed_model, resumed_opt = fresh()
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed_model.load_state_dict(saved["model"])
    resumed_opt.load_state_dict(saved["optimizer"])
    resumed = [_step(resumed_model, resumed_opt, step) for step in range(3, 6)]
    assert resumed == continued
    for a, b in zip(model.state_dict().values(), resumed_model.state_dict().values(), strict=False):
        assert torch.equal(a, b)


def test_ampcore_info_says_ipex_is_there_but_not_used(ipex: Any) -> None:
    from ampcore._cli.info import collect_info

    (cpu,) = [b for b in collect_info()["backends"] if b["name"] == "cpu"]
    assert cpu["info"]["ipex"].startswith("not used: intel-extension-for-pytorch")
    assert "imported by this program" in cpu["info"]["ipex"]


def test_opting_in_routes_bf16_o2_through_ipex_optimize(ipex: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_ipex.ENV, "optimize")
    assert str(_ipex.ipex_state()).startswith("used")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out_model, out_opt = ampcore.decorate(model, opt, level="O2", device="cpu")
    failed = [w for w in caught if "ipex.optimize failed" in str(w.message)]
    if failed:  # a CPU IPEX cannot serve in bf16 (no AVX512): ampcore's own O2, one warning
        assert out_model is model and model[0].weight.dtype == torch.bfloat16
        assert failed[0].filename == __file__
    else:  # what docs/backends.md says changes: new objects, the original model stays float32
        assert out_model is not model and model[0].weight.dtype == torch.float32 and out_opt is not None
