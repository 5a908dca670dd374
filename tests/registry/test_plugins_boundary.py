"""What enters from a plugin is bounded and checked (issue 28 rows 1-3, issue 25 defect 7):
an import that never returns, a device type torch does not know, hook results of the wrong
class, exceptions of the overflow-flag hooks, and the ``device`` those hooks receive."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import make_adapter
from test_plugins import FakeSite, _good, site_fixture  # noqa: F401  (the fixture ``site``)

import ampcore
from ampcore import PluginWarning
from ampcore._backends.checks import device_type_problem, indexed_device, memory_problem, result_problem
from ampcore._backends.importing import DEFAULT_IMPORT_TIMEOUT_S, import_timeout

HANGS = "import time\nwhile True:\n    time.sleep(.5)\n"


# -- row 1: an import that never returns -------------------------------------------------


def test_a_hung_import_is_waited_for_a_bounded_time_then_the_plugin_fails(site: FakeSite) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-hangs", "hangs", "hangs_plugin", HANGS)
    site.install("ampcore-zeta", "zeta", "zeta_plugin", _good("zeta"))
    pm = site.manager(AMPCORE_PLUGIN_IMPORT_TIMEOUT="0.3")
    start = time.monotonic()
    with pytest.warns(
        PluginWarning, match=r'"hangs" \(distribution "ampcore-hangs".*did not finish within 0.3 s'
    ) as record:
        infos = {p.name: p for p in pm.plugins()}
    assert time.monotonic() - start < 60  # bounded (the bound itself is 0.3 s; the machine may be busy)
    assert len(record) == 1 and "AMPCORE_PLUGIN_IMPORT_TIMEOUT" in str(record[0].message)
    assert infos["hangs"].status == "failed" and "0.3 s" in (infos["hangs"].error or "")
    assert [b.name for b in pm.backends()] == ["alpha", "zeta"]


def test_an_availability_probe_that_never_answers_is_waited_for_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same class as a hung import: ``ampcore_unavailable_reason()`` blocked on a vendor
    runtime that never answers makes its backend unavailable after the bound, names the
    time waited, marks the plugin failed, and leaves every other backend working."""
    monkeypatch.setenv("AMPCORE_PLUGIN_IMPORT_TIMEOUT", "0.3")
    release = threading.Event()

    def never_answers() -> str | None:
        release.wait(60)  # stands for a driver call that never returns (released at the end)
        return None

    ampcore.register_plugin(make_adapter("stuckprobe", ampcore_unavailable_reason=never_answers), name="stuckprobe")
    try:
        started = time.monotonic()
        with pytest.warns(PluginWarning, match="stuckprobe"):
            backend = ampcore.get_backend("stuckprobe")
            assert not backend.is_available
        assert time.monotonic() - started < 30
        assert "did not finish within 0.3 s" in str(backend.unavailable_reason)
        assert "ampcore_unavailable_reason" in str(backend.unavailable_reason)
        with pytest.raises(ampcore.BackendUnavailableError, match="did not finish within 0.3 s"):
            ampcore.autocast("stuckprobe")
        with ampcore.autocast("cpu"):  # every other backend works
            assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    finally:
        release.set()
        ampcore.unregister_plugin("stuckprobe")


def test_neither_autocast_nor_ampcore_info_hang_on_a_plugin_whose_import_never_returns(tmp_path: Path) -> None:
    (tmp_path / "ampcore_hangs_vendor.py").write_text(HANGS)
    info = tmp_path / "ampcore_hangs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ampcore-hangs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ampcore]\nhangs = ampcore_hangs_vendor\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "AMPCORE_PLUGIN_IMPORT_TIMEOUT": "1"}  # fmt: skip
    code = (
        "import torch, ampcore\n"
        "with ampcore.autocast('cpu'):\n"
        "    print(torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "torch.bfloat16"
    assert '"hangs"' in run.stderr and "did not finish within 1 s" in run.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "ampcore", "info"], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert "hangs" in shown.stdout and "did not finish within 1 s" in shown.stdout and "cpu" in shown.stdout


@pytest.mark.parametrize("value", ["abc", "30s", "nan", "inf", "-1", "0", "\u00b2", "1e999"])
def test_a_bad_import_timeout_warns_naming_the_variable_and_uses_the_default(value: str) -> None:
    with pytest.warns(
        PluginWarning, match=rf"AMPCORE_PLUGIN_IMPORT_TIMEOUT={value!r}: expected a positive number of seconds"
    ):
        assert import_timeout({"AMPCORE_PLUGIN_IMPORT_TIMEOUT": value}) == DEFAULT_IMPORT_TIMEOUT_S


