"""Registration and hook validation: the adapter is installed, found, and keeps the contract."""

from __future__ import annotations

import importlib.metadata
import inspect
import re

import pytest
import torch

import ampcore
from ampcore import hookspec
from ampcore.hookspec import ENTRY_POINT_GROUP
from ampcore_conformance._context import SuiteContext, dtype_name

_SPECS = {name: fn for name, fn in vars(hookspec).items() if name.startswith("ampcore_") and callable(fn)}


def test_backend_is_available(amp_context: SuiteContext) -> None:
    """Fails with the adapter's reason when the backend is unknown or has no device."""
    if amp_context.problem is not None:
        pytest.fail(amp_context.problem, pytrace=False)
    backend = amp_context.require_backend()
    assert backend.is_available and backend.unavailable_reason is None


def _plugin_object(backend: ampcore.Backend) -> object:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else None
        if ep.name == backend.plugin_name and dist == backend.distribution:
            return ep.load()
    pytest.fail(
        f"backend {backend.name!r} (plugin {backend.plugin_name!r}) comes from no installed distribution's "
        f"entry point of group {ENTRY_POINT_GROUP!r}; vendors register with "
        f"[project.entry-points.{ENTRY_POINT_GROUP}] in pyproject.toml",
        pytrace=False,
    )


def test_plugin_is_an_installed_entry_point(amp_backend: ampcore.Backend) -> None:
    infos = [p for p in ampcore.list_plugins() if p.name == amp_backend.plugin_name]
    assert infos and infos[0].status == "loaded", f"plugin status: {infos[0] if infos else 'unknown'}"
    assert amp_backend.distribution and amp_backend.version, "the plugin's distribution name and version are unknown"
    _plugin_object(amp_backend)


def test_plugin_hooks_match_the_contract(amp_backend: ampcore.Backend) -> None:
    """Every ``ampcore_*`` function of the plugin is a marked hook with the spec's parameters."""
    plugin = _plugin_object(amp_backend)
    problems = []
    for attr in dir(plugin):
        function = getattr(plugin, attr, None)
        if not attr.startswith("ampcore_") or not callable(function):
            continue
        if attr not in _SPECS:
            problems.append(f"{attr}: no such hook")
            continue
        if getattr(function, f"{hookspec.PROJECT_NAME}_impl", None) is None:
            problems.append(f"{attr}: not marked with @ampcore.hookimpl")
        params = set(inspect.signature(function).parameters) - {"self"}
        extra = params - set(inspect.signature(_SPECS[attr]).parameters)
        if extra:
            problems.append(f"{attr}: parameters {sorted(extra)} are not in the hook spec")
    missing = [name for name in hookspec.REQUIRED_HOOKS if amp_backend.hook(name) is None]
    problems += [f"{name}: required hook not implemented" for name in missing]
    assert not problems, "; ".join(problems)


def test_identity_hooks_are_well_formed(amp_context: SuiteContext, amp_backend: ampcore.Backend) -> None:
    assert amp_backend.name == amp_context.backend_name
    assert re.fullmatch(r"[a-z][a-z0-9_\-]*", amp_backend.name), amp_backend.name
    torch.device(amp_backend.device_type)  # a device type torch knows
    dtypes = amp_backend.supported_dtypes
    assert dtypes and len(set(dtypes)) == len(dtypes), f"duplicate or no dtypes: {dtypes}"
    assert all(d.is_floating_point and d != torch.float32 and torch.finfo(d).bits < 32 for d in dtypes), (
        f"ampcore_backend() dtypes must list low-precision floating dtypes, got {[dtype_name(d) for d in dtypes]}"
    )
    assert amp_backend.default_dtype in dtypes
    assert isinstance(amp_backend.priority, int)


def test_device_hooks_answer(amp_backend: ampcore.Backend, amp_device: torch.device) -> None:
    count = amp_backend.device_count()
    assert isinstance(count, int) and count >= 1, f"ampcore_device_count() returned {count!r} on an available backend"
    name = amp_backend.device_name(0)
    assert isinstance(name, str) and name.strip(), f"ampcore_device_name(0) returned {name!r}"
    x = torch.arange(4.0, device=amp_device)
    assert x.device.type == amp_backend.device_type and float((x * 2).sum().cpu()) == 12.0


def test_device_indices_are_checked(amp_backend: ampcore.Backend) -> None:
    count = amp_backend.device_count()
    assert ampcore.get_backend(f"{amp_backend.name}:0") is amp_backend
    with pytest.raises(ampcore.AmpcoreError, match="valid indices"):
        ampcore.autocast(device=f"{amp_backend.name}:{count}")


def test_dtype_hooks_answer(amp_backend: ampcore.Backend, amp_dtype: torch.dtype) -> None:
    scaling = amp_backend.needs_loss_scaling(amp_dtype)
    assert isinstance(scaling, bool)
    issues = amp_backend.capability_issues(amp_dtype, 0)
    assert all(isinstance(i, ampcore.CapabilityIssue) for i in issues)
    errors = [i.message for i in issues if i.severity == "error"]
    assert not errors, f"the adapter declares {amp_dtype} but its capability check says it cannot run: {errors}"
    adjustments = amp_backend.op_list_adjustments(amp_dtype)
    assert set(adjustments) <= {"white", "black", "promote"}


def test_undeclared_dtype_is_rejected(amp_backend: ampcore.Backend) -> None:
    undeclared = next(
        d for d in (torch.float16, torch.bfloat16, torch.float64) if d not in amp_backend.supported_dtypes
    )
    with pytest.raises(ampcore.AmpcoreError, match="does not support"):
        ampcore.autocast(device=amp_backend.name, dtype=undeclared)
