"""The adapter contract itself: its version check at load, the hooks it has (and had), and
that every hook is implemented by a first-party backend or template."""

from __future__ import annotations

import importlib
import inspect
import re
import types
import warnings
from pathlib import Path

import pytest
import torch
from conftest import make_adapter
from test_plugins import FakeSite, _good, site_fixture  # noqa: F401  (the fixture ``site``)

import ampcore
from ampcore import PluginWarning, hookspec

#: The hooks of contract 2, in the order of ampcore/hookspec.py.
CONTRACT_2_HOOKS = (
    "ampcore_backend",
    "ampcore_unavailable_reason",
    "ampcore_device_count",
    "ampcore_device_name",
    "ampcore_check_capability",
    "ampcore_needs_loss_scaling",
    "ampcore_op_list_adjustments",
    "ampcore_device_overflow_flag",
    "ampcore_clear_device_overflow_flag",
    "ampcore_memory",
    "ampcore_prepare_o2",
    "ampcore_synchronize",
    "ampcore_backend_info",
    "ampcore_auto_costs",
    "ampcore_auto_load",
    "ampcore_auto_timer",
    "ampcore_auto_waited",
)

#: Modules of the first-party backends and the plugin templates.
FIRST_PARTY = (
    "ampcore_backends.cpu",
    "ampcore_backends.cuda",
    "ampcore_backends.npu",
    "ampcore_backends.xpu",
    "ampcore_example.plugin",
    "ampcore_acme.plugin",
)

#: Hooks no first-party backend or template implements yet, with the reason.
NOT_IMPLEMENTED_YET: dict[str, str] = {}


def _hooks() -> list[str]:
    return [name for name, obj in vars(hookspec).items() if name.startswith("ampcore_") and inspect.isfunction(obj)]


def _adapter(contract: object = hookspec.CONTRACT_VERSION, **hooks: object) -> object:
    plugin = make_adapter("versioned", **hooks)
    if contract is None:
        del type(plugin).AMPCORE_CONTRACT
    else:
        type(plugin).AMPCORE_CONTRACT = contract
    return plugin


# -- hooks -------------------------------------------------------------------------------


def test_contract_2_has_sixteen_hooks_one_required() -> None:
    assert tuple(_hooks()) == CONTRACT_2_HOOKS
    assert len(CONTRACT_2_HOOKS) == 17 and hookspec.REQUIRED_HOOKS == ("ampcore_backend",)
    assert hookspec.CONTRACT_VERSION == 2 and hookspec.SUPPORTED_CONTRACTS == (1, 2)
    assert hookspec.DEPRECATED_CONTRACTS == (1,)


def test_no_hook_is_firstresult() -> None:
    """Hooks are never broadcast (each plugin's own implementation is called)."""
    for name in _hooks():
        spec = getattr(getattr(hookspec, name), f"{hookspec.PROJECT_NAME}_spec")
        assert not spec.get("firstresult"), name


def test_removed_hooks_are_no_longer_hooks() -> None:
    assert not set(hookspec.REMOVED_HOOKS) & set(_hooks())


@pytest.mark.parametrize("hook", CONTRACT_2_HOOKS)
def test_every_hook_is_implemented_by_a_first_party_backend_or_template(hook: str) -> None:
    if hook in NOT_IMPLEMENTED_YET:
        pytest.skip(NOT_IMPLEMENTED_YET[hook])
    implementers = []
    for module_name in FIRST_PARTY:
        module = importlib.import_module(module_name)
        function = getattr(module, hook, None)
        if function is not None and getattr(function, f"{hookspec.PROJECT_NAME}_impl", None) is not None:
            implementers.append(module_name)
    assert implementers, f"{hook}: no first-party backend or template implements it"


def test_hookspec_docstring_example_is_a_valid_plugin(register) -> None:
    """The smallest plugin, as the contract's docstring shows it, loads (and stays short)."""
    doc = hookspec.__doc__ or ""
    code = doc.split("Example plugin module::", 1)[1]
    source = "\n".join(line[4:] for line in code.splitlines() if line.startswith("    ") or not line.strip())
    assert len([line for line in source.splitlines() if line.strip()]) <= 14
    module = types.ModuleType("smallest_plugin")
    # renamed: the installed example template already claims the name "example"
    exec(compile(source.replace('"example"', '"smallest"'), "smallest_plugin", "exec"), module.__dict__)  # noqa: S102
    backend = register(module, name="smallest")
    assert (backend.name, backend.device_type, backend.supported_dtypes) == ("smallest", "cpu", (torch.bfloat16,))


