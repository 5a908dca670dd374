"""Two plugins claiming one backend name (issue 25, defect 1): a vendor's plugin replaces the
first-party adapter of that name with every one of its hooks; two vendors conflict, named
with how to choose; blocking by entry-point name, distribution or ``distribution:name``
leaves no half-registered backend."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest
import torch
from conftest import make_adapter
from test_plugins import FakeSite, site_fixture  # noqa: F401  (the fixture ``site``)

import ampcore

#: An adapter claiming backend "npu" whose every optional hook answers recognisably.
NPU = """
import torch
from ampcore import BackendSpec, hookimpl

AMPCORE_CONTRACT = 2
WHO = "{who}"

@hookimpl
def ampcore_backend():
    return BackendSpec(name="npu", device_type="cpu", dtypes=[torch.float16])

@hookimpl
def ampcore_unavailable_reason():
    return {reason!r}

@hookimpl
def ampcore_device_name(device_index):
    return WHO

@hookimpl
def ampcore_device_overflow_flag(device):
    return torch.ones(1)

@hookimpl
def ampcore_clear_device_overflow_flag(device):
    return None
"""


def _npu(who: str, reason: str | None = None) -> str:
    return NPU.format(who=who, reason=reason)


def _install_both(site: FakeSite, vendor_first: bool = False) -> None:
    installs = [
        ("ampcore", "npu", "first_party_npu", _npu("first-party", "torch_npu is not installed")),
        ("ampcore-npu-vendor", "npu", "vendor_npu", _npu("vendor")),
    ]
    for dist, name, module, source in reversed(installs) if vendor_first else installs:
        site.install(dist, name, module, source)


def _hooks_all_there(backend: ampcore.Backend) -> None:
    for hook in ("ampcore_unavailable_reason", "ampcore_device_name", "ampcore_device_overflow_flag",
                 "ampcore_clear_device_overflow_flag"):  # fmt: skip
        assert backend.hook(hook) is not None, hook


@pytest.mark.parametrize("vendor_first", [False, True], ids=["first-party-first", "vendor-first"])
def test_a_vendor_plugin_replaces_the_first_party_adapter_of_its_name(
    site: FakeSite, vendor_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    _install_both(site, vendor_first)
    pm = site.manager()
    with warnings.catch_warnings(), caplog.at_level(logging.INFO, logger="ampcore"):
        warnings.simplefilter("error")  # replacing is no failure: no warning
        npu = pm.backend("npu")
    assert npu.distribution == "ampcore-npu-vendor" and npu.is_available
    _hooks_all_there(npu)
    assert npu.device_name(0) == "vendor"
    statuses = {p.name: (p.status, p.error) for p in pm.plugins()}
    assert statuses["ampcore-npu-vendor:npu"] == ("loaded", None)
    status, error = statuses["ampcore:npu"]
    assert status == "replaced" and '"ampcore-npu-vendor:npu" (distribution "ampcore-npu-vendor")' in (error or "")
    (record,) = [r for r in caplog.records if "replaces" in r.getMessage()]
    assert '"ampcore-npu-vendor"' in record.getMessage() and '"ampcore"' in record.getMessage()
    assert [b.name for b in pm.backends()] == ["npu"]


@pytest.mark.parametrize(
    ("block", "who", "reason", "statuses"),
    [
        (
            "ampcore-npu-vendor",
            "first-party",
            "torch_npu is not installed",
            {"ampcore:npu": "loaded", "ampcore-npu-vendor:npu": "blocked"},
        ),
        (
            "ampcore-npu-vendor:npu",
            "first-party",
            "torch_npu is not installed",
            {"ampcore:npu": "loaded", "ampcore-npu-vendor:npu": "blocked"},
        ),
        ("ampcore:npu", "vendor", None, {"ampcore:npu": "blocked", "ampcore-npu-vendor:npu": "loaded"}),
    ],
)
def test_blocking_one_of_them_leaves_the_other_whole(
    site: FakeSite, block: str, who: str, reason: str | None, statuses: dict[str, str]
) -> None:
    _install_both(site)
    pm = site.manager(AMPCORE_BLOCK_PLUGINS=block)
    npu = pm.backend("npu")
    _hooks_all_there(npu)
    assert npu.unavailable_reason == reason  # the availability hook of the survivor, not a default
    assert {p.name: p.status for p in pm.plugins()} == statuses
    blocked = "vendor_npu" if who == "first-party" else "first_party_npu"
    assert blocked not in sys.modules  # a blocked plugin is never imported


def test_blocking_the_entry_point_name_blocks_both(site: FakeSite) -> None:
    _install_both(site)
    pm = site.manager(AMPCORE_BLOCK_PLUGINS="npu")
    assert {p.status for p in pm.plugins()} == {"blocked"}
    with pytest.raises(KeyError, match="unknown backend 'npu'"):
        pm.backend("npu")


def test_a_vendor_that_fails_to_load_leaves_the_first_party_adapter_whole(site: FakeSite) -> None:
    site.install("ampcore", "npu", "first_party_npu", _npu("first-party", "torch_npu is not installed"))
    site.install("ampcore-npu-vendor", "npu", "vendor_npu", "raise ImportError('libvendor.so missing')")
    pm = site.manager()
    with pytest.warns(ampcore.PluginWarning, match="libvendor.so missing"):
        npu = pm.backend("npu")
    _hooks_all_there(npu)
    assert npu.unavailable_reason == "torch_npu is not installed"
    assert {p.name: p.status for p in pm.plugins()} == {"ampcore:npu": "loaded", "ampcore-npu-vendor:npu": "failed"}


def test_two_vendors_conflict_naming_both_distributions_and_how_to_choose(site: FakeSite) -> None:
    _install_both(site)
    site.install("ampcore-npu-other", "npu", "other_npu", _npu("other"))
    pm = site.manager()
    with pytest.warns(ampcore.PluginWarning, match='claimed by more than one plugin.*"ampcore-npu-other"'):
        pm.load_entry_points()  # told at load, not only on use
    with pytest.raises(ampcore.AmpcoreError) as caught:
        pm.backend("npu")
    message = str(caught.value)
    assert '"ampcore-npu-vendor"' in message and '"ampcore-npu-other"' in message
    assert (
        "AMPCORE_BLOCK_PLUGINS=ampcore-npu-vendor:npu" in message
        or "AMPCORE_BLOCK_PLUGINS=ampcore-npu-other:npu" in message
    )
    statuses = {p.name: p.status for p in pm.plugins()}
    assert statuses == {
        "ampcore:npu": "replaced",
        "ampcore-npu-vendor:npu": "conflict",
        "ampcore-npu-other:npu": "conflict",
    }
    # following the advice resolves it
    keep_vendor = site.manager(AMPCORE_BLOCK_PLUGINS="ampcore-npu-other")
    assert keep_vendor.backend("npu").device_name(0) == "vendor"


def test_an_in_process_plugin_replaces_the_first_party_one_until_unregistered(site: FakeSite) -> None:
    site.install("ampcore", "npu", "first_party_npu", _npu("first-party", "torch_npu is not installed"))
    pm = site.manager()
    first = pm.backend("npu")
    mine = pm.register(make_adapter("npu", dtypes=(torch.bfloat16,)), name="mine")
    assert pm.backend("npu") is mine
    assert {p.name: p.status for p in pm.plugins()} == {"mine": "loaded", "npu": "replaced"}
    pm.unregister("mine")
    assert pm.backend("npu") is first
    assert {p.name: p.status for p in pm.plugins()} == {"npu": "loaded"}
    _hooks_all_there(first)


def test_unique_names_are_shown_by_ampcore_info_tables(site: FakeSite) -> None:
    from ampcore._cli.info import _plugin_rows

    _install_both(site)
    rows = _plugin_rows([vars(p) for p in site.manager().plugins()], lambda text: "[n]")
    assert [row[0] for row in rows[1:]] == ["ampcore-npu-vendor:npu", "ampcore:npu"]
