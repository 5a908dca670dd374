"""The suite tests the dtypes the device runs (issue 25, defect 4): a backend declaring
float16 and bfloat16 whose capability check refuses one of them on device 0."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import make_adapter

import ampcore
from ampcore import CapabilityIssue
from ampcore_conformance._context import UsageProblem, check_dtypes


@pytest.fixture(params=[torch.bfloat16, torch.float16], ids=["refuses-bf16", "refuses-fp16"])
def chip(request: pytest.FixtureRequest, register: Callable[..., Any]) -> tuple[ampcore.Backend, torch.dtype]:
    refused = request.param

    def check(dtype: torch.dtype, device_index: int) -> list[CapabilityIssue]:
        return [CapabilityIssue("error", f"no {dtype} on this chip")] if dtype == refused else []

    backend = register(
        make_adapter("chip", dtypes=(torch.bfloat16, torch.float16), ampcore_check_capability=check), name="chip"
    )
    return backend, refused


def test_default_selection_is_what_the_device_runs(chip: tuple[ampcore.Backend, torch.dtype]) -> None:
    backend, refused = chip
    assert check_dtypes(backend, []) == tuple(d for d in (torch.bfloat16, torch.float16) if d != refused)


def test_the_other_dtype_can_be_chosen(chip: tuple[ampcore.Backend, torch.dtype]) -> None:
    backend, refused = chip
    other = "fp16" if refused == torch.bfloat16 else "bf16"
    assert check_dtypes(backend, [other], "--dtype") == (ampcore.toolkit.parse_dtype(other),)


def test_choosing_the_refused_dtype_names_device_and_reason(chip: tuple[ampcore.Backend, torch.dtype]) -> None:
    backend, refused = chip
    name = str(refused).removeprefix("torch.")
    with pytest.raises(UsageProblem, match=rf"--dtype {name}: backend 'chip' declares it, but .* refuses it on cpu:0 "
                                            rf"\(no {refused} on this chip\)"):  # fmt: skip
        check_dtypes(backend, [name], "--dtype")