# -- the version check -------------------------------------------------------------------


#: A contract-1 plugin as vendors wrote it for ampcore 0.1.x (every hook contract 1 had that
#: contract 2 renamed, merged or removed, and two it kept).
CONTRACT_1 = """
import torch
from ampcore import hookimpl

MEMORY = {"in_use": 11, "peak": 22, "total": 33, "resets": 0}

@hookimpl
def ampcore_backend_name():
    return "{backend}"

@hookimpl
def ampcore_device_type():
    return "cpu"

@hookimpl
def ampcore_supported_dtypes():
    return [torch.float16, torch.bfloat16]

@hookimpl
def ampcore_default_dtype():
    return torch.bfloat16

@hookimpl
def ampcore_backend_priority():
    return -10

@hookimpl
def ampcore_backend_overrides():
    return True

@hookimpl
def ampcore_unavailable_reason():
    return None

@hookimpl
def ampcore_device_name(device_index):
    return f"old chip {device_index}"

@hookimpl
def ampcore_memory_in_use(device_index):
    return MEMORY["in_use"] + device_index

@hookimpl
def ampcore_peak_memory(device_index):
    return MEMORY["peak"]

@hookimpl
def ampcore_device_memory(device_index):
    return MEMORY["total"]

@hookimpl
def ampcore_reset_peak_memory(device_index):
    MEMORY["resets"] += 1

@hookimpl
def ampcore_keep_norm_fp32(dtype):
    return True

@hookimpl
def ampcore_unscale_grads_(grads, found_inf, inv_scale):
    return None
"""


def _contract_1_module(backend: str, declare: str = "") -> types.ModuleType:
    module = types.ModuleType(f"contract_1_{backend}")
    exec(compile(declare + CONTRACT_1.replace("{backend}", backend), module.__name__, "exec"), module.__dict__)  # noqa: S102
    return module


@pytest.mark.parametrize("declare", ["", "AMPCORE_CONTRACT = 1\n"], ids=["undeclared", "declared-1"])
def test_a_contract_1_plugin_loads_with_one_warning_naming_each_hook_to_change(register, declare: str) -> None:
    module = _contract_1_module("oldchip", declare)
    with pytest.warns(PluginWarning) as record:
        backend = register(module, name="oldchip")
    (warning,) = [w for w in record if "contract 1" in str(w.message)]
    message = str(warning.message)
    assert message.startswith('ampcore plugin "oldchip" (registered in process) targets adapter contract 1, deprecated')
    assert "until ampcore 0.3.0" in message and "declare AMPCORE_CONTRACT = 2" in message
    for hook in ("ampcore_backend_name", "ampcore_device_type", "ampcore_supported_dtypes", "ampcore_default_dtype",
                 "ampcore_backend_priority", "ampcore_backend_overrides", "ampcore_memory_in_use",
                 "ampcore_peak_memory", "ampcore_device_memory", "ampcore_reset_peak_memory", "ampcore_keep_norm_fp32",
                 "ampcore_unscale_grads_"):  # fmt: skip
        assert f"{hook}: " in message, hook
    for kept in ("ampcore_unavailable_reason", "ampcore_device_name"):
        assert kept not in message
    # the old hooks answer through contract 2
    assert (backend.name, backend.device_type, backend.supported_dtypes) == (
        "oldchip",
        "cpu",
        (torch.float16, torch.bfloat16),
    )
    assert (backend.default_dtype, backend.priority, backend.device_name(1)) == (torch.bfloat16, -10, "old chip 1")
    toolkit = ampcore.toolkit
    assert (toolkit.memory_in_use(backend, 2), toolkit.peak_memory(backend), toolkit.device_memory(backend)) == (
        13,
        22,
        33,
    )
    toolkit.reset_peak_memory(backend)
    assert module.MEMORY["resets"] == 1
    assert {p.name: p for p in ampcore.list_plugins()}["oldchip"].contract == 1


def test_a_contract_1_plugin_without_its_required_hooks_names_them() -> None:
    with pytest.raises(ampcore.PluginError) as caught:
        ampcore.register_plugin(_adapter(contract=None), name="unversioned")
    message = str(caught.value)
    assert message.startswith('Plugin "unversioned": declares no AMPCORE_CONTRACT, so it targets adapter contract 1')
    assert "ampcore_backend_name, ampcore_device_type, ampcore_supported_dtypes" in message
    assert "docs/migrating-contract-1.md" in message
    assert "unversioned" not in {p.name for p in ampcore.list_plugins()}


