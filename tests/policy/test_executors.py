"""The two executors of the action table (issue 26): the choice, the fallback, and equal results.

The whole policy suite runs once per executor (CI runs tests/policy again with
``AMPCORE_POLICY_KERNEL=python``; tasks.py SECOND_EXECUTOR_RUN); here each executor also
runs one matrix of regions x calls in a process of its own, and the results, gradients and
errors must be identical, and equal to torch.autocast's where the region's policy is torch's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from _policy_testing import no_lingering_kernels  # noqa: F401 (autouse fixture)

import ampcore
from ampcore._policy import executor as executor_module
from ampcore._policy.executor import ENV, CompiledKernelWarning, describe, executor

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", ["fast", "C++", "1"])
def test_a_bad_executor_value_is_an_error_naming_the_choices(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ampcore.AmpcoreError, match="expected one of auto, compiled, python"):
        executor_module.requested()
    assert "invalid" in describe() or executor_module.executor_chosen()


@pytest.mark.parametrize("value", ["", "auto", "AUTO", " compiled ", "python"])
def test_executor_values(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ENV, value)
    assert executor_module.requested() == (value.strip().lower() or "auto")


def _failing_chooser(monkeypatch: pytest.MonkeyPatch) -> executor_module._Chooser:
    def fail() -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(executor_module, "_build", fail)
    monkeypatch.setattr(executor_module, "_missing_tools", lambda: None)
    return executor_module._Chooser()


def test_a_failed_build_falls_back_to_python_with_one_warning_naming_why(monkeypatch: pytest.MonkeyPatch) -> None:
    chooser = _failing_chooser(monkeypatch)
    with pytest.warns(CompiledKernelWarning, match="no space left on device") as caught:
        choice = chooser._choose("auto")
    assert len(caught) == 1 and choice.name == "python" and "no space left on device" in choice.reason
    assert chooser.module is None


def test_a_forced_compiled_executor_that_cannot_be_built_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    chooser = _failing_chooser(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ampcore.AmpcoreError, match=f"{ENV}=compiled.*no space left on device"):
            chooser._choose("compiled")


def test_no_compiler_falls_back_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("PATH", "")
    assert "no C++ compiler" in (executor_module._missing_tools() or "")


def test_python_is_never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_module, "_build", lambda: pytest.fail("built"))
    assert executor_module._Chooser()._choose("python").name == "python"


@pytest.mark.skipif(os.environ.get(ENV, "auto").strip().lower() == "python", reason=f"{ENV}=python")
def test_the_compiled_executor_runs_where_a_compiler_is_available() -> None:
    """Where g++ and ninja are (CI machines), the default is the compiled executor: a build
    that breaks fails here instead of silently testing the Python kernels twice."""
    if executor_module._missing_tools() is not None:
        pytest.skip(executor_module._missing_tools() or "")
    with ampcore.autocast(device="cpu", custom_white_list={"add"}):
        pass
    assert executor().name == "compiled", executor().reason
    assert describe().startswith("compiled")


MATRIX = """
import sys, torch, ampcore, torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.manual_seed(0)
BF16 = torch.bfloat16
x, y = torch.randn(6, 8), torch.randn(6, 8)
w, b = torch.randn(8, 8, requires_grad=True), torch.randn(8, requires_grad=True)
q = torch.randn(2, 2, 4, 8)
idx, p = torch.tensor([0, 2]), torch.rand(3)
layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
MODELS = (("layer", layer, torch.randn(2, 3, 8)), ("conv", conv, torch.randn(2, 3, 6, 6)))
CALLS = {
    "add": lambda: x + y, "add_bf16": lambda: x.to(BF16) + y, "mul_number": lambda: x * 0.1,
    "rsub_number": lambda: 3 - x.to(BF16), "arange_number": lambda: torch.arange(10) * 0.5,
    "mm": lambda: torch.mm(x, w), "linear": lambda: F.linear(x, w, b), "softmax": lambda: torch.softmax(x, -1),
    "sum": lambda: x.to(BF16).sum(), "sum_dtype": lambda: x.sum(dtype=torch.float64), "mean": lambda: x.mean(0),
    "cat": lambda: torch.cat([x, y.to(BF16)]), "addcmul": lambda: torch.addcmul(x, x.to(BF16), y.to(BF16)),
    "layer_norm": lambda: F.layer_norm(x, (8,)), "gelu": lambda: F.gelu(x), "cumsum": lambda: torch.cumsum(x, 0),
    "index_put": lambda: x.clone().index_put((idx,), y[:2].to(BF16)), "add_": lambda: x.clone().add_(y),
    "norm": lambda: torch.norm(x.to(BF16)), "sdpa": lambda: F.scaled_dot_product_attention(q, q, q),
    "cross_entropy": lambda: F.cross_entropy(x, torch.tensor([1, 0, 3, 2, 1, 0])),
    "bce": lambda: F.binary_cross_entropy(p, p.flip(0)),
}
REGIONS = {
    "torch": lambda: torch.autocast("cpu", dtype=BF16),
    "O1": lambda: ampcore.autocast("cpu"),
    "white_add": lambda: ampcore.autocast("cpu", custom_white_list={"add", "cumsum"}),
    "black_mm_softmax": lambda: ampcore.autocast("cpu", custom_black_list={"mm", "softmax", "mul"}),
    "reach": lambda: ampcore.autocast(
        "cpu", custom_white_list={"addmm", "bmm"}, custom_black_list={"linear", "layer_norm"}
    ),
    "OD": lambda: ampcore.autocast("cpu", level="OD"),
    "O2": lambda: ampcore.autocast("cpu", level="O2"),
    "O2_black": lambda: ampcore.autocast("cpu", level="O2", custom_black_list={"softmax", "sum"}),
}
results = {}
for rname, region in REGIONS.items():
    for cname, call in CALLS.items():
        try:
            with region():
                results[rname, cname] = call().detach()
        except RuntimeError as exc:
            results[rname, cname] = str(exc).splitlines()[0]
        with region(), sdpa_kernel(SDPBackend.MATH):
            results[rname, "sdpa_math"] = F.scaled_dot_product_attention(q, q, q)
    for mname, model, data in MODELS:
        model.zero_grad()
        with region():
            out = model(data)
        out.float().pow(2).mean().backward()
        results[rname, mname] = [out.detach()] + [p.grad.clone() for p in model.parameters()]
        results[rname, mname + "_stats"] = [t.clone() for t in model.buffers()]