def test_the_import_bound_can_be_lifted() -> None:
    assert import_timeout({"AMPCORE_PLUGIN_IMPORT_TIMEOUT": "off"}) is None
    assert import_timeout({"AMPCORE_PLUGIN_IMPORT_TIMEOUT": " 2.5 "}) == 2.5


# -- row 2: a device type torch does not know ------------------------------------------------


def test_an_unknown_device_type_is_a_plugin_error_naming_the_plugin() -> None:
    plugin = make_adapter("bogusdev", device_type="bogusdev")
    try:  # refused when it says it is available (the device type may be a PrivateUse1 name not given yet)
        with pytest.raises(
            ampcore.PluginError, match=r"Plugin \"bogus\".*device_type='bogusdev': torch knows no such device type"
        ):
            ampcore.register_plugin(plugin, name="bogus")
            ampcore.autocast("bogusdev")
        assert ampcore.get_backend("bogusdev").unavailable_reason is not None
        assert {p.name: p for p in ampcore.list_plugins()}["bogus"].status == "failed"
    finally:
        if "bogus" in {p.name for p in ampcore.list_plugins()}:
            ampcore.unregister_plugin("bogus")


@pytest.mark.parametrize(
    ("knows", "privateuse1", "available", "refused"),
    [
        (True, "privateuseone", True, False),
        (True, "acme", False, False),
        (False, "privateuseone", False, False),  # torch_npu not imported yet: "npu" becomes known later
        (False, "privateuseone", True, True),  # available, still unknown: nothing renamed PrivateUse1
        (False, "acme", False, False),  # PrivateUse1 taken by another extension: simply unavailable
        (False, "acme", True, True),
    ],
)
def test_device_type_rules(knows: bool, privateuse1: str, available: bool, refused: bool) -> None:
    assert (device_type_problem("zeta", knows, privateuse1, available) is not None) is refused


# -- row 3 and the class: hook results of the wrong class ------------------------------------


@pytest.mark.parametrize(
    ("stats", "expected"),
    [
        ({"in_use": "lots"}, "'in_use' is 'lots'; expected an int number of bytes >= 0 or None"),
        ({"peak": -1}, "'peak' is -1"),
        ({"total": math.nan}, "'total' is nan"),
        ({"in_use": True}, "'in_use' is True"),
        ({"in-use": 5}, "unknown key 'in-use'; valid keys: in_use, peak, total"),
        ([5], "expected None or a dict"),
    ],
)
def test_memory_answers_of_the_wrong_class_are_plugin_errors_naming_the_hook(
    register, stats: object, expected: str
) -> None:
    assert expected in (memory_problem(stats) or "")
    backend = register(make_adapter("lots", ampcore_memory=lambda: stats), name="lots")
    with pytest.raises(
        ampcore.PluginError, match=r'Plugin "lots": ampcore_memory\(0, reset_peak=False\) returned'
    ) as caught:
        ampcore.toolkit.memory_in_use(backend)
    assert expected in str(caught.value)


def test_bench_in_process_reports_a_bad_memory_hook_in_one_line(register, capsys: pytest.CaptureFixture[str]) -> None:
    from ampcore._cli.main import main

    register(make_adapter("lots", ampcore_memory=lambda: {"in_use": "lots"}), name="lots")
    argv = ["bench", "--device", "lots", "--size", "32", "--batch", "8", "--steps", "1", "--warmup", "0",
            "--modes", "fp32", "--in-process", "--no-progress"]  # fmt: skip
    with pytest.warns(PluginWarning, match="ampcore_memory"):
        code = main(argv)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert 'Plugin "lots"' in err and "ampcore_memory" in err and "'in_use' is 'lots'" in err


