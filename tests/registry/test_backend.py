"""Backend: the contract checks on what an adapter declares, and capability findings."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore import CapabilityIssue


@pytest.mark.parametrize(
    ("plugin", "match"),
    [
        (make_adapter("has:colon"), "no ':'"),
        (make_adapter("x", dtypes=()), "non-empty"),
        (make_adapter("x", dtypes=(torch.int8,)), "floating"),
        (make_adapter("x", default_dtype=torch.float16), "not among its supported dtypes"),
        (make_adapter("x", priority="high"), "expected an int"),  # type: ignore[arg-type]
        (make_adapter("x", device_type=""), "device_type=''"),
    ],
    ids=["colon", "no-dtypes", "int-dtype", "bad-default", "bad-priority", "empty-device-type"],
)
def test_invalid_declarations_raise_plugin_error(plugin: object, match: str) -> None:
    with pytest.raises(ampcore.PluginError, match=match):
        ampcore.register_plugin(plugin, name="invalid")
    assert "invalid" not in {p.name for p in ampcore.list_plugins()}


def test_missing_required_hook() -> None:
    class NoDtypes:
        AMPCORE_CONTRACT = 2

        @ampcore.hookimpl
        def ampcore_device_name(self) -> str:
            return "x"

    with pytest.raises(
        ampcore.PluginError, match=r"required hook ampcore_backend\(\); an adapter plugin must implement"
    ):
        ampcore.register_plugin(NoDtypes(), name="nodtypes")


def test_defaults_of_optional_hooks(register) -> None:
    backend = register(make_adapter("plain", dtypes=(torch.float16, torch.bfloat16)), name="plain")
    assert backend.default_dtype == torch.float16
    assert backend.priority == 50 and backend.is_available
    assert backend.needs_loss_scaling(torch.float16) and not backend.needs_loss_scaling(torch.bfloat16)
    assert backend.device_count() == 1 and backend.device_name(0) == "cpu"
    assert backend.capability_issues(torch.float16) == ()
    assert backend.op_list_adjustments(torch.float16) == {}


def test_check_dtype_lists_supported_dtypes(register) -> None:
    backend = register(make_adapter("plain", dtypes=(torch.bfloat16,)), name="plain")
    assert backend.check_dtype(None) == torch.bfloat16
    with pytest.raises(ampcore.AmpcoreError, match="does not support torch.float16; supported dtypes: torch.bfloat16"):
        backend.check_dtype(torch.float16)


def test_capability_warning_is_issued_once_per_device_and_dtype(register) -> None:
    calls = []

    def check(dtype: torch.dtype, device_index: int) -> list[CapabilityIssue]:
        calls.append((dtype, device_index))
        return [CapabilityIssue("warning", f"slow {dtype} on device {device_index}")]

    backend = register(make_adapter("slow", ampcore_check_capability=check), name="slow")
    with pytest.warns(ampcore.AmpcoreWarning, match="slow torch.bfloat16 on device 0"):
        backend.enforce_capability(torch.bfloat16, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend.enforce_capability(torch.bfloat16, 0)  # cached and already warned: silent
    assert calls == [(torch.bfloat16, 0)]


def test_capability_error_raises(register) -> None:
    check = lambda dtype: [CapabilityIssue("error", "needs compute capability 8.0")]  # noqa: E731
    backend = register(make_adapter("old", ampcore_check_capability=check), name="old")
    with pytest.raises(
        ampcore.AmpcoreError, match='backend "old" cannot run torch.bfloat16 on cpu:0: needs compute capability 8.0'
    ):
        backend.enforce_capability(torch.bfloat16)


def test_capability_items_must_be_capability_issues(register) -> None:
    backend = register(make_adapter("sloppy", ampcore_check_capability=lambda: ["just a string"]), name="sloppy")
    with pytest.raises(ampcore.PluginError, match="expected ampcore.CapabilityIssue"):
        backend.capability_issues(torch.bfloat16)


def test_capability_issue_severity_is_validated() -> None:
    with pytest.raises(ValueError, match="'warning' or 'error'"):
        CapabilityIssue("fatal", "x")  # type: ignore[arg-type]


def test_op_list_adjustments_are_validated_and_cached(register) -> None:
    calls = []

    def adjust(dtype: torch.dtype) -> dict[str, list[str]]:
        calls.append(dtype)
        return {"black": ["layer_norm"], "white": "add"}  # a bare string counts as one op

    backend = register(make_adapter("adj", ampcore_op_list_adjustments=adjust), name="adj")
    expected = {"black": frozenset({"layer_norm"}), "white": frozenset({"add"})}
    assert backend.op_list_adjustments(torch.bfloat16) == expected
    assert backend.op_list_adjustments(torch.bfloat16) == expected and len(calls) == 1
    # validated at load (issue 12): the plugin is refused, not every region on it
    with pytest.raises(ampcore.PluginError, match="keys \\['grey'\\]; valid keys"):
        register(make_adapter("badadj", ampcore_op_list_adjustments=lambda: {"grey": ["add"]}), name="badadj")
