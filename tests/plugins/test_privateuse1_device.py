"""ampcore on a PrivateUse1 device (plugins/ampcore-testdevice driven by the
plugins/ampcore-privateuse1 template), in every autocast registration mode a vendor's
extension can be in: none, a fallthrough only, partial kernels (declared through the
adapter), torch's generic lists.

torch hosts one PrivateUse1 device per process, so each mode runs in a fresh process
(``_acme_probe.py``) and reports the dtypes it saw.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

PROBE = Path(__file__).with_name("_acme_probe.py")
MODES = ("none", "fallthrough", "partial", "generic")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ampcore_acme") is None or importlib.util.find_spec("ampcore_testdevice") is None,
    reason="plugins/ampcore-privateuse1 and plugins/ampcore-testdevice are not installed "
    "(python3 tasks.py setup installs them)",
)


def _python(*args: str, mode: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    # tests/conftest.py blocks acme in the test process; its own processes load it
    env = {**os.environ, "AMPCORE_ACME_AUTOCAST": mode, "AMPCORE_STRICT_PLUGINS": "1", "AMPCORE_BLOCK_PLUGINS": ""}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.fixture(scope="module", params=MODES)
def probe(request: pytest.FixtureRequest) -> dict[str, Any]:
    done = _python(str(PROBE), request.param, mode=request.param)
    assert done.returncode == 0, f"probe for autocast={request.param} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.testdevice
def test_ops_give_the_dtypes_of_the_lists_in_every_region(probe: dict[str, Any]) -> None:
    """torch.mm, F.linear, x + y, F.softmax, F.mse_loss at O1, OD, O2 and with custom lists."""
    wrong = [
        f"{r['dtype']} {r['region']}: {r['probe']} gave {r['got']}, the lists say {r['want']}"
        for r in probe["rows"]
        if r["got"] != r["want"]
    ]
    assert not wrong, f"autocast={probe['mode']}:\n" + "\n".join(wrong)


@pytest.mark.testdevice
def test_uncustomised_o1_does_not_depend_on_what_ran_before(probe: dict[str, Any]) -> None:
    by_region: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for r in probe["rows"]:
        by_region.setdefault((r["dtype"], r["region"]), []).append((r["probe"], r["got"]))
    for dtype in ("torch.bfloat16", "torch.float16"):
        first = by_region[(dtype, "O1 first")]
        assert by_region[(dtype, "O1 after custom")] == first, f"autocast={probe['mode']} {dtype}"
        assert by_region[(dtype, "O1 last")] == first, f"autocast={probe['mode']} {dtype}"


@pytest.mark.testdevice
def test_grad_scaler_skips_a_step_with_a_planted_inf(probe: dict[str, Any]) -> None:
    assert probe["scaler"] == {"unchanged": True, "scale": 512.0}


@pytest.mark.testdevice
def test_decorate_o2_trains(probe: dict[str, Any]) -> None:
    o2 = probe["o2"]
    assert o2["param_dtype"] == "torch.bfloat16"
    assert o2["last"] < 0.5 * o2["first"], o2


@pytest.mark.testdevice
@pytest.mark.parametrize("mode", ["none", "generic"])
def test_bench_runs_on_the_device(mode: str) -> None:
    done = _python(
        "-m", "ampcore", "bench", "--device", "acme", "--size", "32", "--batch", "8", "--steps", "2",
        "--no-progress", "--in-process", mode=mode,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    for row in ("fp32", "torch.autocast", "AMP-O1", "AMP-O2"):
        assert f"\n{row} " in done.stdout, done.stdout
    assert "'-': unavailable" in done.stdout
    assert ("registers no autocast kernels of its own" in done.stdout) == (mode == "none")


@pytest.mark.testdevice
def test_info_says_who_provides_autocast() -> None:
    for mode, provider in (("none", "ampcore"), ("generic", "native")):
        done = _python("-m", "ampcore", "info", "--json", mode=mode)
        assert done.returncode == 0, done.stderr
        acme = next(b for b in json.loads(done.stdout)["backends"] if b["name"] == "acme")
        assert acme["autocast"] == provider, (mode, acme)


def test_a_torch_that_cannot_host_the_device_makes_acme_unavailable_with_the_reason() -> None:
    """On a torch without Python PrivateUse1 registration (2.8), the adapter loads and says
    why its device is unavailable; ampcore keeps working on the other backends."""
    if importlib.util.find_spec("ampcore_testdevice") is None:
        pytest.skip("plugins/ampcore-testdevice is not installed")
    import ampcore_testdevice

    if ampcore_testdevice.unsupported_reason() is None:
        pytest.skip(f"torch {torch.__version__} hosts the test device (its tests above run)")
    done = _python("-m", "ampcore", "info", "--json", mode="none")
    assert done.returncode == 0, done.stderr
    backends = {b["name"]: b for b in json.loads(done.stdout)["backends"]}
    assert backends["cpu"]["available"] is True
    assert backends["acme"]["available"] is False
    assert "cannot register a PrivateUse1 device from Python" in backends["acme"]["reason"], backends["acme"]


def test_generic_mode_registers_torchs_generic_lists() -> None:
    """The device's copy of the generic lists names the ops torch registers for XPU."""
    code = (
        "import torch; from ampcore_testdevice._generic_lists import GENERIC;"
        "xpu = {r.removeprefix('aten::')"
        " for r in torch._C._dispatch_get_registrations_for_dispatch_key('AutocastXPU')};"
        "ours = set(GENERIC);"
        "norm = lambda names: {n.removesuffix('.default') for n in names};"
        "print(sorted(norm(ours) ^ norm(xpu)))"
    )
    done = _python("-c", code, mode="none")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"differences with torch's AutocastXPU registrations: {done.stdout}"


