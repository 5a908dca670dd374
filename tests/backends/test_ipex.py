"""IPEX on the CPU: the compatibility rule as a pure function of two version strings, and the
``ampcore_prepare_o2`` hook of the cpu adapter (absent, incompatible: one warning, usable)."""

from __future__ import annotations

import importlib.machinery
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import ampcore
from ampcore_backends import _ipex
from ampcore_backends._ipex import ipex_compatibility

# (installed IPEX, running torch, decision)
VERSIONS = [
    (None, "2.13.0+cpu", "absent"),
    ("2.8.0+cpu", "2.8.0+cpu", "use"),
    ("2.8.0", "2.8.2", "use"),
    ("2.8.10+xpu", "2.8.0+xpu", "use"),
    ("2.8.0+cpu", "2.13.0+cpu", "incompatible"),
    ("2.8.0", "2.7.1", "incompatible"),
    ("2.1.100", "2.10.0", "incompatible"),
    ("nightly", "2.13.0", "incompatible"),
]


@pytest.mark.parametrize(("ipex", "torch_version", "kind"), VERSIONS)
def test_compatibility_rule(ipex: str | None, torch_version: str, kind: str) -> None:
    assert ipex_compatibility(ipex, torch_version).kind == kind


def test_incompatible_message_names_both_versions() -> None:
    decision = ipex_compatibility("2.8.0+cpu", "2.13.0+cpu")
    assert str(decision) == (
        "incompatible: intel-extension-for-pytorch 2.8.0+cpu supports torch 2.8.* only, but torch 2.13.0+cpu is running"
    )


class FakeIpex(types.ModuleType):
    """``intel_extension_for_pytorch.optimize`` recording its calls (casts the model to bf16)."""

    def __init__(self) -> None:
        super().__init__(_ipex.MODULE)
        self.__spec__ = importlib.machinery.ModuleSpec(_ipex.MODULE, None)
        self.calls: list[dict[str, Any]] = []

    def optimize(self, model: torch.nn.Module, dtype: torch.dtype | None = None, optimizer: Any = None) -> Any:
        self.calls.append({"model": model, "dtype": dtype, "optimizer": optimizer})
        model = model.to(dtype)
        return model if optimizer is None else (model, optimizer)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``installed(version, module=None)``: pretend IPEX ``version`` is installed."""
    _ipex.ipex_for_o2.cache_clear()

    def install(version: str | None, module: types.ModuleType | None = None) -> None:
        monkeypatch.setattr(_ipex, "installed_ipex_version", lambda: version)
        if module is not None:
            monkeypatch.setitem(sys.modules, _ipex.MODULE, module)

    yield install
    _ipex.ipex_for_o2.cache_clear()


def _prepare(model: torch.nn.Module, optimizer: Any, dtype: torch.dtype) -> Any:
    hook = ampcore.get_backend("cpu").hook("ampcore_prepare_o2")
    assert hook is not None
    return hook(model=model, optimizer=optimizer, dtype=dtype)


def test_without_ipex_the_hook_leaves_o2_to_the_core(installed: Any) -> None:
    installed(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None


def test_incompatible_ipex_warns_once_per_process_and_is_not_imported(installed: Any) -> None:
    installed("2.8.0+cpu")
    with pytest.warns(ampcore.AmpcoreWarning) as record:
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None
    messages = [str(w.message) for w in record if issubclass(w.category, ampcore.AmpcoreWarning)]
    assert len(messages) == 1
    assert "supports torch 2.8.* only" in messages[0] and torch.__version__ in messages[0]
    assert "Using stock PyTorch O2 instead" in messages[0]
    assert _ipex.MODULE not in sys.modules


def test_matching_ipex_prepares_bf16_o2_with_ipex_optimize(installed: Any) -> None:
    fake = FakeIpex()
    installed(torch.__version__, fake)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared, prepared_optimizer = _prepare(model, optimizer, torch.bfloat16)
    assert fake.calls == [{"model": model, "dtype": torch.bfloat16, "optimizer": optimizer}]
    assert prepared.weight.dtype == torch.bfloat16 and prepared_optimizer is optimizer
    assert _prepare(model, None, torch.bfloat16)[1] is None


def test_float16_o2_is_left_to_the_core_even_with_ipex(installed: Any) -> None:
    fake = FakeIpex()
    installed(torch.__version__, fake)
    assert _prepare(torch.nn.Linear(2, 2), None, torch.float16) is None
    assert fake.calls == []


def test_ipex_that_fails_to_import_warns_once(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    installed(torch.__version__)
    monkeypatch.setitem(sys.modules, _ipex.MODULE, None)  # makes `import intel_extension_for_pytorch` raise
    with pytest.warns(ampcore.AmpcoreWarning) as record:
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None
    (warning,) = [w for w in record if issubclass(w.category, ampcore.AmpcoreWarning)]
    assert "importing intel-extension-for-pytorch failed (ModuleNotFoundError" in str(warning.message)


# -- through ampcore.decorate on the cpu backend --------------------------------------------


def test_decorate_o2_on_cpu_uses_a_matching_ipex(installed: Any) -> None:
    fake = FakeIpex()
    installed(torch.__version__, fake)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out_model, out_opt = ampcore.decorate(model, opt, level="O2", dtype=torch.bfloat16, device="cpu")
    assert [call["dtype"] for call in fake.calls] == [torch.bfloat16]
    assert fake.calls[0]["model"] is model and fake.calls[0]["optimizer"] is opt
    assert out_model.weight.dtype == torch.bfloat16 and out_opt is opt


def test_decorate_o2_on_cpu_with_an_incompatible_ipex_warns_once_and_uses_stock_o2(installed: Any) -> None:
    installed("2.8.0+cpu")
    with pytest.warns(ampcore.AmpcoreWarning, match="supports torch 2.8.\\* only") as record:
        for _ in range(2):
            model = torch.nn.Linear(4, 4)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            out_model, _ = ampcore.decorate(model, opt, level="O2", dtype=torch.bfloat16, device="cpu")
            assert out_model is model and model.weight.dtype == torch.bfloat16  # the core's O2
    assert sum("Intel Extension for PyTorch" in str(w.message) for w in record) == 1
    assert _ipex.MODULE not in sys.modules


def test_decorate_o2_on_cpu_without_ipex_is_stock_and_silent(installed: Any) -> None:
    installed(None)
    model = torch.nn.Linear(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ampcore.AmpcoreWarning)
        ampcore.decorate(model, level="O2", dtype=torch.bfloat16, device="cpu")
    assert model.weight.dtype == torch.bfloat16
