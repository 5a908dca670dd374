"""Dtypes that depend on the device found (issue 25): a backend declares its dtypes at load,
without a device, and refuses those the chip cannot run through ``ampcore_check_capability``.
Every part of ampcore then asks one function, ``toolkit.device_dtypes``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore import CapabilityIssue, toolkit


def _refusing(refused: torch.dtype) -> Callable[..., list[CapabilityIssue]]:
    def check(dtype: torch.dtype, device_index: int) -> list[CapabilityIssue]:
        return [CapabilityIssue("error", f"this chip has no {dtype}")] if dtype == refused else []

    return check


@pytest.fixture(params=[torch.bfloat16, torch.float16], ids=["refuses-bf16", "refuses-fp16"])
def chip(request: pytest.FixtureRequest, register: Callable[..., Any]) -> tuple[ampcore.Backend, torch.dtype]:
    refused = request.param
    backend = register(
        make_adapter("chip", dtypes=(refused, *({torch.float16, torch.bfloat16} - {refused})),
                     ampcore_check_capability=_refusing(refused)),
        name="chip",
    )  # fmt: skip
    return backend, refused


def test_device_dtypes_leave_out_the_refused_one(chip: tuple[ampcore.Backend, torch.dtype]) -> None:
    backend, refused = chip
    assert backend.default_dtype == refused  # declared first: the static default
    other = torch.float16 if refused == torch.bfloat16 else torch.bfloat16
    assert toolkit.device_dtypes(backend) == (other,)


def test_dtype_none_is_the_first_dtype_the_device_runs(chip: tuple[ampcore.Backend, torch.dtype]) -> None:
    backend, refused = chip
    other = toolkit.device_dtypes(backend)[0]
    with ampcore.autocast(device="chip"):
        assert torch.get_autocast_dtype("cpu") == other
    assert ampcore.GradScaler("chip").get_scale() >= 1.0  # no error for the default


@pytest.mark.parametrize("call", ["autocast", "GradScaler"])
def test_the_refused_dtype_raises_naming_dtype_and_device(chip: tuple[ampcore.Backend, torch.dtype], call: str) -> None:
    backend, refused = chip
    with pytest.raises(ampcore.AmpcoreError, match=rf"cannot run {refused} on cpu:0: this chip has no {refused}"):
        if call == "autocast":
            ampcore.autocast(device="chip", dtype=refused)
        else:
            ampcore.GradScaler("chip", dtype=refused)


def test_is_supported_agrees(chip: tuple[ampcore.Backend, torch.dtype]) -> None:
    backend, refused = chip
    ask = {torch.float16: ampcore.is_float16_supported, torch.bfloat16: ampcore.is_bfloat16_supported}
    assert [ask[d]("chip") for d in (refused, *toolkit.device_dtypes(backend))] == [False, True]
