"""The op-list registry: native tables vs the dispatcher, levels, merge rules, adapters."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ampcore
from ampcore import AmpcoreError, PluginError
from ampcore._op_names import functional_overloads
from ampcore._policy.registration import registered_keys, registered_overloads
from ampcore._policy.torch_tables import (
    NATIVE_TABLES,
    TORCH_RELEASE,
    UNMIRRORED,
    dispatch_key_of,
    native_table,
    release_of,
    table_name_of,
    tables_for,
)

# (dispatch key, ampcore table) pairs torch itself registers kernels for.
DISPATCHER_TABLES = [
    ("AutocastCPU", "cpu"),
    ("AutocastCUDA", "cuda"),
    ("AutocastMPS", "mps"),
    ("AutocastXPU", "generic"),
    ("AutocastMTIA", "generic"),
]


def _registrations(key: str) -> set[str]:
    try:
        names = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    except RuntimeError:
        pytest.skip(f"this torch has no dispatch key {key}")
    return {n.removeprefix("aten::") for n in names if n.startswith("aten::")}


def _table_drift(table: str, ours: set[str], registered: set[str], where: str) -> list[str]:
    """What differs between ampcore's ``table`` and ``registered`` (the registrations of one
    dispatch key), beyond the registrations ampcore leaves out on purpose."""
    unmirrored = set(UNMIRRORED.get(table, {}))
    problems = []
    if ours - registered:
        problems.append(f"in ampcore's {table} table but not registered {where}: {sorted(ours - registered)}")
    if registered - ours - unmirrored:
        missing = sorted(registered - ours - unmirrored)
        problems.append(f"registered {where} but missing from ampcore's {table} table: {missing}")
    if ours & unmirrored:
        problems.append(f"in ampcore's {table} table although UNMIRRORED: {sorted(ours & unmirrored)}")
    return problems


def _extension_registrations(key: str) -> set[str]:
    """The overloads whose kernel on ``key`` an extension registered, not torch: the
    dispatcher records where each kernel was registered, torch's own autocast kernels in its
    ``aten/src/ATen/`` (IPEX 2.8 registers AutocastCPU kernels from its ``csrc/cpu/autocast/``
    once imported: ``group_norm``, ``_adaptive_avg_pool3d``, ``_transform_bias_rescale_qkv``
    new, ``cat``, ``stack``... replaced)."""
    where = re.compile(rf"^{key}: registered at (\S+):\d+", re.MULTILINE)
    found = {op: where.search(torch._C._dispatch_dump(f"aten::{op}")) for op in _registrations(key)}
    return {op for op, match in found.items() if match and "/aten/src/ATen/" not in match.group(1).replace("\\", "/")}


@pytest.mark.parametrize(("key", "table"), DISPATCHER_TABLES)
def test_native_tables_match_the_dispatcher(key: str, table: str) -> None:
    """Drift guard: a torch upgrade that changes autocast's lists fails here (the tables are
    those of the installed torch's release, whatever the build: CPU-only or CUDA).  Kernels
    an extension added for ops torch has none for are not torch's lists: the conformance
    suite checks what they do (python3 tasks.py compat, tests/compat/ipex-cpu-manifest.toml)."""
    # ampcore's kernels live on shadow keys, never on a device's own key with native kernels
    assert key not in registered_keys()
    ours = set(NATIVE_TABLES[table])
    registered = _registrations(key) - (_extension_registrations(key) - ours)
    assert _table_drift(table, ours, registered, f"for {key} by torch {torch.__version__}") == []
    for overload in ours:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{overload}", key)


#: The autocast registrations of torch releases in the supported range, recorded from their
#: wheels (``torch._C._dispatch_get_registrations_for_dispatch_key``; the CUDA builds of PyPI
#: for 2.8 to 2.12, the CPU build for 2.13).
RECORDED = sorted((Path(__file__).parent / "data").glob("autocast-registrations-*.json"))


def test_every_supported_release_is_recorded() -> None:
    releases = {release_of(json.loads(path.read_text())["torch"]) for path in RECORDED}
    assert {(2, minor) for minor in range(8, 14)} <= releases


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem.removeprefix("autocast-registrations-") for p in RECORDED])
@pytest.mark.parametrize(("key", "table"), DISPATCHER_TABLES)
def test_native_tables_match_each_recorded_release(key: str, table: str, path: Path) -> None:
    """The tables of every supported release, not only the installed one: the first GPU run
    (torch 2.11) failed all five tables of torch 2.13."""
    recorded = json.loads(path.read_text())
    registered = set(recorded["keys"][key])
    ours = set(tables_for(release_of(recorded["torch"]))[table])
    assert _table_drift(table, ours, registered, f"for {key} by torch {recorded['torch']}") == []


def test_private_use1_has_no_torch_lists() -> None:
    # ampcore's own resident kernels land there once a PrivateUse1 backend was routed in this
    # process (an earlier test may have registered one): torch's are what must be absent
    ours = registered_overloads("AutocastPrivateUse1")
    assert _registrations("AutocastPrivateUse1") - ours == set()
    assert dispatch_key_of("npu") == "AutocastPrivateUse1"
    assert table_name_of("npu") == "generic"


def test_each_op_has_one_native_policy_per_table() -> None:
    for table in NATIVE_TABLES.values():
        by_base: dict[str, set[str]] = {}
        for overload, policy in table.items():
            by_base.setdefault(overload.partition(".")[0], set()).add(policy)
        assert {b: p for b, p in by_base.items() if len(p) > 1} == {}


# Real behaviour of a sample of the CPU table under torch.autocast, as data:
# (op, make inputs, expected output dtype given float32 inputs).
def _mat() -> torch.Tensor:
    return torch.randn(4, 4)


NATIVE_CPU_BEHAVIOUR = [
    ("mm", lambda: torch.mm(_mat(), _mat()), torch.bfloat16),
    ("linear", lambda: torch.nn.functional.linear(_mat(), _mat()), torch.bfloat16),
    ("mse_loss", lambda: torch.nn.functional.mse_loss(_mat().bfloat16(), _mat().bfloat16()), torch.float32),
    ("cat", lambda: torch.cat([_mat(), _mat().bfloat16()]), torch.float32),
    ("add", lambda: _mat() + _mat(), torch.float32),
]


@pytest.mark.parametrize(("op", "run", "expected"), NATIVE_CPU_BEHAVIOUR)
def test_cpu_table_agrees_with_torch_autocast(op: str, run, expected: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    lists = ampcore.oplists("cpu", dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert run().dtype == expected
    category = {torch.bfloat16: "white", torch.float32: "black"}[expected] if op != "cat" else "promote"
    assert lists.category(op) == (category if op != "add" else "follow-inputs")


CATEGORIES = [
    # (device, dtype, level, custom white, custom black, op, expected category)
    ("cpu", None, "O1", None, None, "mm", "white"),
    ("cpu", None, "O1", None, None, "cat", "promote"),
    ("cpu", None, "O1", None, None, "softmax", "follow-inputs"),
    ("cpu", None, "O1", {"elementwise_add"}, None, "add", "white"),
    ("cpu", None, "O1", None, {"linear"}, "linear", "black"),
    ("cpu", None, "O1", {"mse_loss"}, None, "mse_loss", "white"),  # custom white leaves black
    ("cpu", None, "O1", None, {"cat"}, "cat", "black"),  # custom black leaves promote
    ("cpu", None, "OD", None, None, "mm", "white"),
    ("cpu", None, "OD", None, None, "cat", "black"),
    ("cpu", None, "OD", None, None, "relu", "float32"),
    ("cpu", None, "O2", None, None, "cat", "white"),
    ("cpu", None, "O2", None, None, "relu", "low-precision"),
    ("cpu", None, "O2", None, None, "mse_loss", "black"),
    ("cpu", None, "O0", None, None, "mm", "autocast-off"),
    ("cuda", torch.float16, "O1", None, None, "softmax", "black"),
    ("cuda", torch.float16, "O1", None, None, "binary_cross_entropy", "banned"),
    ("cuda", torch.float16, "O1", {"binary_cross_entropy"}, None, "binary_cross_entropy", "white"),
    ("cuda", torch.float16, "O1", None, None, "addcmul", "promote"),
]


@pytest.mark.parametrize(("device", "dtype", "level", "white", "black", "op", "expected"), CATEGORIES)
def test_effective_categories(device, dtype, level, white, black, op, expected) -> None:  # type: ignore[no-untyped-def]
    lists = ampcore.oplists(device, dtype=dtype, level=level, custom_white_list=white, custom_black_list=black)
    assert lists.category(op) == expected


def test_fp32_with_dtype_is_part_of_black() -> None:
    lists = ampcore.oplists("cuda", dtype=torch.float16)
    assert {"softmax", "sum", "norm"} <= lists.fp32_with_dtype <= lists.black
    assert lists.action("softmax.int") == "fp32_set_opt_dtype"
    assert lists.action("norm.Scalar") == "fp32_append_dtype"
    # black-listing keeps the output-dtype policy of an op that has one natively
    black = ampcore.oplists("cuda", dtype=torch.float16, custom_black_list={"softmax", "add"})
    assert black.action("softmax.int") == "fp32_set_opt_dtype"
    assert black.action("add.Tensor") == "fp32"


def test_lists_are_disjoint_and_native_flag() -> None:
    for level in ("OD", "O1", "O2"):
        lists = ampcore.oplists("cpu", level=level, custom_white_list={"add"}, custom_black_list={"mm"})
        assert not lists.white & lists.black
        assert not lists.white & lists.promote
        assert not lists.black & lists.promote
    assert ampcore.oplists("cpu").is_native
    assert not ampcore.oplists("cpu", custom_white_list={"add"}).is_native
    assert not ampcore.oplists("cpu", level="OD").is_native


def test_overlap_and_bad_arguments_raise() -> None:
    with pytest.raises(AmpcoreError, match=r"\['add'\] in both lists"):
        ampcore.oplists("cpu", custom_white_list={"add"}, custom_black_list={"elementwise_add"})
    with pytest.raises(AmpcoreError, match="unknown op 'linaer'; did you mean 'linear'"):
        ampcore.oplists("cpu", custom_black_list={"linaer"})
    with pytest.raises(AmpcoreError, match="invalid level"):
        ampcore.oplists("cpu", level="O3")
    with pytest.raises(AmpcoreError, match="does not support"):
        ampcore.oplists("cpu", dtype=torch.float64)


def test_as_dict_is_json() -> None:
    data = ampcore.oplists("cpu", custom_white_list={"add"}).as_dict()
    assert json.loads(json.dumps(data))["custom_white"] == ["add"]
    assert data["overloads"]["add.Tensor"] == "low"
    assert data["dispatch_key"] == "AutocastCPU"


class _AdjustingAdapter:
    """A CPU-driving backend whose adapter adjusts the lists for bf16 only."""

    AMPCORE_CONTRACT = 2

    def __init__(self, adjustments: dict[str, list[str]]) -> None:
        self.adjustments = adjustments

    @ampcore.hookimpl
    def ampcore_backend(self) -> ampcore.BackendSpec:
        return ampcore.BackendSpec(name="adjcpu", device_type="cpu", dtypes=[torch.bfloat16, torch.float16])

    @ampcore.hookimpl
    def ampcore_op_list_adjustments(self, dtype: torch.dtype) -> dict[str, list[str]] | None:
        return self.adjustments if dtype == torch.bfloat16 else None


@pytest.fixture
def adjusting() -> Iterator[_AdjustingAdapter]:
    adapter = _AdjustingAdapter({"black": ["mm"], "white": ["elementwise_add"], "promote": ["mul"]})
    ampcore.register_plugin(adapter, name="adjcpu")
    try:
        yield adapter
    finally:
        ampcore.unregister_plugin("adjcpu")


def test_adapter_adjustments_apply_per_dtype(adjusting: _AdjustingAdapter) -> None:
    lists = ampcore.oplists("adjcpu", dtype=torch.bfloat16)
    assert (lists.category("mm"), lists.category("add"), lists.category("mul")) == ("black", "white", "promote")
    assert not lists.is_native
    assert lists.adjustments == {"black": {"mm"}, "white": {"add"}, "promote": {"mul"}}
    # user lists still apply on top
    assert ampcore.oplists("adjcpu", custom_white_list={"mm"}).category("mm") == "white"
    fp16 = ampcore.oplists("adjcpu", dtype=torch.float16)
    assert fp16.category("mm") == "white" and fp16.is_native


def test_broken_adjustments_raise_plugin_errors() -> None:
    # validated once, when the plugin is registered (issue 12): nothing is left registered
    for bad, words in [
        ({"black": ["nosuchop"]}, "unknown op 'nosuchop'"),
        ({"black": ["mm"], "white": ["mm"]}, "both"),
    ]:
        with pytest.raises(PluginError, match=words):
            ampcore.register_plugin(_AdjustingAdapter(bad), name="adjcpu")
        assert "adjcpu" not in {p.name for p in ampcore.list_plugins()}


def test_every_listed_overload_is_castable() -> None:
    for device in ("cpu", "cuda"):
        lists = ampcore.oplists(device, level="O2")
        for overload in lists.overloads:
            base = overload.partition(".")[0]
            assert overload in functional_overloads(base) or overload in native_table(device)


def test_generated_tables_in_docs_are_up_to_date() -> None:
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "docs" / "gen_oplists.py"
    spec = importlib.util.spec_from_file_location("gen_oplists", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if TORCH_RELEASE != module.RELEASE:  # torch's own lists differ between releases (TABLE_CHANGES)
        pytest.skip(f"docs/levels.md shows torch {module.RELEASE}'s lists; this is torch {torch.__version__}")
    text = module.DOC.read_text()
    assert module.generate() in text, "docs/levels.md is stale: run python docs/gen_oplists.py"
