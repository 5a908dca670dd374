"""Plain ``torch.autocast`` on a PrivateUse1 device behaves the same before and after
ampcore regions of any kind (issue 25, defect 6), in every registration mode of the test
device: a vendor's own autocast kernels (modes ``partial``, ``generic``) are kept, and on a
device without kernels ampcore provides the backend's lists from the moment the backend is
resolved (modes ``none``, ``fallthrough``).  Each mode in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PROBE = Path(__file__).with_name("_acme_plain_autocast_probe.py")

# plugins/ampcore-testdevice and the acme adapter: skipped, with the reason, where they are not
# installed or this torch cannot host the device (tests/conftest.py)
pytestmark = pytest.mark.testdevice


@pytest.fixture(scope="module", params=["none", "fallthrough", "partial", "generic"])
def probe(request: pytest.FixtureRequest) -> dict[str, Any]:
    env = {
        **os.environ,
        "AMPCORE_ACME_AUTOCAST": request.param,
        "AMPCORE_STRICT_PLUGINS": "1",
        "AMPCORE_BLOCK_PLUGINS": "",
    }
    # import ampcore_acme's device first, as a vendor's extension is imported before ampcore
    code = f"import ampcore_testdevice; ampcore_testdevice.install('acme', autocast={request.param!r}); " \
           f"import runpy; runpy.run_path({str(PROBE)!r}, run_name='__main__')"  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {"mode": request.param, **json.loads(done.stdout.splitlines()[-1])}


def test_plain_torch_autocast_is_unchanged_by_ampcore_regions(probe: dict[str, Any]) -> None:
    reference = probe["loaded"]
    changed = {label: {op: (reference[op], got[op]) for op in got if got[op] != reference[op]}
               for label, got in probe["after"].items()}  # fmt: skip
    assert not any(changed.values()), f"mode {probe['mode']}: plain torch.autocast changed after: {changed}"


def test_a_vendors_kernels_are_what_plain_autocast_runs(probe: dict[str, Any]) -> None:
    if probe["mode"] not in ("partial", "generic"):
        pytest.skip(f"mode {probe['mode']} registers no autocast kernels of its own")
    assert probe["loaded"] == probe["before"], "resolving the backend changed plain torch.autocast"
    assert probe["before"]["has_native_autocast"] is True
    if probe["mode"] == "partial":  # mm low and dot float32 are the vendor's; the rest is not cast
        assert probe["before"]["softmax(fp16)"] == "torch.float16" and probe["before"]["mm"] == "torch.float16"
        assert probe["before"]["dot(fp16)"] == "torch.float32" and probe["before"]["add(mixed)"] == "torch.float32"
