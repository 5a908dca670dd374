"""The conformance suite checked against deliberately broken adapters, run as a vendor would:
``ampcore conformance --backend NAME`` in a subprocess, the adapter installed as a
distribution (a ``*.dist-info`` folder on ``PYTHONPATH``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

ADAPTER = """
import torch
from ampcore import BackendSpec, hookimpl

AMPCORE_CONTRACT = 2

@hookimpl
def ampcore_backend():
    return BackendSpec(name="{name}", device_type="cpu", dtypes=[torch.float16])
{extra}
"""

#: Declares float16 but its op lists are wrong: mm (a matrix product) in float32 and
#: mse_loss (a loss) in float16.
BROKEN_LISTS = """
@hookimpl
def ampcore_op_list_adjustments(dtype):
    return {"black": ["mm"], "white": ["mse_loss"]}
"""

NO_DEVICE = """
@hookimpl
def ampcore_unavailable_reason():
    return "no Acme device or driver found"
"""

#: The checks the broken-lists run selects: all but the slowest modules (levels and
#: convergence apply the same lists through the same helpers).
GROUPS = "not test_levels and not test_convergence"


def _install(site: Path, name: str, extra: str) -> None:
    (site / f"ampcore_{name}_adapter.py").write_text(textwrap.dedent(ADAPTER.format(name=name, extra=extra)))
    info = site / f"ampcore_{name}-0.7.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ampcore-{name}\nVersion: 0.7\n")
    (info / "entry_points.txt").write_text(f"[ampcore]\n{name} = ampcore_{name}_adapter\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    _install(root, "broken", BROKEN_LISTS)
    _install(root, "nodevice", NO_DEVICE)
    return root


def _run(site: Path, *args: str, cwd: Path | None = None, module: str = "ampcore") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
        check=False,
    )


def _report(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "report.json").read_text())


def _outcomes(report: dict[str, Any], outcome: str) -> set[str]:
    return {t["name"] for t in report["tests"] if t["outcome"] == outcome}


@pytest.fixture(scope="module")
def broken_run(site: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("broken")
    return _run(site, "conformance", "--backend", "broken", "--report-dir", str(out), "--", "-q", "-k", GROUPS), out


def test_wrong_op_lists_fail_the_op_list_checks(broken_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, out = broken_run
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    report = _report(out)
    failed = _outcomes(report, "failed")
    assert {"test_required_white_ops[float16-mm]", "test_required_black_ops[float16-mse_loss]"} <= failed
    # the device's own (CPU) kernels disagree with the declared lists: the named check says so
    kernels = "test_device_autocast_kernels_match_the_lists[float16]"
    assert kernels in failed
    message = next(t["message"] for t in report["tests"] if t["name"] == kernels)
    assert "mm: the AutocastCPU kernel returns float16" in message and "mse_loss: the AutocastCPU kernel" in message
    failed.discard(kernels)
    wrong = {name for name in failed if not name.startswith(("test_required_", "test_white_ops", "test_black_ops"))}
    assert not wrong, f"a list error failed checks about other things: {sorted(wrong)}"
    assert all(name.endswith(("-mm]", "-mse_loss]")) for name in failed), sorted(failed)
    passed = _outcomes(report, "passed")
    assert {"test_backend_is_available", "test_plugin_hooks_match_the_contract"} <= passed
    assert (
        "test_required_white_ops[float16-bmm]" in passed
        and "test_nested_disabled_region_restores_outer[float16]" in passed
    )
    assert {
        "test_scaler_hysteresis[float16]",
        "test_checkpoint_resume_is_exact[float16]",
        "test_speed_report[float16]",
    } <= passed


def test_reports_describe_the_run(broken_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = broken_run
    report = _report(out)
    backend = report["backend"]
    assert (backend["name"], backend["distribution"], backend["version"]) == ("broken", "ampcore-broken", "0.7")
    assert backend["device_name"] and report["ampcore"] and report["torch"] and report["suite"]["version"]
    assert report["dtypes"] == ["float16"] and report["exit_status"] == 1
    test = next(t for t in report["tests"] if t["name"] == "test_required_white_ops[float16-mm]")
    assert test["dtype"] == "float16" and test["op"] == "mm" and test["duration_s"] > 0 and "black" in test["message"]
    assert report["summary"]["failed"] == len(_outcomes(report, "failed")) > 0
    markdown = (out / "report.md").read_text()
    assert (
        "| `test_required_white_ops[float16-mm]` | float16 | failed |" in markdown and "ampcore-broken 0.7" in markdown
    )
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("failures", "0")) == report["summary"]["failed"]
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["ampcore_distribution"] == "ampcore-broken" and properties["ampcore_backend"] == "broken"


def test_manifest_waives_with_reasons_and_flags_stale_entries(site: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "acme.toml"
    manifest.write_text(
        '[xfail]\n"test_required_white_ops[float16-mm]" = "mm runs in fp32 on Acme v1 (ticket 12)"\n'
        '"test_device_autocast_kernels_match_the_lists[*]" = "kernels follow the lists in v2 (ticket 12)"\n'
        '[skip]\n"test_*_ops*[float16-mse_loss]" = "loss kernels pending"\n"test_no_such_check" = "stale"\n'
    )
    out = tmp_path / "reports"
    args = ("conformance", "--backend", "broken", "--manifest", str(manifest), "--report-dir", str(out))
    result = _run(site, *args, "--", "-q", "-k", "test_op_lists")
    report = _report(out)
    xfailed, skipped = _outcomes(report, "xfailed"), _outcomes(report, "skipped")
    assert {"test_required_white_ops[float16-mm]", "test_device_autocast_kernels_match_the_lists[float16]"} <= xfailed
    assert "test_required_black_ops[float16-mse_loss]" in skipped
    reasons = {t["message"] for t in report["tests"] if t["name"] == "test_required_black_ops[float16-mse_loss]"}
    assert reasons == {"manifest: loss kernels pending"}
    assert report["manifest"]["unmatched"] == ["test_no_such_check"]
    assert "matches no test" in result.stdout
    assert not _outcomes(report, "failed") and result.returncode == 0, result.stdout[-3000:]


def test_no_device_is_an_explicit_failure(site: Path, tmp_path: Path) -> None:
    result = _run(site, "conformance", "--backend", "nodevice", "--report-dir", str(tmp_path))
    assert result.returncode != 0
    assert "no device found for backend 'nodevice': no Acme device or driver found" in result.stdout
    report = _report(tmp_path)
    assert report["problem"] and [t["outcome"] for t in report["tests"]] == ["failed"]
    assert report["summary"]["passed"] == 0 and (tmp_path / "junit.xml").exists()


def test_all_skipped_is_not_green(site: Path, tmp_path: Path) -> None:
    manifest = tmp_path / "all.json"
    manifest.write_text(json.dumps({"skip": {"*": "nothing works yet"}}))
    args = ("conformance", "--backend", "cpu", "--manifest", str(manifest), "--", "-q", "-k", "test_registration")
    result = _run(site, *args, cwd=tmp_path)  # the default report directory goes into the cwd
    assert result.returncode == 1 and "no conformance check passed" in result.stdout
    assert _report(tmp_path / "ampcore-conformance-cpu")["summary"]["skipped"] > 0


def test_plain_pytest_and_dtype_selection(site: Path, tmp_path: Path) -> None:
    args = ("-p", "ampcore_conformance.plugin", "--pyargs", "ampcore_conformance", "--ampcore-backend", "cpu")
    result = _run(
        site, *args, "--ampcore-dtype", "bf16", "-k", "test_dtype_hooks_answer", "-v", cwd=tmp_path, module="pytest"
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "test_dtype_hooks_answer[bfloat16] PASSED" in result.stdout and "[float16]" not in result.stdout
    bad = _run(site, *args, "--ampcore-dtype", "float64", cwd=tmp_path, module="pytest")
    assert (
        bad.returncode == 4
        and (
            "--ampcore-dtype float64: backend 'cpu' does not declare float64; "
            "it declares: bfloat16 (bf16), float16 (fp16, half)"
        )
        in bad.stderr
    )
    bare = _run(site, "--pyargs", "ampcore_conformance", cwd=tmp_path, module="pytest")
    assert bare.returncode != 0 and "-p ampcore_conformance.plugin" in bare.stdout + bare.stderr
