"""ampcore.autocast at levels O0 and O1: dtypes, nesting, threads, decorators, bad input."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from conftest import make_adapter, simulate_cuda
from torch import nn

import ampcore
from ampcore._policy.thread_state import current_region

X = torch.randn(4, 8)
W = torch.randn(8, 8)
IMG = torch.randn(1, 3, 8, 8)
KERNEL = torch.randn(4, 3, 3, 3)

# (op, call, expected output dtype under O1 given the autocast dtype "low"), from torch's
# native CPU autocast lists: lower_precision_fp ops give "low", fp32 ops give float32, the
# rest follow their (float32) inputs.
CPU_O1_EXPECTATIONS: list[tuple[str, Callable[[], torch.Tensor], str]] = [
    ("mm", lambda: torch.mm(X, W), "low"),
    ("matmul", lambda: X @ W, "low"),
    ("linear", lambda: F.linear(X, W), "low"),
    ("conv2d", lambda: F.conv2d(IMG, KERNEL), "low"),
    ("bmm", lambda: torch.bmm(X[None], W[None]), "low"),
    ("mse_loss", lambda: F.mse_loss(X, X + 1), "fp32"),
    ("cross_entropy", lambda: F.cross_entropy(X, torch.zeros(4, dtype=torch.long)), "fp32"),
    ("softmax", lambda: F.softmax(X, -1), "fp32"),
    ("add", lambda: X + X, "fp32"),
    ("layer_norm", lambda: F.layer_norm(X, (8,)), "fp32"),
]


def _expected(kind: str, low: torch.dtype) -> torch.dtype:
    return low if kind == "low" else torch.float32


@pytest.mark.usefixtures("no_emulation_warning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("op", "call", "kind"), CPU_O1_EXPECTATIONS, ids=[e[0] for e in CPU_O1_EXPECTATIONS])
def test_o1_output_dtypes_on_cpu(dtype: torch.dtype, op: str, call: Callable[[], torch.Tensor], kind: str) -> None:
    with ampcore.autocast(device="cpu", dtype=dtype):
        got = call().dtype
    with torch.autocast("cpu", dtype=dtype):
        native = call().dtype
    assert got == _expected(kind, dtype) == native


def test_default_dtype_is_the_backends_default() -> None:
    region = ampcore.autocast(device="cpu")
    assert region.dtype == torch.bfloat16
    with region:
        assert torch.mm(X, W).dtype == torch.bfloat16


@pytest.mark.parametrize("call", [c for _, c, _ in CPU_O1_EXPECTATIONS])
def test_o0_leaves_everything_fp32(call: Callable[[], torch.Tensor]) -> None:
    with ampcore.autocast(device="cpu", level="O0"):
        assert not torch.is_autocast_enabled("cpu")
        assert call().dtype == torch.float32


def test_o0_inside_o1_turns_autocast_off_and_back_on() -> None:
    with ampcore.autocast(device="cpu"):
        with ampcore.autocast(device="cpu", level="o0"):
            assert torch.mm(X, W).dtype == torch.float32
        assert torch.mm(X, W).dtype == torch.bfloat16


@pytest.mark.usefixtures("no_emulation_warning")
def test_nesting_changes_dtype_and_restores_it() -> None:
    with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
        with ampcore.autocast(device="cpu", dtype=torch.float16):
            assert torch.mm(X, W).dtype == torch.float16
            assert current_region().dtype == torch.float16  # type: ignore[union-attr]
        assert torch.mm(X, W).dtype == torch.bfloat16
        assert current_region().dtype == torch.bfloat16  # type: ignore[union-attr]
    assert not torch.is_autocast_enabled("cpu") and current_region() is None


def test_disabled_subregion() -> None:
    with ampcore.autocast(device="cpu"):
        with ampcore.autocast(device="cpu", enabled=False):
            assert torch.mm(X, W).dtype == torch.float32
        assert torch.mm(X, W).dtype == torch.bfloat16


def test_state_is_restored_after_an_exception() -> None:
    with pytest.raises(ValueError, match="boom"):
        with ampcore.autocast(device="cpu"):
            with ampcore.autocast(device="cpu", enabled=False):
                raise ValueError("boom")
    assert not torch.is_autocast_enabled("cpu")
    assert current_region() is None
    assert torch.mm(X, W).dtype == torch.float32


def test_autocast_is_thread_local() -> None:
    seen: dict[str, torch.dtype] = {}
    inside = threading.Event()
    done = threading.Event()

    def other() -> None:
        inside.wait(5)
        seen["other"] = torch.mm(X, W).dtype
        seen["frame"] = current_region()  # type: ignore[assignment]
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with ampcore.autocast(device="cpu"):
        inside.set()
        done.wait(5)
        seen["main"] = torch.mm(X, W).dtype
    thread.join()
    assert seen == {"other": torch.float32, "frame": None, "main": torch.bfloat16}


def test_as_a_decorator_including_forward() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        @ampcore.autocast(device="cpu")
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    assert Net()(X).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


def test_decorator_forcing_a_submodule_to_fp32() -> None:
    class Sensitive(nn.Module):
        @ampcore.autocast(device="cpu", enabled=False)
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.mm(x.float(), W)

    with ampcore.autocast(device="cpu"):
        assert Sensitive()(X).dtype == torch.float32
        assert torch.mm(X, W).dtype == torch.bfloat16


def test_one_decorated_function_used_from_two_threads() -> None:
    barrier = threading.Barrier(2)
    results: list[torch.dtype] = []

    @ampcore.autocast(device="cpu")
    def work() -> None:
        barrier.wait(5)
        results.append(torch.mm(X, W).dtype)
        barrier.wait(5)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [torch.bfloat16, torch.bfloat16]
    assert not torch.is_autocast_enabled("cpu")


def test_gradients_flow_in_the_parameter_dtype() -> None:
    layer = nn.Linear(8, 8)
    with ampcore.autocast(device="cpu"):
        loss = layer(X).float().pow(2).mean()
    loss.backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32


def test_cache_enabled_is_passed_to_torch() -> None:
    with ampcore.autocast(device="cpu", cache_enabled=False):
        assert not torch.is_autocast_cache_enabled()
    assert torch.is_autocast_cache_enabled()


def test_torch_device_and_index() -> None:
    with ampcore.autocast(device=torch.device("cpu")):
        assert torch.mm(X, W).dtype == torch.bfloat16
    with ampcore.autocast(device="cpu:0"):
        assert torch.mm(X, W).dtype == torch.bfloat16


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", [False, True], ids=["no-gpu", "gpu"])
def test_unknown_device_lists_known_backends(monkeypatch: pytest.MonkeyPatch, gpu: bool) -> None:
    simulate_cuda(monkeypatch, present=gpu)
    cuda = "cuda \\(available\\)" if gpu else "cuda \\(unavailable: "
    with pytest.raises(ampcore.AmpcoreError, match=f"unknown backend 'tpu9'.*cpu \\(available\\).*{cuda}"):
        ampcore.autocast(device="tpu9")


def test_unsupported_dtype_lists_supported_dtypes() -> None:
    with pytest.raises(
        ampcore.AmpcoreError, match="does not support torch.float64; supported dtypes: torch.bfloat16, torch.float16"
    ):
        ampcore.autocast(device="cpu", dtype=torch.float64)


def test_unavailable_backend_gives_the_reason(cuda_absent: ampcore.Backend) -> None:
    # a CPU-only build says it has no CUDA; a CUDA build on a machine without a GPU says so too
    reason = (
        "this torch build .* has no CUDA support"
        if torch.version.cuda is None
        else r"torch.cuda.is_available\(\) is False"
    )
    with pytest.raises(ampcore.BackendUnavailableError, match=f'backend "cuda".*unavailable: {reason}'):
        ampcore.autocast(device="cuda")


def test_too_many_positional_arguments_raise_an_ampcore_error() -> None:
    before = torch.is_autocast_enabled("cpu")
    with pytest.raises(ampcore.AmpcoreError, match="at most 7 positional arguments.*got 8"):
        ampcore.autocast("cpu", None, "O1", True, None, None, None, "extra")
    assert torch.is_autocast_enabled("cpu") == before


@pytest.mark.parametrize("level", ["O3", "fp16", 1, None])
def test_invalid_level_lists_valid_levels(level: object) -> None:
    with pytest.raises(ampcore.AmpcoreError, match="invalid level; valid levels: O0, OD, O1, O2"):
        ampcore.autocast(device="cpu", level=level)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"enabled": "yes"}, "enabled="), ({"dtype": "bf17"}, "dtype"), ({"dtype": 16}, "dtype")]
)
def test_wrong_argument_types(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=match):
        ampcore.autocast(device="cpu", **kwargs)  # type: ignore[arg-type]


def test_refuses_to_run_fp32_when_torch_silently_disables_autocast(register) -> None:
    # an adapter that (wrongly) declares float64: torch's CPU autocast disables itself with
    # only a warning; ampcore must raise instead, and leave autocast off.
    register(make_adapter("liar", dtypes=(torch.float64,)), name="liar")
    region = ampcore.autocast(device="liar")
    with pytest.warns(UserWarning, match="not supported"):
        with pytest.raises(ampcore.AmpcoreError, match="refusing to run in float32 silently"):
            with region:
                pass
    assert not torch.is_autocast_enabled("cpu") and current_region() is None


def test_capability_error_prevents_entering(register) -> None:
    check = lambda dtype: [ampcore.CapabilityIssue("error", "no native bf16 on this chip")]  # noqa: E731
    register(make_adapter("old", ampcore_check_capability=check), name="old")
    with pytest.raises(ampcore.AmpcoreError, match="no native bf16 on this chip"):
        ampcore.autocast(device="old")
    # a disabled region does not need the capability
    with ampcore.autocast(device="old", enabled=False):
        assert not torch.is_autocast_enabled("cpu")