def test_a_contract_1_hook_without_its_marker_is_refused_not_dropped() -> None:
    module = _contract_1_module("unmarked")
    module.ampcore_unavailable_reason = lambda: "no device"  # the marker forgotten
    with pytest.raises(ampcore.PluginError, match="ampcore_unavailable_reason is not marked as a hook"):
        ampcore.register_plugin(module, name="unmarked")


def test_a_plugin_targeting_a_newer_contract_fails_asking_to_upgrade_ampcore() -> None:
    with pytest.raises(
        ampcore.PluginError,
        match=r'Plugin "new": targets adapter contract 3 \(AMPCORE_CONTRACT = 3\), '
        r"newer than this ampcore 0\.2\.0 knows; "
        r"supported contract versions: 2 \(and 1, deprecated.*\)\. Upgrade ampcore",
    ):
        ampcore.register_plugin(_adapter(contract=3), name="new")


@pytest.mark.parametrize("value", ["2", 2.0, True])
def test_a_contract_that_is_no_int_is_refused(value: object) -> None:
    with pytest.raises(ampcore.PluginError, match=r"AMPCORE_CONTRACT = .*; expected an int contract version such as 2"):
        ampcore.register_plugin(_adapter(contract=value), name="odd")


@pytest.mark.parametrize("strict", ["", "1"], ids=["default", "strict"])
def test_an_installed_contract_1_plugin_loads_with_a_warning(site: FakeSite, strict: str) -> None:
    site.install("ampcore-alpha", "alpha", "alpha_plugin", _good("alpha"))
    site.install("ampcore-old", "old", "old_plugin", CONTRACT_1.replace("{backend}", "old"), version="0.3")
    pm = site.manager(AMPCORE_STRICT_PLUGINS=strict)
    with pytest.warns(
        PluginWarning, match=r'"old" \(distribution "ampcore-old"\) targets adapter contract 1, deprecated'
    ) as record:
        infos = {info.name: info for info in pm.plugins()}
    assert len(record) == 1 and record[0].filename.endswith("old_plugin.py")  # points at the plugin's file
    assert (infos["old"].status, infos["old"].contract) == ("loaded", 1)
    assert [b.name for b in pm.backends()] == ["alpha", "old"]


# -- hooks of contract 1 name what replaced them -----------------------------------------


@pytest.mark.parametrize(
    ("old_hook", "function", "new"),
    [
        ("ampcore_backend_name", lambda: "x", r"merged into ampcore_backend \(BackendSpec.name\)"),
        ("ampcore_device_type", lambda: "cpu", r"merged into ampcore_backend \(BackendSpec.device_type\)"),
        ("ampcore_supported_dtypes", lambda: [], r"merged into ampcore_backend \(BackendSpec.dtypes\)"),
        ("ampcore_default_dtype", lambda: None, r"merged into ampcore_backend \(BackendSpec.default_dtype\)"),
        ("ampcore_backend_priority", lambda: 0, r"merged into ampcore_backend \(BackendSpec.priority\)"),
        ("ampcore_memory_in_use", lambda device_index: 0, r"merged into ampcore_memory \(its 'in_use' key\)"),
        ("ampcore_peak_memory", lambda device_index: 0, r"merged into ampcore_memory \(its 'peak' key\)"),
        (
            "ampcore_reset_peak_memory",
            lambda device_index: None,
            r"merged into ampcore_memory \(called with reset_peak=True\)",
        ),
        ("ampcore_device_memory", lambda device_index: 0, r"merged into ampcore_memory \(its 'total' key\)"),
        ("ampcore_backend_overrides", lambda: True, "removed in contract 2: .*AMPCORE_BLOCK_PLUGINS"),
        ("ampcore_unscale_grads_", lambda grads: True, "removed in contract 2: the scaler uses torch's"),
        ("ampcore_keep_norm_fp32", lambda dtype: True, r"removed in contract 2: .*decorate\(keep_norm_fp32=...\)"),
    ],
)
def test_a_hook_of_contract_1_names_what_replaced_it(old_hook: str, function: object, new: str) -> None:
    plugin = make_adapter("stale")
    setattr(type(plugin), old_hook, ampcore.hookimpl(function))
    with pytest.raises(ampcore.PluginError) as caught:
        ampcore.register_plugin(plugin, name="stale")
    assert re.match(rf'Plugin "stale": unknown hook\(s\) {re.escape(old_hook)} \({new}', str(caught.value)), str(
        caught.value
    )


