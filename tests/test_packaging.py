"""Packaging: an SPDX license with its LICENSE file, the metadata, and what the wheel holds
(built here with pip, so that a missing module or data file fails the suite)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_with_its_file() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert not any(c.startswith("License ::") for c in project.get("classifiers", []))  # superseded by SPDX


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[zipfile.ZipFile, str]:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v",
         "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if build.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}")
    (path,) = out.glob("ampcore-*.whl")
    return zipfile.ZipFile(path), build.stdout + build.stderr


def test_the_build_gives_no_packaging_warnings(wheel: tuple[zipfile.ZipFile, str]) -> None:
    _, log = wheel
    assert "is absent from the `packages` configuration" not in log
    assert "`project.license` as a TOML table is deprecated" not in log


def test_the_wheel_holds_every_module_and_data_file(wheel: tuple[zipfile.ZipFile, str]) -> None:
    archive, _ = wheel
    names = set(archive.namelist())
    for source, package in (
        ("ampcore", "ampcore"),
        ("backends", "ampcore_backends"),
        ("conformance_tests", "ampcore_conformance"),
    ):
        for path in (ROOT / source).rglob("*.py"):
            assert f"{package}/{path.relative_to(ROOT / source).as_posix()}" in names, path
    for data in (
        "ampcore/py.typed",
        "ampcore/_policy/policy_kernel.cpp",
        "ampcore/_o2/onepass_kernel.cpp",
        "ampcore/_o2/onepass_loop_kernel.cpp",
        "ampcore/_o2/onepass_common.h",
        "ampcore/_o2/onepass_avx512.h",
        "ampcore_backends/py.typed",
        "ampcore_conformance/data/pytest.ini",
    ):
        assert data in names
    assert not any(name.startswith(("tests/", "docs/", "examples/", "benchmarks/", "plugins/")) for name in names)
    (info,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
    assert f"{info}/licenses/LICENSE" in names
    metadata = archive.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "ampcore = ampcore._cli.main:main" in entry_points and "cpu = ampcore_backends.cpu" in entry_points
