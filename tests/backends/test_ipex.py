"""IPEX on the CPU without IPEX: the version rule, the state ``ampcore info`` shows, and the
``ampcore_prepare_o2`` hook of the cpu adapter: decorate's own O2 unless the user opts in
with ``AMPCORE_CPU_IPEX=optimize`` (then: absent/incompatible -> one warning at the user's
call, matching -> ``ipex.optimize``).  tests/backends/test_ipex_real.py runs a real IPEX."""

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

#: An IPEX version that never matches the running torch.
OTHER = "2.1.0+cpu"

#: Whether this test process imported IPEX before the tests (``python3 tasks.py compat`` does).
IMPORTED_BY_THE_PROGRAM = _ipex.MODULE in sys.modules

# (installed IPEX, running torch, decision)
VERSIONS = [
    (None, "2.13.0+cpu", "absent"),
    ("2.8.0+cpu", "2.8.0+cpu", "compatible"),
    ("2.8.0", "2.8.2", "compatible"),
    ("2.8.10+xpu", "2.8.0+xpu", "compatible"),
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

    def __init__(self, fails: Exception | None = None) -> None:
        super().__init__(_ipex.MODULE)
        self.__spec__ = importlib.machinery.ModuleSpec(_ipex.MODULE, None)
        self.calls: list[dict[str, Any]] = []
        self.fails = fails

    def optimize(self, model: torch.nn.Module, dtype: torch.dtype | None = None, optimizer: Any = None) -> Any:
        self.calls.append({"model": model, "dtype": dtype, "optimizer": optimizer})
        if self.fails is not None:
            raise self.fails
        model = model.to(dtype)
        return model if optimizer is None else (model, optimizer)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``installed(version, module=None, mode=None)``: pretend IPEX ``version`` is installed
    (``module``: what importing it gives) and ``AMPCORE_CPU_IPEX`` is ``mode``."""
    _ipex._import_ipex.cache_clear()
    _ipex._warn_once.cache_clear()
    monkeypatch.delenv(_ipex.ENV, raising=False)

    def install(version: str | None, module: types.ModuleType | None = None, mode: str | None = None) -> None:
        monkeypatch.setattr(_ipex, "installed_ipex_version", lambda: version)
        if module is not None:
            monkeypatch.setitem(sys.modules, _ipex.MODULE, module)
        if mode is not None:
            monkeypatch.setenv(_ipex.ENV, mode)

    yield install
    _ipex._import_ipex.cache_clear()
    _ipex._warn_once.cache_clear()


def _prepare(model: torch.nn.Module, optimizer: Any, dtype: torch.dtype) -> Any:
    hook = ampcore.get_backend("cpu").hook("ampcore_prepare_o2")
    assert hook is not None
    return hook(model=model, optimizer=optimizer, dtype=dtype)


# -- the opt-in and the state ampcore info shows (pure) ------------------------------------


def test_the_opt_in_is_off_unless_it_says_optimize() -> None:
    assert _ipex.ipex_mode({}) == "off"
    assert _ipex.ipex_mode({_ipex.ENV: ""}) == "off"
    assert _ipex.ipex_mode({_ipex.ENV: "OFF"}) == "off"
    assert _ipex.ipex_mode({_ipex.ENV: " optimize "}) == "optimize"
    with pytest.raises(ampcore.AmpcoreError, match=r"AMPCORE_CPU_IPEX='1': expected one of off, optimize"):
        _ipex.ipex_mode({_ipex.ENV: "1"})


MATCHING = ipex_compatibility("2.8.0+cpu", "2.8.0+cpu")
MISMATCHED = ipex_compatibility("2.8.0+cpu", "2.13.0+cpu")

# (compatibility, opt-in, imported by the program, import error, state, words in the detail)
STATES = [
    (ipex_compatibility(None, "2.8.0"), "off", False, None, "absent", []),
    (ipex_compatibility(None, "2.8.0"), "optimize", False, None, "absent", ["is not installed"]),
    (MISMATCHED, "off", False, None, "incompatible", ["supports torch 2.8.* only", "AttributeError, exit code 1"]),
    (MISMATCHED, "optimize", False, None, "incompatible", ["2.13.0+cpu is running"]),
    (MATCHING, "off", False, None, "not used", ["breaks decorate's contract", "AMPCORE_CPU_IPEX=optimize opts in"]),
    (MATCHING, "off", True, None, "not used", ["imported by this program", "not in place"]),
    (MATCHING, "optimize", False, "ImportError: libfoo", "incompatible", ["importing it failed (ImportError: libfoo)"]),
    (MATCHING, "optimize", True, None, "used", ["calls ipex.optimize", "outside decorate's contract"]),
]


@pytest.mark.parametrize(("compatibility", "mode", "imported", "error", "kind", "words"), STATES)
def test_ipex_state(
    compatibility: Any, mode: Any, imported: bool, error: str | None, kind: str, words: list[str]
) -> None:
    state = _ipex.describe_ipex(compatibility, mode, imported, error)
    assert state.kind == kind
    assert all(word in str(state) for word in words), str(state)
    assert str(state).startswith(kind)


def test_ampcore_info_shows_the_ipex_state(installed: Any) -> None:
    from ampcore._cli.info import collect_info, format_info

    installed(OTHER)
    info = collect_info()
    (cpu,) = [b for b in info["backends"] if b["name"] == "cpu"]
    assert cpu["info"]["ipex"].startswith(
        "incompatible: intel-extension-for-pytorch 2.1.0+cpu supports torch 2.1.* only"
    )
    assert "cpu ipex: incompatible" in format_info(info)
    assert (_ipex.MODULE in sys.modules) == IMPORTED_BY_THE_PROGRAM  # never imported unasked


# -- decorate's O2 on the cpu backend ------------------------------------------------------


def test_without_ipex_the_hook_leaves_o2_to_the_core(installed: Any) -> None:
    installed(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None


def test_a_matching_ipex_is_not_used_unless_opted_in(installed: Any) -> None:
    fake = FakeIpex()
    installed(torch.__version__, fake)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*Intel Extension", ampcore.AmpcoreWarning)
        out_model, out_opt = ampcore.decorate(model, opt, level="O2", dtype=torch.bfloat16, device="cpu")
    assert fake.calls == []
    assert out_model is model and out_opt is opt and model.weight.dtype == torch.bfloat16
    assert opt.param_groups[0]["params"][0].dtype == torch.float32  # ampcore's fp32 masters


def test_an_incompatible_ipex_is_silent_unless_opted_in(installed: Any) -> None:
    installed(OTHER)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*Intel Extension", ampcore.AmpcoreWarning)
        model = ampcore.decorate(torch.nn.Linear(4, 4), level="O2", dtype=torch.bfloat16, device="cpu")
    assert model.weight.dtype == torch.bfloat16
    assert (_ipex.MODULE in sys.modules) == IMPORTED_BY_THE_PROGRAM


def test_opted_in_incompatible_ipex_warns_once_at_the_users_call(installed: Any) -> None:
    installed(OTHER, mode="optimize")
    with pytest.warns(ampcore.AmpcoreWarning, match="supports torch 2.1.\\* only") as record:
        for _ in range(2):
            model = torch.nn.Linear(4, 4)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            out_model, _ = ampcore.decorate(model, opt, level="O2", dtype=torch.bfloat16, device="cpu")  # the call
            assert out_model is model and model.weight.dtype == torch.bfloat16  # the core's O2
    (warning,) = [w for w in record if "Intel Extension for PyTorch" in str(w.message)]
    assert warning.filename == __file__  # not backends/_ipex.py
    assert "ampcore.decorate(" in open(__file__).read().splitlines()[warning.lineno - 1]
    assert "Using ampcore's own O2 instead" in str(warning.message)
    assert (_ipex.MODULE in sys.modules) == IMPORTED_BY_THE_PROGRAM


def test_opted_in_without_ipex_warns_once(installed: Any) -> None:
    installed(None, mode="optimize")
    with pytest.warns(ampcore.AmpcoreWarning, match="intel-extension-for-pytorch is not installed"):
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None


def test_opted_in_matching_ipex_prepares_bf16_o2_with_ipex_optimize(installed: Any) -> None:
    fake = FakeIpex()
    installed(torch.__version__, fake, mode="optimize")
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared, prepared_optimizer = _prepare(model, optimizer, torch.bfloat16)
    assert fake.calls == [{"model": model, "dtype": torch.bfloat16, "optimizer": optimizer}]
    assert prepared.weight.dtype == torch.bfloat16 and prepared_optimizer is optimizer
    assert _prepare(model, None, torch.bfloat16)[1] is None
    assert str(_ipex.ipex_state()).startswith("used")


def test_float16_o2_is_left_to_the_core_even_opted_in(installed: Any) -> None:
    fake = FakeIpex()
    installed(torch.__version__, fake, mode="optimize")
    assert _prepare(torch.nn.Linear(2, 2), None, torch.float16) is None
    assert fake.calls == []


def test_opted_in_ipex_that_fails_to_import_warns_once(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    installed(torch.__version__, mode="optimize")
    monkeypatch.setitem(sys.modules, _ipex.MODULE, None)  # makes `import intel_extension_for_pytorch` raise
    with pytest.warns(ampcore.AmpcoreWarning) as record:
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None
        assert _prepare(torch.nn.Linear(2, 2), None, torch.bfloat16) is None
    (warning,) = [w for w in record if issubclass(w.category, ampcore.AmpcoreWarning)]
    assert "importing intel-extension-for-pytorch failed (ModuleNotFoundError" in str(warning.message)


def test_an_invalid_opt_in_is_an_error_naming_the_choices(installed: Any) -> None:
    installed(None, mode="yes")
    with pytest.raises(ampcore.AmpcoreError, match="expected one of off, optimize"):
        ampcore.decorate(torch.nn.Linear(2, 2), level="O2", dtype=torch.bfloat16, device="cpu")


def test_opted_in_ipex_optimize_that_fails_warns_once_and_leaves_o2_to_the_core(installed: Any) -> None:
    # IPEX 2.8 on a CPU without AVX512: bf16 weight prepacking asserts
    fake = FakeIpex(fails=AssertionError("BF16 weight prepack needs the cpu support avx_ne_convert or avx512bw"))
    installed(torch.__version__, fake, mode="optimize")
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(ampcore.AmpcoreWarning, match=r"ipex.optimize failed \(AssertionError: BF16 weight prepack"):
        out_model, out_opt = ampcore.decorate(model, opt, level="O2", dtype=torch.bfloat16, device="cpu")
    assert out_model is model and out_opt is opt and model.weight.dtype == torch.bfloat16
    assert opt.param_groups[0]["params"][0].dtype == torch.float32


# -- issue 28, row 14: an IPEX whose import calls sys.exit (IPEX 2.8 on a CPU without AVX2)


@pytest.fixture
def exiting_ipex(installed: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A matching IPEX on sys.path whose import calls ``sys.exit(1)``; opted in."""
    package = tmp_path / _ipex.MODULE
    package.mkdir()
    (package / "__init__.py").write_text("import sys\nprint('no AVX2')\nsys.exit(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, _ipex.MODULE, raising=False)
    installed(torch.__version__, mode="optimize")


@pytest.mark.skipif(IMPORTED_BY_THE_PROGRAM, reason="this process imported a real IPEX")
def test_an_ipex_that_exits_at_import_warns_once_and_leaves_o2_to_the_core(exiting_ipex: None) -> None:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(ampcore.AmpcoreWarning, match=r"importing intel-extension-for-pytorch failed \(SystemExit: 1\)"):
        out_model, out_opt = ampcore.decorate(model, opt, level="O2", dtype=torch.bfloat16, device="cpu")
    assert out_model is model and out_opt is opt and model.weight.dtype == torch.bfloat16  # the core's O2
    from ampcore._cli.info import collect_info

    (cpu,) = [b for b in collect_info()["backends"] if b["name"] == "cpu"]  # `ampcore info`: no exit either
    assert cpu["info"]["ipex"].startswith("incompatible") and "(SystemExit: 1)" in cpu["info"]["ipex"]
