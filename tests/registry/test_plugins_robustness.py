"""Plugin loading under abuse: exits and interrupts at import, strict mode stopped half-way,
hook results of the wrong type (validated once, at load), bad arguments to the manager and
to ``register_plugin``, and how the errors read (issue 12)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_adapter
from test_plugins import FakeSite, _good

import ampcore
from ampcore import PluginManager, PluginWarning


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    fake = FakeSite(tmp_path, monkeypatch)
    yield fake
    fake.cleanup()


def _infos(pm: PluginManager) -> dict[str, ampcore.PluginInfo]:
    return {info.name: info for info in pm.plugins()}


# -- crash-class: a plugin that exits, or an interrupt, while loading ----------------------


@pytest.mark.parametrize("statement", ["import sys; sys.exit(3)", "raise SystemExit('bye')", "exit(127)"])
def test_plugin_calling_exit_at_import_is_a_failed_plugin(site: FakeSite, statement: str) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-quitter", "quitter", "quitter_plugin", statement)
    pm = site.manager()
    with pytest.warns(PluginWarning, match='"quitter".*SystemExit'):
        infos = _infos(pm)
    assert infos["quitter"].status == "failed"
    assert "SystemExit" in (infos["quitter"].error or "") and "exit" in (infos["quitter"].error or "")
    assert [b.name for b in pm.backends()] == ["alpha"]


def test_plugin_calling_exit_in_a_hook_is_a_failed_plugin(site: FakeSite) -> None:
    source = _good("quitter").replace('name = "quitter"', "raise SystemExit(2)")
    site.install("ampcore-quitter", "quitter", "quitter_plugin", source)
    pm = site.manager()
    with pytest.warns(PluginWarning, match=r"ampcore_backend\(\) called sys.exit\(2\)") as record:
        assert _infos(pm)["quitter"].status == "failed"
    assert len(record) == 1


def _fake_dist(tmp_path: Path, module: str, source: str) -> dict[str, str]:
    (tmp_path / f"{module}.py").write_text(source)
    info = tmp_path / "ampcore_quitter-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ampcore-quitter\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[ampcore]\nquitter = {module}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_exiting_plugin_neither_ends_the_program_nor_ampcore_info(tmp_path: Path) -> None:
    env = _fake_dist(tmp_path, "ampcore_quitter_vendor", "import sys\nsys.exit(3)\n")
    code = (
        "import torch, ampcore\n"
        "with ampcore.autocast(device='cpu'):\n"
        "    print(torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "torch.bfloat16"
    assert '"quitter"' in run.stderr and "SystemExit" in run.stderr
    info = subprocess.run(
        [sys.executable, "-m", "ampcore", "info"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert info.returncode == 0, info.stderr
    assert "quitter" in info.stdout and "failed" in info.stdout


def test_strict_mode_stopped_half_way_is_retried_and_raises_again(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-broken", "broken", "broken_plugin", "raise ImportError('nope')")
    site.install("ampcore-zeta", "zeta", "zeta_plugin", _good("zeta"))
    pm = site.manager(AMPCORE_STRICT_PLUGINS="1")
    for _ in range(2):  # the same error every time, never "no adapter plugin is loaded"
        with pytest.raises(ampcore.PluginError, match='"broken".*nope'):
            pm.backend("alpha")
    assert pm.generation == 0  # nothing half-loaded was published


def test_strict_mode_loads_everything_once_the_broken_plugin_is_gone(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-broken", "broken", "broken_plugin", "raise ImportError('nope')")
    environ = {"AMPCORE_STRICT_PLUGINS": "1"}
    pm = PluginManager(environ=environ, entry_points=site.entry_points)
    with pytest.raises(ampcore.PluginError):
        pm.load_entry_points()
    environ["AMPCORE_BLOCK_PLUGINS"] = "broken"
    assert [b.name for b in pm.backends()] == ["alpha"]


def test_keyboard_interrupt_while_loading_leaves_the_manager_unloaded(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-beta", "beta", "beta_plugin", _good("beta"))
    calls = {"n": 0}

    def interrupted() -> list[importlib.metadata.EntryPoint]:
        found = site.entry_points()
        calls["n"] += 1
        if calls["n"] == 1:  # interrupted after the first plugin registered
            return [found[0], _Interrupting()]  # type: ignore[list-item]
        return found

    pm = PluginManager(environ={}, entry_points=interrupted)
    with pytest.raises(KeyboardInterrupt):
        pm.load_entry_points()
    assert [b.name for b in pm.backends()] == ["alpha", "beta"]  # retried, complete
    assert {p.name: p.status for p in pm.plugins()} == {"alpha": "loaded", "beta": "loaded"}


class _Interrupting:
    """An entry point whose ``load`` is interrupted by Ctrl-C."""

    name = "interrupting"
    value = "interrupting_plugin"
    dist = None

    def load(self) -> object:
        raise KeyboardInterrupt


# -- hook results validated once, at load --------------------------------------------------


@pytest.mark.parametrize(
    ("hooks", "expected"),
    [
        (
            {"ampcore_op_list_adjustments": lambda dtype: {"black": 5}},
            "ampcore_op_list_adjustments(torch.bfloat16) returned {'black': 5}",
        ),
        ({"ampcore_op_list_adjustments": lambda dtype: ["mm"]}, "expected None or a dict"),
        ({"ampcore_op_list_adjustments": lambda dtype: {"white": ["mmm"]}}, "unknown op 'mmm'; did you mean 'mm'"),
        ({"ampcore_op_list_adjustments": lambda dtype: {"blak": ["mm"]}}, "valid keys: 'white', 'black', 'promote'"),
        ({"ampcore_op_list_adjustments": lambda dtype: {"white": ["mm"], "black": ["mm"]}}, "under both"),
        (
            {"ampcore_needs_loss_scaling": lambda dtype: "no"},
            "ampcore_needs_loss_scaling(torch.bfloat16) returned 'no'; expected True or False",
        ),
    ],
    ids=[
        "adjustments-int",
        "adjustments-list",
        "adjustments-unknown-op",
        "adjustments-key",
        "adjustments-both",
        "loss-scaling-str",
    ],
)
def test_hook_results_are_validated_at_load(hooks: dict[str, object], expected: str) -> None:
    with pytest.raises(ampcore.PluginError, match='Plugin "wrong"') as caught:
        ampcore.register_plugin(make_adapter("wrong", **hooks), name="wrong")
    assert expected in str(caught.value)
    assert "wrong" not in {p.name for p in ampcore.list_plugins()}


def test_supported_dtypes_as_a_string_is_quoted_as_returned() -> None:
    plugin = make_adapter("wrong", dtypes="bfloat16")  # type: ignore[arg-type]
    with pytest.raises(
        ampcore.PluginError, match=r"ampcore_backend\(\) gave dtypes='bfloat16'; expected a non-empty list"
    ):
        ampcore.register_plugin(plugin, name="wrong")


def test_entry_point_with_a_bad_hook_result_is_a_failed_plugin(site: FakeSite) -> None:
    extra = "\n@hookimpl\ndef ampcore_op_list_adjustments(dtype):\n    return {'white': ['not_an_op']}\n"
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-adjusted", "adjusted", "adjusted_plugin", _good("adjusted", extra))
    pm = site.manager()
    with pytest.warns(PluginWarning, match="not_an_op"):
        infos = _infos(pm)
    assert infos["adjusted"].status == "failed" and "not_an_op" in (infos["adjusted"].error or "")
    assert [b.name for b in pm.backends()] == ["alpha"]


@pytest.mark.parametrize(
    ("hook", "value", "expected"),
    [
        (
            "ampcore_unavailable_reason",
            False,
            "ampcore_unavailable_reason() returned False; expected None (available) or a str",
        ),
        (
            "ampcore_unavailable_reason",
            "",
            "ampcore_unavailable_reason() returned ''; expected None (available) or a str",
        ),
    ],
)
def test_lazy_availability_hook_of_the_wrong_type_makes_the_plugin_failed(
    register, hook: str, value: object, expected: str
) -> None:
    backend = register(make_adapter("lazy", **{hook: lambda: value}), name="lazy")
    assert not backend.is_available
    assert expected in (backend.unavailable_reason or "")
    info = {p.name: p for p in ampcore.list_plugins()}["lazy"]
    assert info.status == "failed" and expected in (info.error or "")
    with pytest.raises(ampcore.BackendUnavailableError, match="broke the adapter contract"):
        ampcore.autocast("lazy")


@pytest.mark.parametrize(
    ("hooks", "call", "expected"),
    [
        (
            {"ampcore_device_count": lambda: "two"},
            lambda b: b.device_count(),
            "ampcore_device_count() returned 'two'; expected an int >= 0",
        ),
        ({"ampcore_device_count": lambda: -1}, lambda b: b.device_count(), "ampcore_device_count() returned -1"),
        (
            {"ampcore_device_name": lambda device_index: 7},
            lambda b: b.device_name(0),
            "ampcore_device_name(0) returned 7; expected a str",
        ),
        (
            {"ampcore_check_capability": lambda dtype, device_index: 5},
            lambda b: b.capability_issues(torch.bfloat16),
            "ampcore_check_capability",
        ),
    ],
    ids=["count-str", "count-negative", "name-int", "capability-int"],
)
def test_lazy_device_hooks_of_the_wrong_type_raise_plugin_errors(register, hooks, call, expected: str) -> None:
    backend = register(make_adapter("lazy", **hooks), name="lazy")
    with pytest.raises(ampcore.PluginError, match='Plugin "lazy"') as caught:
        call(backend)
    assert expected in str(caught.value)
    info = {p.name: p for p in ampcore.list_plugins()}["lazy"]
    assert info.status == "failed" and expected in (info.error or "")


def test_device_index_beyond_a_broken_count_is_a_plugin_error(register) -> None:
    register(make_adapter("lazy", ampcore_device_count=lambda: "two"), name="lazy")
    with pytest.raises(ampcore.PluginError, match="ampcore_device_count"):
        ampcore.autocast("lazy:1")


# -- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize("plugin", [None, 5, "cpu"])
def test_register_plugin_refuses_non_plugins(plugin: object) -> None:
    before = {p.name for p in ampcore.list_plugins()}
    with pytest.raises(
        ampcore.PluginError, match="register_plugin.*expected a module or an object with @ampcore.hookimpl"
    ):
        ampcore.register_plugin(plugin)
    assert {p.name for p in ampcore.list_plugins()} == before


@pytest.mark.parametrize("name", [5, "", "  "])
def test_register_plugin_refuses_bad_names(name: object) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"register_plugin\(name="):
        ampcore.register_plugin(make_adapter("named"), name=name)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"environ": 5}, r"PluginManager\(environ=5\): expected a mapping"),
        ({"environ": ["AMPCORE_PLUGINS"]}, r"PluginManager\(environ=\['AMPCORE_PLUGINS'\]\): expected a mapping"),
        ({"entry_points": 5}, r"PluginManager\(entry_points=5\): expected a callable"),
    ],
)
def test_plugin_manager_checks_its_arguments(kwargs: dict[str, object], expected: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=expected):
        PluginManager(**kwargs)  # type: ignore[arg-type]


def test_unregister_plugin_refuses_non_strings() -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"unregister_plugin\(5\)"):
        ampcore.unregister_plugin(5)  # type: ignore[arg-type]


# -- how the errors read ---------------------------------------------------------------------


def test_disabled_autoload_is_named_when_a_backend_is_missing(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    pm = site.manager(AMPCORE_DISABLE_PLUGIN_AUTOLOAD="1")
    from ampcore._backends.registry import _lookup

    with pytest.raises(ampcore.AmpcoreError) as caught:
        _lookup(pm, "alpha", "alpha")
    message = str(caught.value)
    assert "AMPCORE_DISABLE_PLUGIN_AUTOLOAD" in message and "alpha" in message
    assert "AMPCORE_PLUGINS=alpha" in message


def test_disabled_autoload_is_named_in_a_fresh_process() -> None:
    code = "import ampcore\ntry:\n    ampcore.autocast('cpu')\nexcept ampcore.AmpcoreError as e:\n    print(e)\n"
    env = {**os.environ, "AMPCORE_DISABLE_PLUGIN_AUTOLOAD": "1"}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "AMPCORE_DISABLE_PLUGIN_AUTOLOAD" in run.stdout and "AMPCORE_PLUGINS=cpu" in run.stdout


def test_in_process_plugins_are_not_called_distribution_none(register) -> None:
    register(make_adapter("twin"), name="twin-a")
    register(make_adapter("twin"), name="twin-b")
    with pytest.raises(ampcore.AmpcoreError) as caught:
        ampcore.get_backend("twin")
    message = str(caught.value)
    assert '"None"' not in message
    assert 'plugin "twin-a" (registered in process)' in message


def test_multi_line_plugin_error_keeps_the_info_table_intact() -> None:
    from ampcore._cli.info import format_info

    info = {
        "ampcore": "0", "torch": "0", "pluggy": "0", "python": "3",
        "plugins": [
            {"name": "broken", "distribution": "d", "version": "1", "source": "entry-point", "status": "failed",
             "error": "Traceback (most recent call last):\n  File 'x.py', line 1\nImportError: boom"},
            {"name": "fine", "distribution": "d", "version": "1", "source": "entry-point", "status": "loaded",
             "error": None},
        ],
        "backends": [],
    }  # fmt: skip
    for width in (100, None):
        text = format_info(info, width)
        table = text.split("Backends:")[0].splitlines()
        assert any(line.split()[:1] == ["fine"] for line in table)
        notes = text.split("Notes:")[1].splitlines()[1:]
        assert all(line.startswith("  ") for line in notes), notes
        assert "ImportError: boom" in " ".join(notes)


def test_in_process_info_rows_show_the_source_not_none() -> None:
    from ampcore._cli.info import format_info

    info = {
        "ampcore": "0", "torch": "0", "pluggy": "0", "python": "3", "plugins": [],
        "backends": [{"name": "demo", "device_type": "cpu", "available": True, "reason": None, "plugin": "demo",
                      "distribution": None, "default_dtype": "bfloat16", "dtypes": ["bfloat16"], "device_name": "cpu",
                      "capability": {}, "autocast": "native"}],
    }  # fmt: skip
    assert "None" not in format_info(info)


def test_plugin_warning_for_an_entry_point_without_distribution_says_so() -> None:
    class _Bare:
        name = "bare"
        value = "bare_plugin_module_that_does_not_exist"
        dist = None

        def load(self) -> object:
            raise ImportError("no module")

    pm = PluginManager(environ={}, entry_points=lambda: [_Bare()])  # type: ignore[list-item]
    with pytest.warns(PluginWarning) as record:
        pm.load_entry_points()
    message = str(record[0].message)
    assert '"None"' not in message and "no distribution" in message


def _exits() -> None:
    raise SystemExit(4)


def _raises() -> None:
    raise RuntimeError("driver not ready")


@pytest.mark.parametrize(
    ("hook", "function", "expected", "failed"),
    [
        ("ampcore_device_count", lambda: _exits(), "ampcore_device_count() called sys.exit(4)", True),
        (
            "ampcore_device_count",
            lambda: _raises(),
            "ampcore_device_count() raised RuntimeError: driver not ready",
            False,
        ),
        ("ampcore_unavailable_reason", lambda: _exits(), "ampcore_unavailable_reason() called sys.exit(4)", True),
        (
            "ampcore_unavailable_reason",
            lambda: _raises(),
            "availability check failed: ampcore_unavailable_reason() raised RuntimeError",
            False,
        ),
    ],
)
def test_lazy_hooks_that_exit_or_raise_become_plugin_errors(
    register, hook: str, function, expected: str, failed: bool
) -> None:
    register(make_adapter("lazy", **{hook: function}), name="lazy")
    with pytest.raises(ampcore.AmpcoreError) as caught:
        ampcore.autocast("lazy:0")
    assert expected in str(caught.value) and "lazy" in str(caught.value)
    info = {p.name: p for p in ampcore.list_plugins()}["lazy"]
    assert (info.status == "failed") is failed


def test_ampcore_info_shows_a_plugin_broken_while_describing_it(register) -> None:
    from ampcore._cli.info import collect_info, format_info

    register(make_adapter("lazy", ampcore_device_name=lambda device_index: 7), name="lazy")
    info = collect_info()
    plugin = {p["name"]: p for p in info["plugins"]}["lazy"]
    assert plugin["status"] == "failed" and "ampcore_device_name(0) returned 7" in plugin["error"]
    backend = {b["name"]: b for b in info["backends"]}["lazy"]
    assert "ampcore_device_name(0) returned 7" in backend["error"]
    assert any("ampcore_device_name" in w for w in info["load_warnings"])
    assert "failed" in format_info(info)


def test_strict_conflict_on_register_leaves_nothing_behind(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    pm = site.manager(AMPCORE_STRICT_PLUGINS="1")
    pm.load_entry_points()
    generation = pm.generation
    with pytest.raises(ampcore.AmpcoreError, match="claimed by more than one plugin"):
        pm.register(make_adapter("alpha"), name="intruder")
    assert [p.name for p in pm.plugins()] == ["alpha"]
    assert pm.backend("alpha").plugin_name == "alpha" and pm.generation == generation
    pm.register(make_adapter("beta"), name="intruder")  # the name is free


def test_backend_check_dtype_takes_names() -> None:
    cpu = ampcore.get_backend("cpu")
    assert cpu.check_dtype("bf16") == torch.bfloat16
    with pytest.raises(ampcore.AmpcoreError, match=r"dtype='fp8'\): unknown dtype name"):
        cpu.check_dtype("fp8")  # type: ignore[arg-type]