torch.save(results, sys.argv[1])
print(ampcore._policy.executor.describe())
"""


def _run_matrix(kind: str, out: Path) -> tuple[dict[object, object], str]:
    env = {**os.environ, ENV: kind}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MATRIX), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return torch.load(out), done.stdout


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(i, j) for i, j in zip(a, b, strict=True))
    return a == b


@pytest.mark.skipif(executor_module._missing_tools() is not None, reason="no C++ toolchain for the compiled executor")
def test_both_executors_give_identical_results(tmp_path: Path) -> None:
    compiled, described = _run_matrix("compiled", tmp_path / "compiled.pt")
    assert described.startswith("compiled")
    python, described = _run_matrix("python", tmp_path / "python.pt")
    assert described.startswith("python")
    assert compiled.keys() == python.keys()
    differing = [key for key in compiled if not _same(compiled[key], python[key])]
    assert differing == []
    # where a region's policy is torch's, both are torch.autocast
    for key, value in compiled.items():
        region, call = key  # type: ignore[misc]
        if call.endswith("_stats"):  # running statistics accumulate from region to region
            continue
        if region == "O1" or (region == "black_mm_softmax" and call in ("add", "add_bf16", "linear", "layer")):
            assert _same(value, compiled["torch", call]), key


BAD_VALUE = """
import torch, ampcore
from ampcore._policy.registration import registered_keys, routes
try:
    with ampcore.autocast("cpu", level="O2"):
        pass
except ampcore.AmpcoreError as exc:
    print("error:", exc)
key = torch._C.DispatchKey.AutocastIPU
assert registered_keys() == {} and routes() == {} and not torch.is_autocast_enabled("cpu")
assert not torch._C._dispatch_has_backend_fallback(key) and not torch._C._dispatch_tls_is_dispatch_key_included(key)
"""


def test_a_bad_executor_value_fails_the_first_policy_region_changing_nothing() -> None:
    env = {**os.environ, ENV: "fast"}
    command = [sys.executable, "-c", BAD_VALUE]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"error: {ENV}='fast': expected one of auto, compiled, python" in done.stdout


def test_a_leftover_build_lock_is_removed_with_a_warning(tmp_path: Path) -> None:
    """A build killed with SIGKILL leaves torch's lock behind; torch would wait forever."""
    lock = tmp_path / "lock"
    lock.write_text("")
    old = lock.stat().st_mtime - executor_module.STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    with pytest.warns(ampcore.AmpcoreWarning, match=r"a build lock \d+ s old \(left by a build that was killed\)"):
        assert executor_module.clear_stale_lock(lock) is True
    assert not lock.exists()


def test_a_fresh_build_lock_is_waited_for_until_it_goes_or_grows_stale(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.write_text("")
    now = lock.stat().st_mtime
    ticks = iter([now + 1, now + 2, now + 1000])  # another process builds; then it died
    with pytest.warns(ampcore.AmpcoreWarning, match="1000 s old"):
        assert executor_module.clear_stale_lock(lock, max_age_s=600, clock=lambda: next(ticks), poll_s=0) is True
    assert not lock.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert executor_module.clear_stale_lock(lock) is False  # no lock: nothing to wait for