@pytest.mark.parametrize("minor", range(8, 14), ids=lambda minor: f"2.{minor}")
def test_generic_mode_follows_the_torch_release(minor: int) -> None:
    """The device's copy of the generic lists is that of the installed torch, for every
    supported release (the GPU run with torch 2.11 found torch 2.13's copy registered there:
    named-tensor overloads missing, rms_norm in float32 a release early)."""
    from ampcore_testdevice._generic_lists import _for_release

    from ampcore._policy.torch_tables import GENERIC_TABLE, tables_for

    def norm(names: Any) -> set[str]:
        return {name.removesuffix(".default") for name in names}

    ours, torchs = _for_release((2, minor)), tables_for((2, minor))[GENERIC_TABLE]
    assert norm(ours) == norm(torchs)
    assert {op: ours[op] for op in ours} == {op: torchs[op] for op in ours}


@pytest.mark.testdevice
def test_a_device_without_kernels_raises_until_ampcore_knows_it_then_follows_the_lists() -> None:
    code = (
        "import torch, ampcore_testdevice as d; d.install('acme', autocast='none')\n"
        "x = torch.ones(2, 2, device='acme')\n"
        "def plain():\n"
        "    try:\n"
        "        with torch.autocast('acme', dtype=torch.bfloat16): return str(torch.mm(x, x).dtype)\n"
        "    except NotImplementedError: return 'raised'\n"
        "before = plain()\n"
        "import ampcore; ampcore.get_backend('acme').require_available()\n"
        "with ampcore.autocast('acme', dtype=torch.bfloat16): inside = str(torch.mm(x, x).dtype)\n"
        "print(before, plain(), inside)"
    )
    done = _python("-c", code, mode="none")
    assert done.returncode == 0, done.stderr
    # the vendor's own state first (no kernels, no fallthrough: torch raises); once ampcore
    # has loaded the backend its kernels provide autocast, for plain torch.autocast too
    assert done.stdout.split() == ["raised", "torch.bfloat16", "torch.bfloat16"]


@pytest.mark.testdevice
def test_plain_torch_autocast_does_not_depend_on_earlier_ampcore_regions() -> None:
    code = (
        "import torch, ampcore; ampcore.get_backend('acme').require_available()\n"
        "x = torch.randn(4, 4, device='acme')\n"
        "def plain():\n"
        "    with torch.autocast('acme', dtype=torch.float16): return str(torch.mm(x, x).dtype)\n"
        "before = plain()\n"
        "with ampcore.autocast('acme', dtype=torch.float16): pass\n"
        "print(before, plain())"
    )
    done = _python("-c", code, mode="fallthrough")
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert before == after, f"plain torch.autocast mm: {before} before an ampcore region, {after} after it"


# -- level="auto": the template's cost model -------------------------------------------------


def _linear(features: int, rows: int, grad: bool = True) -> str:
    return (
        f"Linear(in_features={features}, out_features={features}, bias=True) "
        f"in=[{rows}x{features}] {'grad' if grad else 'no-grad'}"
    )


def test_acme_cost_model_chooses_low_precision_only_where_it_pays() -> None:
    import torch
    from ampcore_acme import plugin

    from ampcore._auto._costs import decide
    from ampcore._auto._deciding import adapter_costs

    class Backend:  # what ampcore's auto planner asks: the plugin's own hook
        plugin_name, distribution = "acme", "ampcore-acme"

        @staticmethod
        def hook(name: str) -> Any:
            return getattr(plugin, name)

    big = adapter_costs(Backend, _linear(4096, 4096), torch.float16)
    tiny = adapter_costs(Backend, _linear(16, 16), torch.float16)
    assert big is not None and tiny is not None
    assert decide(big) == "low" and decide(tiny) == "fp32"  # launches of the casts dominate tiny layers
    forward = plugin.linear_costs(_linear(1024, 512, grad=False), torch.float16)
    training = plugin.linear_costs(_linear(1024, 512), torch.float16)
    assert forward is not None and training is not None and forward["fp32_ms"] < training["fp32_ms"]
    assert plugin.linear_costs(_linear(64, 64), torch.float32) is None  # not on the sheet: measure
    assert plugin.linear_costs("Conv2d(3, 8, kernel_size=(3, 3)) in=[8x3x32x32] grad", torch.float16) is None