# -- the merged identity and memory hooks ----------------------------------------------


def test_backend_spec_gives_name_device_type_dtypes_default_and_priority(register) -> None:
    backend = register(
        make_adapter("spec", dtypes=(torch.float16, torch.bfloat16), default_dtype=torch.bfloat16, priority=7),
        name="spec",
    )
    assert (backend.name, backend.device_type, backend.supported_dtypes) == (
        "spec",
        "cpu",
        (torch.float16, torch.bfloat16),
    )
    assert (backend.default_dtype, backend.priority) == (torch.bfloat16, 7)


def test_ampcore_backend_returning_no_backend_spec_is_a_plugin_error() -> None:
    plugin = make_adapter("nospec")
    type(plugin).ampcore_backend = ampcore.hookimpl(lambda self: {"name": "nospec"})
    with pytest.raises(
        ampcore.PluginError, match=r"ampcore_backend\(\) returned \{'name': 'nospec'\}; expected an ampcore.BackendSpec"
    ):
        ampcore.register_plugin(plugin, name="nospec")


def test_memory_hook_answers_in_use_peak_total_and_resets(register) -> None:
    calls: list[tuple[int, bool]] = []

    def memory(device_index: int, reset_peak: bool) -> dict[str, int | None]:
        calls.append((device_index, reset_peak))
        return {"in_use": 10 + device_index, "peak": 20, "total": 16 * 2**30}

    backend = register(make_adapter("mem", ampcore_memory=memory), name="mem")
    toolkit = ampcore.toolkit
    assert (toolkit.memory_in_use(backend, 1), toolkit.peak_memory(backend), toolkit.device_memory(backend)) == (
        11,
        20,
        16 * 2**30,
    )
    toolkit.reset_peak_memory(backend, 1)
    assert calls[-1] == (1, True) and all(not reset for _, reset in calls[:-1])


def test_memory_hook_may_leave_keys_out(register) -> None:
    backend = register(make_adapter("partial", ampcore_memory=lambda: {"in_use": 5}), name="partial")
    assert ampcore.toolkit.memory_in_use(backend) == 5
    assert ampcore.toolkit.peak_memory(backend) is None and ampcore.toolkit.device_memory(backend) is None


def test_memory_hook_returning_no_mapping_is_a_plugin_error(register) -> None:
    backend = register(make_adapter("badmem", ampcore_memory=lambda: 5), name="badmem")
    with pytest.raises(
        ampcore.PluginError,
        match=r"ampcore_memory\(0, reset_peak=False\) returned 5; "
        r"expected None or a dict with keys in_use, peak, total",
    ):
        ampcore.toolkit.memory_in_use(backend)


def test_cpu_backend_implements_memory_with_the_resident_set() -> None:
    cpu = ampcore.get_backend("cpu")
    if not Path("/proc/self/status").exists():
        pytest.skip("the CPU adapter reads /proc/self/status (Linux only)")
    ampcore.toolkit.reset_peak_memory(cpu)
    in_use, peak = ampcore.toolkit.memory_in_use(cpu), ampcore.toolkit.peak_memory(cpu)
    assert in_use is not None and peak is not None and in_use > 0 and peak > 0
    assert ampcore.toolkit.device_memory(cpu) is None  # host memory: bench picks scaled-down sizes


def test_a_contract_1_plugin_object_loads_and_a_warning_made_an_error_leaves_nothing_behind(register) -> None:
    class Old:
        @ampcore.hookimpl
        def ampcore_backend_name(self):  # type: ignore[no-untyped-def]
            return "oldobj"

        @ampcore.hookimpl
        def ampcore_device_type(self):  # type: ignore[no-untyped-def]
            return "cpu"

        @ampcore.hookimpl
        def ampcore_supported_dtypes(self):  # type: ignore[no-untyped-def]
            return (torch.bfloat16,)

        @ampcore.hookimpl
        def ampcore_device_name(self, device_index):  # type: ignore[no-untyped-def]
            return f"chip {device_index}"

    with pytest.warns(PluginWarning, match="ampcore_backend_name: merged into ampcore_backend"):
        backend = register(Old(), name="oldobj")
    assert backend.device_name(3) == "chip 3" and backend.supported_dtypes == (torch.bfloat16,)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginWarning)
        with pytest.raises(PluginWarning):
            ampcore.register_plugin(Old(), name="oldobj2")
    assert "oldobj2" not in {p.name for p in ampcore.list_plugins()}