@pytest.mark.parametrize(
    ("hook", "value"),
    [
        ("ampcore_device_overflow_flag", True),
        ("ampcore_device_overflow_flag", torch.zeros(2)),
        ("ampcore_prepare_o2", "done"),
        ("ampcore_backend_info", ["ipex"]),
    ],
)
def test_results_the_core_uses_are_checked_by_class(register, hook: str, value: object) -> None:
    assert result_problem(hook, value) is not None
    params = {"ampcore_device_overflow_flag": "device", "ampcore_prepare_o2": "model, optimizer, dtype"}.get(hook, "")
    function = eval(f"lambda {params}: value", {"value": value})  # noqa: S307 - a hook of the spec's signature
    backend = register(make_adapter("wrong", **{hook: function}), name="wrong")
    call = backend.hook(hook)
    assert call is not None
    kwargs = {"ampcore_device_overflow_flag": {"device": torch.device("cpu")},
              "ampcore_prepare_o2": {"model": torch.nn.Linear(2, 2), "optimizer": None, "dtype": torch.bfloat16},
              }.get(hook, {})  # fmt: skip
    with pytest.raises(ampcore.PluginError, match=rf'Plugin "wrong": {hook}\(\) returned'), pytest.warns(PluginWarning):
        call(**kwargs)
    assert {p.name: p for p in ampcore.list_plugins()}["wrong"].status == "failed"


# -- defect 7: the overflow-flag hooks ------------------------------------------------------


def _fp16_step(device: str) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ampcore.GradScaler(device, dtype=torch.float16)
    loss = model(torch.ones(2, 4)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def test_the_flag_hooks_always_get_a_device_with_its_index(register) -> None:
    seen: list[torch.device] = []

    def flag(device: torch.device) -> torch.Tensor:
        seen.append(device)
        return torch.zeros(1, device=device)

    register(make_adapter("flagged", dtypes=(torch.float16,), ampcore_device_overflow_flag=flag,
                          ampcore_clear_device_overflow_flag=lambda device: seen.append(device)),
             name="flagged")  # fmt: skip
    _fp16_step("flagged")
    _fp16_step("flagged")
    assert len(seen) >= 4 and set(seen) == {torch.device("cpu", 0)}
    assert indexed_device("cpu") == torch.device("cpu", 0) and indexed_device("cpu:3") == torch.device("cpu", 3)


@pytest.mark.parametrize("hook", ["ampcore_device_overflow_flag", "ampcore_clear_device_overflow_flag"])
def test_an_exception_of_a_flag_hook_is_a_plugin_error_naming_the_hook(register, hook: str) -> None:
    def broken(device: torch.device) -> None:
        raise RuntimeError("float status register unreadable")

    register(make_adapter("flaky", dtypes=(torch.float16,), **{hook: broken}), name="flaky")
    with pytest.raises(
        ampcore.PluginError, match=rf'Plugin "flaky": {hook}\(\) raised RuntimeError: float status register unreadable'
    ):
        _fp16_step("flaky")


# -- defect 7: ampcore info ------------------------------------------------------------------


@pytest.mark.parametrize("strict", ["", "1"], ids=["default", "strict"])
def test_ampcore_info_lists_stale_plugins_as_failed_and_exits_0(tmp_path: Path, strict: str) -> None:
    stale = {  # entry point -> module source: a newer contract, a removed module, a malformed value
        "newer": "AMPCORE_CONTRACT = 3\n",
        "gone": None,
        "odd": None,
    }
    for index, (name, source) in enumerate(stale.items()):
        dist = tmp_path / f"ampcore_stale{index}-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ampcore-stale{index}\nVersion: 0.1\n")
        value = {"odd": "not a module!", "gone": "ampcore_removed_vendor_module"}.get(name, f"ampcore_stale_{name}")
        (dist / "entry_points.txt").write_text(f"[ampcore]\n{name} = {value}\n")
        if source is not None:
            (tmp_path / f"ampcore_stale_{name}.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "AMPCORE_STRICT_PLUGINS": strict}  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "ampcore", "info", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    import json

    info = json.loads(run.stdout)
    plugins = {p["name"]: p for p in info["plugins"]}
    assert {plugins[name]["status"] for name in stale} == {"failed"}
    assert "newer than this ampcore" in plugins["newer"]["error"]
    assert "no 'module' or 'module:attribute'" in plugins["odd"]["error"]
    assert plugins["cpu"]["status"] == "loaded" and "cpu" in [b["name"] for b in info["backends"]]


def test_ampcore_info_says_how_each_backend_sees_an_overflow(register) -> None:
    from ampcore._cli.info import collect_info, format_info

    register(
        make_adapter("saturating", dtypes=(torch.float16,), ampcore_device_overflow_flag=lambda device: None),
        name="saturating",
    )
    info = collect_info()
    overflow = {b["name"]: b["overflow"] for b in info["backends"]}
    assert overflow["saturating"] == "flag" and overflow["cpu"] == "inf"
    notes = format_info(info).split("Backend notes:")[1]
    assert "saturating overflow: GradScaler reads the device's overflow flag" in notes
    assert "cpu overflow" not in notes
