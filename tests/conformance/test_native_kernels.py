"""test_device_autocast_kernels_match_the_lists, proven against the acme test device: a
vendor whose kernels cover its lists passes, one that registers partial kernels without
declaring them fails, naming the ops (measured in processes of their own: one PrivateUse1
device per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from ampcore_conformance._native import disagreements

# plugins/ampcore-testdevice and the acme adapter: skipped, with the reason, where they are not
# installed or this torch cannot host the device (tests/conftest.py)
pytestmark = pytest.mark.testdevice


def _measure(mode: str) -> dict[str, Any]:
    env = {**os.environ, "AMPCORE_ACME_AUTOCAST": mode, "AMPCORE_BLOCK_PLUGINS": ""}
    done = subprocess.run(
        [sys.executable, "-m", "ampcore_conformance._native", "acme", "float16"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_torchs_generic_lists_as_kernels_match() -> None:
    found = _measure("generic")
    assert found["native"] and not found["adjusted"]
    assert disagreements(found, torch.float16) == []


def test_partial_kernels_pass_only_when_declared() -> None:
    found = _measure("partial")
    assert found["native"] and found["adjusted"]  # the template declares {"black": ["dot"]}
    assert found["ops"]["dot"] == {"list": "black", "kernel": True, "got": "float32"}
    assert disagreements(found, torch.float16) == []
    undeclared = {**found, "adjusted": False}  # the same kernels, no adjustments declared
    wrong = {line.partition(":")[0]: line for line in disagreements(undeclared, torch.float16)}
    assert "no AutocastPrivateUse1 kernel, so torch.autocast returns float16" in wrong["softmax"]
    assert "mm" not in wrong and "dot" not in wrong  # the kernels it has are right


def test_no_kernels_means_ampcore_provides() -> None:
    assert _measure("none")["native"] is False
    assert _measure("fallthrough")["native"] is False
