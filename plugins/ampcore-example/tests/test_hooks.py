"""The TEMPLATE's own hooks: its pure device logic, and the backend ampcore builds from it.

Copy these tests with the plugin: replace the recorded properties by those of your devices
(one row per chip generation you support) and the expectations by your own choices.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from ampcore_example import plugin
from ampcore_example.plugin import ExampleDeviceProperties, example_capability_issues

import ampcore
import ampcore.hookspec

# (recorded device, dtype, expected severities): one row per device generation.
CAPABILITY = [
    (ExampleDeviceProperties("CPU with AVX512-BF16", bf16_native=True), torch.bfloat16, []),
    (ExampleDeviceProperties("CPU without bf16 instructions", bf16_native=False), torch.bfloat16, ["warning"]),
    (ExampleDeviceProperties("CPU torch cannot describe", bf16_native=None), torch.bfloat16, []),
]


@pytest.mark.parametrize(("props", "dtype", "expected"), CAPABILITY, ids=[row[0].name for row in CAPABILITY])
def test_capability_table(props: ExampleDeviceProperties, dtype: torch.dtype, expected: list[str]) -> None:
    issues = example_capability_issues(props, dtype)
    assert [issue.severity for issue in issues] == expected
    for issue in issues:
        assert props.name in issue.message and "TEMPLATE" in issue.message


def test_entry_point_gives_the_example_backend() -> None:
    backend = ampcore.get_backend("example")
    assert backend.distribution == "ampcore-example"
    assert (backend.device_type, backend.supported_dtypes, backend.default_dtype) == (
        "cpu",
        (torch.bfloat16,),
        torch.bfloat16,
    )
    assert backend.is_available and backend.device_count() == 1
    assert "TEMPLATE" in backend.device_name(0)
    assert not backend.needs_loss_scaling(torch.bfloat16)
    assert backend.op_list_adjustments(torch.bfloat16) == {"black": frozenset({"layer_norm", "group_norm"})}


def test_a_template_is_never_chosen_by_device_none() -> None:
    backend = ampcore.get_backend("example")
    assert backend.priority < ampcore.get_backend("cpu").priority
    assert ampcore.get_backend(None).name != "example"  # the best available backend: never the template


def test_unsupported_dtype_is_refused_with_the_choices() -> None:
    with pytest.raises(
        ampcore.AmpcoreError, match='backend "example" does not support torch.float16; supported dtypes: torch.bfloat16'
    ):
        ampcore.autocast(device="example", dtype=torch.float16)


def test_autocast_runs_white_list_ops_in_bf16() -> None:
    x = torch.randn(8, 8)
    with ampcore.autocast(device="example"):
        assert torch.mm(x, x).dtype == torch.bfloat16
        assert torch.nn.functional.mse_loss(x, x).dtype == torch.float32


def test_adjusted_lists_keep_norms_in_float32() -> None:
    """ampcore's op lists for the backend: the CPU's native lists plus this plugin's choice
    (the conformance suite checks that the ops really run so on the device)."""
    cpu, example = ampcore.oplists("cpu"), ampcore.oplists("example")
    assert {"layer_norm", "group_norm"} <= example.black
    assert not {"layer_norm", "group_norm"} & (example.white | example.promote)
    assert example.white == cpu.white and example.promote == cpu.promote
    assert example.black - cpu.black <= {"layer_norm", "group_norm"}


def test_every_hook_of_the_contract_is_shown() -> None:
    """The template implements or documents every hook of the installed ampcore."""
    source = inspect.getsource(plugin)
    hooks = [name for name, obj in vars(ampcore.hookspec).items() if name.startswith("ampcore_") and callable(obj)]
    missing = [name for name in hooks if f"def {name}(" not in source]
    assert not missing, f"hooks neither implemented nor documented in the template: {missing}"
    for required in ampcore.hookspec.REQUIRED_HOOKS:
        assert callable(getattr(plugin, required))


def test_the_template_targets_a_contract_this_ampcore_supports() -> None:
    """``AMPCORE_CONTRACT``: an ampcore that does not support it refuses the plugin at load."""
    assert plugin.AMPCORE_CONTRACT in ampcore.hookspec.SUPPORTED_CONTRACTS
