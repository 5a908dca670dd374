"""Plugin loading: isolation of broken plugins, env controls, conflicts, in-process registration."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore import PluginManager, PluginWarning
from ampcore._backends.plugins import ENTRY_POINT_GROUP

GOOD = """
import torch
from ampcore import BackendSpec, hookimpl

AMPCORE_CONTRACT = 2

@hookimpl
def ampcore_backend():
    name = "{backend}"
    return BackendSpec(name=name, device_type="cpu", dtypes=[torch.bfloat16])
{extra}
"""


class FakeSite:
    """Installed distributions in a temporary folder: ``<dist>.dist-info`` plus modules."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        monkeypatch.syspath_prepend(str(root))
        self._modules: list[str] = []

    def install(self, dist: str, plugin: str, module: str, source: str, version: str = "1.0") -> None:
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{plugin} = {module}\n")
        self._modules.append(module)

    def entry_points(self) -> list[importlib.metadata.EntryPoint]:
        found = []
        for dist in importlib.metadata.distributions(path=[str(self.root)]):
            found += [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
        return sorted(found, key=lambda ep: ep.name)

    def manager(self, **environ: str) -> PluginManager:
        return PluginManager(environ=environ, entry_points=self.entry_points)

    def cleanup(self) -> None:
        for module in self._modules:
            sys.modules.pop(module, None)


@pytest.fixture(name="site")
def site_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = FakeSite(tmp_path, monkeypatch)
    yield fake
    fake.cleanup()


def _good(backend: str, extra: str = "") -> str:
    return GOOD.format(backend=backend, extra=extra)


def test_good_plugins_load_with_distribution_and_version(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"), version="2.3")
    pm = site.manager()
    (info,) = pm.plugins()
    assert (info.name, info.distribution, info.version, info.status) == ("alpha", "ampcore-alpha", "2.3", "loaded")
    backend = pm.backend("alpha")
    assert backend.distribution == "ampcore-alpha" and backend.supported_dtypes == (torch.bfloat16,)


@pytest.mark.parametrize(
    ("source", "expected_error"),
    [
        ("raise ImportError('vendor runtime libfoo.so not found')", "libfoo.so not found"),
        ("1 / 0", "ZeroDivisionError"),
        (
            _good("broken", "\n@hookimpl\ndef ampcore_backnd_info():\n    return {}\n"),
            "ampcore_backnd_info (did you mean ampcore_backend_info?)",
        ),
        (_good("broken", "\n@hookimpl\ndef ampcore_device_name(device_index, surprise):\n    return ''\n"), "surprise"),
        (_good("broken").replace("dtypes=[torch.bfloat16]", "dtypes=[]"), "non-empty"),
        (
            _good("broken").replace("@hookimpl\ndef ampcore_backend", "def ampcore_backend"),
            "ampcore_backend is not marked",
        ),
        (_good("broken").replace('name = "broken"', "raise RuntimeError('probe failed')"), "probe failed"),
    ],
    ids=["import-error", "raises", "misspelled-hook", "bad-signature", "no-dtypes", "unmarked-hook", "hook-raises"],
)
def test_broken_plugin_is_reported_and_skipped(site: FakeSite, source: str, expected_error: str) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-broken", "broken", "broken_plugin", source)
    site.install("ampcore-zeta", "zeta", "zeta_plugin", _good("zeta"))
    pm = site.manager()
    with pytest.warns(PluginWarning) as record:
        infos = {info.name: info for info in pm.plugins()}
    message = str(record[0].message)
    assert '"broken"' in message and '"ampcore-broken"' in message and expected_error in message
    assert infos["broken"].status == "failed" and expected_error in (infos["broken"].error or "")
    # every other plugin still loads, before and after the broken one
    assert [b.name for b in pm.backends()] == ["alpha", "zeta"]


def test_strict_mode_raises_on_first_broken_plugin(site: FakeSite) -> None:
    site.install("ampcore-broken", "broken", "broken_plugin", "raise ImportError('nope')")
    pm = site.manager(AMPCORE_STRICT_PLUGINS="1")
    with pytest.raises(ampcore.PluginError, match='Plugin "broken" \\(distribution "ampcore-broken"\\).*nope'):
        pm.load_entry_points()


@pytest.mark.parametrize(
    ("environ", "loaded", "statuses"),
    [
        ({}, ["alpha", "beta"], {"alpha": "loaded", "beta": "loaded"}),
        ({"AMPCORE_DISABLE_PLUGIN_AUTOLOAD": "1"}, [], {"alpha": "disabled", "beta": "disabled"}),
        (
            {"AMPCORE_DISABLE_PLUGIN_AUTOLOAD": "1", "AMPCORE_PLUGINS": "beta"},
            ["beta"],
            {"alpha": "not-allowed", "beta": "loaded"},
        ),
        ({"AMPCORE_PLUGINS": "alpha"}, ["alpha"], {"alpha": "loaded", "beta": "not-allowed"}),
        ({"AMPCORE_PLUGINS": "ampcore-beta"}, ["beta"], {"alpha": "not-allowed", "beta": "loaded"}),
        ({"AMPCORE_BLOCK_PLUGINS": "alpha"}, ["beta"], {"alpha": "blocked", "beta": "loaded"}),
        (
            {"AMPCORE_PLUGINS": "alpha,beta", "AMPCORE_BLOCK_PLUGINS": "beta"},
            ["alpha"],
            {"alpha": "loaded", "beta": "blocked"},
        ),
    ],
)
def test_environment_controls(
    site: FakeSite, environ: dict[str, str], loaded: list[str], statuses: dict[str, str]
) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-beta", "beta", "beta_plugin", _good("beta"))
    pm = site.manager(**environ)
    assert [b.name for b in pm.backends()] == loaded
    assert {p.name: p.status for p in pm.plugins()} == statuses


def test_disabled_or_blocked_plugins_are_not_imported(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", "raise ImportError('must not be imported')")
    pm = site.manager(AMPCORE_BLOCK_PLUGINS="alpha")
    assert pm.plugins()[0].status == "blocked"
    assert "alpha_plugin" not in sys.modules


def test_allowlist_naming_a_missing_plugin_warns(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    pm = site.manager(AMPCORE_PLUGINS="alpha,ghost")
    with pytest.warns(PluginWarning, match="ghost.*installed plugins: \\['alpha'\\]"):
        pm.load_entry_points()


def test_same_backend_name_is_a_conflict_naming_both_distributions(site: FakeSite) -> None:
    site.install("ampcore-one", "one", "one_plugin", _good("npu"))
    site.install("ampcore-two", "two", "two_plugin", _good("npu"))
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    pm = site.manager()
    with pytest.raises(
        ampcore.AmpcoreError, match='backend "npu".*"ampcore-one".*"ampcore-two".*AMPCORE_BLOCK_PLUGINS=ampcore-two:two'
    ):
        pm.backend("npu")
    assert {p.name: p.status for p in pm.plugins()} == {"alpha": "loaded", "one": "conflict", "two": "conflict"}
    assert [b.name for b in pm.backends()] == ["alpha"]


def test_blocking_one_of_two_plugins_resolves_the_conflict(site: FakeSite) -> None:
    """How a vendor's adapter replaces another of the same name (contract 2 has no override hook)."""
    site.install("ampcore-one", "one", "one_plugin", _good("npu"))
    site.install("ampcore-two", "two", "two_plugin", _good("npu"))
    pm = site.manager(AMPCORE_BLOCK_PLUGINS="one")
    assert pm.backend("npu").distribution == "ampcore-two"
    assert {p.name: p.status for p in pm.plugins()} == {"one": "blocked", "two": "loaded"}


def test_strict_mode_raises_on_conflict(site: FakeSite) -> None:
    site.install("ampcore-one", "one", "one_plugin", _good("npu"))
    site.install("ampcore-two", "two", "two_plugin", _good("npu"))
    with pytest.raises(ampcore.AmpcoreError, match="claimed by more than one plugin"):
        site.manager(AMPCORE_STRICT_PLUGINS="true").load_entry_points()


def test_register_plugin_in_process(register) -> None:
    backend = register(make_adapter("inproc", dtypes=(torch.float16, torch.bfloat16)), name="inproc")
    assert ampcore.get_backend("inproc") is backend
    assert backend.default_dtype == torch.float16
    infos = {p.name: p for p in ampcore.list_plugins()}
    assert infos["inproc"].source == "in-process" and infos["inproc"].backend == "inproc"


def test_register_plugin_twice_under_one_name_raises(register) -> None:
    register(make_adapter("inproc"), name="inproc")
    with pytest.raises(ampcore.PluginError, match="already registered"):
        ampcore.register_plugin(make_adapter("inproc2"), name="inproc")


def test_register_invalid_plugin_raises_and_leaves_nothing_behind() -> None:
    plugin = make_adapter("Bad Name")
    with pytest.raises(ampcore.PluginError, match="lower-case name"):
        ampcore.register_plugin(plugin, name="bad")
    assert "bad" not in {p.name for p in ampcore.list_plugins()}
    # the name is free again
    backend = ampcore.register_plugin(make_adapter("good"), name="bad")
    ampcore.unregister_plugin("bad")
    assert backend.name == "good"


def test_unregister_unknown_plugin_lists_registered() -> None:
    with pytest.raises(ampcore.AmpcoreError, match="no such plugin; registered: .*'cpu'"):
        ampcore.unregister_plugin("ghost")


def test_first_party_adapters_come_from_the_entry_point_group() -> None:
    infos = {p.name: p for p in ampcore.list_plugins()}
    for name in ("cpu", "cuda"):
        assert infos[name].source == "entry-point"
        assert infos[name].distribution == "ampcore"
        assert infos[name].status == "loaded"
