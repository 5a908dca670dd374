"""The error contract of the public API, property-based (issue 12).

For every public call, over a space of valid and invalid arguments: the call succeeds, or
raises an :class:`ampcore.AmpcoreError` (or a documented subclass) whose message names the
offending argument and says what is valid; either way the thread's autocast state, the
scaler's state and the parameters are what they were before.  Example counts are small so
the whole file runs in seconds; failures print the arguments hypothesis found.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ampcore
import ampcore.debugging as dbg
from ampcore._policy.thread_state import current_region

pytestmark = pytest.mark.filterwarnings("ignore::ampcore.AmpcoreWarning", "ignore::UserWarning")

#: 40 examples per test keeps the file near 20 s; AMPCORE_CONTRACT_EXAMPLES=500 searches harder.
FAST = settings(
    max_examples=int(os.environ.get("AMPCORE_CONTRACT_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: Words by which a message says what is valid.
VALID_WORDS = (
    "expected",
    "valid",
    "did you mean",
    "supported",
    "must",
    "one of",
    "known",
    "choose",
    "use ",
    "within",
    "remove ",
    "need",
    "instead",
    "pass ",
)


@contextmanager
def _contract(given_args: dict[str, Any], *, state: Callable[[], Any] | None = None) -> Iterator[None]:
    """Run a call: success, or an AmpcoreError naming one of ``given_args`` and what is
    valid; the autocast state (and ``state()``) unchanged in both cases for failures."""
    before_autocast = _autocast_state()
    before = state() if state is not None else None
    try:
        yield
    except ampcore.AmpcoreError as exc:
        message = str(exc)
        assert any(name in message for name in given_args), f"{message!r} names none of {sorted(given_args)}"
        assert any(word in message.lower() for word in VALID_WORDS), f"{message!r} says nothing about what is valid"
        if state is not None:
            assert _same(state(), before), f"state changed by a refused call: {message}"
    except Exception as exc:  # noqa: BLE001 - the contract is exactly that nothing else escapes
        pytest.fail(f"{type(exc).__name__} escaped instead of an AmpcoreError: {exc!r} for {given_args!r}")
    assert _autocast_state() == before_autocast


def _autocast_state() -> tuple[Any, ...]:
    return (
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        torch.is_autocast_cache_enabled(),
        current_region(),
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=False))
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _kwargs(space: dict[str, list[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Each parameter left out or drawn from its values (valid ones and junk)."""
    return st.fixed_dictionaries({}, optional={name: st.sampled_from(values) for name, values in space.items()})


OPS = [
    "add",
    "mm",
    "linear",
    "softmax",
    "elementwise_add",
    "ADD",
    "linaer",
    "add.Tensor",
    "add.bogus",
    "add_",
    "aten::mm",
    5,
    "",
]
OP_LISTS = [None, set(), {"add"}, {"mm", "softmax"}, ["linear"], "add", *({op} for op in OPS), 5, [5], {"add": 1}]
DTYPES = [None, torch.bfloat16, torch.float16, torch.float32, torch.int8, "bf16", "float16", "fp8", "bfloat", 16]
DEVICES = [None, "cpu", "cpu:0", "cpu:x", "cpux", "CPU", "cpu:99", torch.device("cpu"), 5, ""]
LEVELS = ["O0", "OD", "O1", "O2", "o1", "O3", "", 1, None]

AUTOCAST_SPACE = {
    "device": DEVICES,
    "dtype": DTYPES,
    "level": LEVELS,
    "enabled": [True, False, "yes", 1, None],
    "cache_enabled": [None, True, False, "yes", 0],
    "custom_white_list": OP_LISTS,
    "custom_black_list": OP_LISTS,
}


@pytest.mark.cuda_runtime  # device=None is cuda where a GPU is reported: torch.autocast("cuda") runs
@FAST
@given(kwargs=_kwargs(AUTOCAST_SPACE))
def test_autocast(kwargs: dict[str, Any]) -> None:
    with _contract(kwargs):
        region = ampcore.autocast(**kwargs)
        with region:
            torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        with region:  # a region object can be entered again
            pass


@FAST
@given(kwargs=_kwargs({k: v for k, v in AUTOCAST_SPACE.items() if k not in ("enabled", "cache_enabled")}))
def test_oplists(kwargs: dict[str, Any]) -> None:
    with _contract(kwargs):
        lists = ampcore.oplists(**kwargs)
        for op in ("mm", "add.Tensor"):
            lists.category(op)


@FAST
@given(op=st.sampled_from([*OPS, None, "exp.defualt", "aten::softmax.int", "mm.default"]))
def test_oplists_category(op: Any) -> None:
    lists = ampcore.oplists("cpu")
    with _contract({"category": op}):
        assert lists.category(op) in ("white", "black", "promote", "banned", lists.unlisted)


POSITIVE = [2.0**16, 1.0, 0.5, 0.0, -1.0, float("nan"), float("inf"), "2", None, True, 3, torch.tensor(2.0)]
SCALER_SPACE = {
    "device": DEVICES,
    "dtype": DTYPES,
    "init_scale": POSITIVE,
    "growth_factor": [2.0, 1.0, 0.5, 1.5, float("nan"), "2", True],
    "backoff_factor": [0.5, 1.0, 0.0, 1.5, -0.5, float("nan"), True],
    "growth_interval": [2000, 1, 0, -3, 2.5, "10", True],
    "hysteresis": [1, 2, 0, -1, 1.5, True],
    "min_scale": [None, 1.0, 0.0, -1.0, 2.0**30, float("nan"), "1"],
    "max_scale": [None, 2.0**24, 1.0, 0.5, float("inf"), float("nan")],
    "dynamic": [True, False, "no", 0],
    "enabled": [None, True, False, "yes"],
    "raise_at_min_scale": [False, True, 1],
    "sync_found_inf": [True, False, None],
    "init_loss_scaling": [1024.0, -1.0],
    "incr_ratio": [2.0, 0.5],
}


@FAST
@given(kwargs=_kwargs(SCALER_SPACE))
def test_grad_scaler_construction(kwargs: dict[str, Any]) -> None:
    with _contract(kwargs):
        scaler = ampcore.GradScaler(**kwargs)
        state = scaler.state_dict()
        ampcore.GradScaler(**kwargs).load_state_dict(state)  # its own state always loads


def _trained_scaler() -> tuple[ampcore.GradScaler, torch.nn.Linear, torch.optim.Optimizer]:
    scaler = ampcore.GradScaler("cpu", enabled=True, init_scale=256.0, min_scale=1.0, max_scale=2.0**20)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return scaler, model, opt


SCALER_CALLS = [
    (
        "update",
        "new_scale",
        [
            8.0,
            0.0,
            -1.0,
            float("nan"),
            2.0**40,
            "8",
            True,
            torch.tensor([1.0, 2.0]),
            torch.tensor(4, dtype=torch.int32),
        ],
    ),
    ("set_growth_factor", "new_factor", [3.0, 1.0, 0.5, float("nan"), "3", None]),
    ("set_backoff_factor", "new_factor", [0.25, 1.0, 0.0, 2.0, None]),
    ("set_growth_interval", "new_interval", [10, 0, -1, 2.5, None, True]),
    ("set_hysteresis", "new_hysteresis", [2, 0, -1, 1.5, None]),
    (
        "load_state_dict",
        "state_dict",
        [{}, {"scale": 8.0}, {"scale": "8"}, None, [], "garbage", {"scale": float("nan"), "growth_factor": 2.0}],
    ),
    ("step", "optimizer", [torch.nn.Linear(2, 2), None, "sgd", [torch.nn.Parameter(torch.ones(1))]]),
    ("unscale_", "optimizer", [torch.nn.Linear(2, 2), None, 5]),
    ("scale", "outputs", [torch.ones(2), [torch.ones(1)], {"a": torch.ones(1)}, None, 5, "loss"]),
]


@FAST
@given(data=st.data(), call=st.sampled_from(SCALER_CALLS))
def test_grad_scaler_methods(data: st.DataObject, call: tuple[str, str, list[Any]]) -> None:
    method, param, values = call
    value = data.draw(st.sampled_from(values), label=param)
    scaler, model, opt = _trained_scaler()
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(opt)

    def state() -> Any:
        return (scaler.state_dict(), [p.detach().clone() for p in model.parameters()])

    with _contract({param: value, method: None}, state=state):
        result = getattr(scaler, method)(value)
        if method == "update" and isinstance(value, torch.Tensor):
            assert math.isfinite(scaler.get_scale()) and scaler.get_scale() > 0
        if method == "scale":
            assert result is not None
        return
    scaler.update()  # after a refused call the iteration goes on normally


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))


DECORATE_SPACE = {
    "level": LEVELS,
    "dtype": DTYPES,
    "device": DEVICES,
    "master_weight": [True, False, "yes", None],
    "keep_norm_fp32": [None, True, False, "yes"],
    "excluded_layers": [None, torch.nn.LayerNorm, [torch.nn.Linear], "LayerNorm", 5, [torch.nn.Linear(1, 1)]],
    "save_dtype": [None, torch.float32, "bf16", torch.int8, "fp8"],
    "master_grad": [False, True, "no"],
}


@FAST
@given(kwargs=_kwargs(DECORATE_SPACE), with_optimizer=st.booleans())
def test_decorate(kwargs: dict[str, Any], with_optimizer: bool) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if with_optimizer else None

    def state() -> Any:
        groups = [] if opt is None else [list(g["params"]) for g in opt.param_groups]
        return ([p.detach().clone() for p in model.parameters()], [id(p) for g in groups for p in g])

    with _contract(kwargs, state=state):
        ampcore.decorate(model, opt, **kwargs)


@FAST
@given(
    models=st.sampled_from(
        [torch.nn.Linear(2, 2), [torch.nn.Linear(2, 2)], [], None, "model", [torch.nn.Linear(2, 2), 5]]
    ),
    optimizers=st.sampled_from([None, "opt", 5, [], [None]]),
)
def test_decorate_models_and_optimizers(models: Any, optimizers: Any) -> None:
    with _contract({"models": models, "optimizers": optimizers}):
        ampcore.decorate(models, optimizers, device="cpu")


@FAST
@given(kwargs=_kwargs({"cast_inputs": DTYPES, "device": DEVICES}))
def test_custom_fwd(kwargs: dict[str, Any]) -> None:
    with _contract(kwargs):
        ampcore.custom_fwd(lambda ctx, x: x, **kwargs)


@FAST
@given(
    kwargs=_kwargs(
        {
            "ops": [None, ["exp"], ["exp.defualt"], ["EXP"], "exp", [5], ["add.Tensor"], ["aten::mm"]],
            "skip_ops": [None, ["masked_fill"], ["masked_fil"], {"add.bogus"}],
            "raise_on_error": [True, False, "yes"],
            "check_fp16_range": [False, True, 1],
        }
    )
)
def test_check_numerics(kwargs: dict[str, Any]) -> None:
    with _contract(kwargs), dbg.check_numerics(**kwargs):
        torch.exp(torch.ones(2))


@FAST
@given(
    kwargs=_kwargs(
        {
            "level": LEVELS,
            "dtype": DTYPES,
            "device": DEVICES,
            "per_op": [False, True, "yes"],
            "threshold": [0.1, 0.0, -1.0, float("nan"), "0.1", None, 10**400, float("inf"), 2**63],
        }
    )
)
def test_compare_accuracy(kwargs: dict[str, Any]) -> None:
    model = _model().eval()
    x = torch.randn(2, 4)
    before = x.clone()

    def state() -> Any:
        return [p.detach().clone() for p in model.parameters()]

    with _contract(kwargs, state=state):
        dbg.compare_accuracy(model, x, **kwargs)
    assert torch.equal(x, before)


@FAST
@given(
    plugin=st.sampled_from([None, 5, "cpu", object(), [], ampcore]),
    name=st.sampled_from([None, "robust-probe", 5, "", "cpu"]),
)
def test_register_plugin(plugin: Any, name: Any) -> None:
    before = [(p.name, p.status) for p in ampcore.list_plugins()]
    given_args = {"register_plugin": None, "plugin": plugin, "name": name, "hook": None}
    try:
        with _contract(given_args):
            backend = ampcore.register_plugin(plugin, name=name)
            ampcore.unregister_plugin(backend.plugin_name)
    finally:
        assert [(p.name, p.status) for p in ampcore.list_plugins()] == before


@FAST
@given(device=st.sampled_from([*DEVICES, "cuda", "npu:3", "tpu"]))
def test_device_queries(device: Any) -> None:
    for query in (ampcore.get_backend, ampcore.is_bfloat16_supported, ampcore.is_float16_supported):
        with _contract({"device": device}):
            query(device)


def test_contract_helper_catches_escaping_errors() -> None:
    with pytest.raises(pytest.fail.Exception, match="TypeError escaped"), _contract({"x": 1}):
        raise TypeError("bare")
    with pytest.raises(AssertionError, match="names none of"), _contract({"param_q": 1}):
        raise ampcore.AmpcoreError("something expected")


# -- issue 28: extreme numbers, non-ASCII digits, wrong types, damaged files, plugin hooks

#: Numbers beyond what a float, a float32 or an int32 holds, non-finite ones, and non-numbers.
EXTREME_NUMBERS = st.one_of(
    st.sampled_from([10**20, 10**30, 10**400, -(10**400), 2**31, 2**31 - 1, 2**63, 1e39, 1e-320, -0.0]),
    st.sampled_from(
        [float("nan"), float("inf"), float("-inf"), Decimal("2"), Fraction(3, 2), 1j, b"2", "2", [2.0], None, True]
    ),
    st.integers(min_value=-(10**450), max_value=10**450),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALER_NUMBERS = (
    "init_scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "hysteresis",
    "min_scale",
    "max_scale",
)


def _train_steps(scaler: ampcore.GradScaler, steps: int = 2) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        scaler.scale(model(torch.ones(1, 2)).sum()).backward()
        scaler.step(opt)
        scaler.update()  # an OverflowError here used to leave the scaler stuck


@FAST
@given(
    name=st.sampled_from(SCALER_NUMBERS), value=EXTREME_NUMBERS, dtype=st.sampled_from([torch.float16, torch.bfloat16])
)
def test_grad_scaler_extreme_numbers(name: str, value: Any, dtype: torch.dtype) -> None:
    with _contract({name: value}):
        scaler = ampcore.GradScaler("cpu", dtype=dtype, enabled=True, **{name: value})
        _train_steps(scaler)
        state = scaler.state_dict()
        ampcore.GradScaler("cpu", dtype=dtype, enabled=True, **{name: value}).load_state_dict(state)


@FAST
@given(key=st.sampled_from(["scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker",
                            "hysteresis", "_overflow_tracker", "min_scale", "max_scale"]),
       value=EXTREME_NUMBERS)  # fmt: skip
def test_grad_scaler_state_dict_extreme_numbers(key: str, value: Any) -> None:
    scaler = ampcore.GradScaler("cpu", enabled=True)
    state = scaler.state_dict()
    with _contract({key: value}, state=scaler.state_dict):
        scaler.load_state_dict({**state, key: value})
    _train_steps(scaler, 1)  # never stuck, whatever was refused


@FAST
@given(method=st.sampled_from(["set_growth_factor", "set_backoff_factor", "set_growth_interval", "set_hysteresis",
                               "update"]),
       value=EXTREME_NUMBERS)  # fmt: skip
def test_grad_scaler_setters_extreme_numbers(method: str, value: Any) -> None:
    scaler = ampcore.GradScaler("cpu", enabled=True)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(opt)
    name = {"update": "new_scale", "set_growth_factor": "growth_factor", "set_backoff_factor": "backoff_factor",
            "set_growth_interval": "growth_interval", "set_hysteresis": "hysteresis"}[method]  # fmt: skip
    with _contract({name: value}, state=scaler.state_dict):
        getattr(scaler, method)(value)
    if method != "update" or scaler._records:  # noqa: SLF001 - a refused update keeps the iteration's records
        scaler.update()
    _train_steps(scaler, 1)


#: Device strings whose index is no ASCII integer: other scripts' digits, signs, spaces, junk.
ODD_INDICES = st.one_of(
    st.text(alphabet=st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=3),
    st.sampled_from(["-1", " 0", "0 ", "1.0", "+1", "0x1", "", "1e3", "\x00", "99999999999999999999999"]),
)


@FAST
@given(index=ODD_INDICES, query=st.sampled_from(["autocast", "GradScaler", "oplists", "get_backend", "auto_plan"]))
def test_device_strings_with_odd_indices(index: str, query: str) -> None:
    device = f"cpu:{index}"
    call = {"autocast": lambda: ampcore.autocast(device=device), "GradScaler": lambda: ampcore.GradScaler(device),
            "oplists": lambda: ampcore.oplists(device), "get_backend": lambda: ampcore.get_backend(device),
            "auto_plan": lambda: ampcore.auto_plan(device)}[query]  # fmt: skip
    with _contract({"device": device}):
        call()


@FAST
@given(
    data=st.one_of(
        st.binary(max_size=64),
        st.sampled_from([b"\xff\xfe[\x00s\x00", b"\xef\xbb\xbf[skip]\n", b"[" * 5000, b"x = " + b"[" * 3000,
                         b"\x00" * 8]),
        st.builds(lambda key, value: f"[tolerances]\n{key} = {value}\n".encode(),
                  st.sampled_from(["op_eps", "grad_rtol", "convergence_rtol", "bogus"]),
                  st.sampled_from(["nan", "inf", "-inf", "0", "-1", '"1"', "true", "[1]", "1e400", "1" + "0" * 400,
                                   "0.5"])),
        st.builds(lambda value: json.dumps({"tolerances": {"op_eps": value}}).encode(), EXTREME_NUMBERS.filter(
            lambda v: isinstance(v, (int, float, str, list, bool)) or v is None)),
    ),
    suffix=st.sampled_from([".toml", ".json"]),
)  # fmt: skip
def test_conformance_manifest_files(data: bytes, suffix: str) -> None:
    from ampcore_conformance._manifest import ManifestError, load_manifest

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"manifest{suffix}"
        path.write_bytes(data)
        try:
            manifest = load_manifest(path)
        except ManifestError as exc:
            assert str(path) in str(exc), exc
            return
        except Exception as exc:  # noqa: BLE001 - the contract
            pytest.fail(f"{type(exc).__name__} escaped instead of a ManifestError: {exc!r}")
        for value in vars(manifest.tolerances).values():
            assert isinstance(value, float) and math.isfinite(value) and value > 0


#: What a misbehaving adapter's hooks return instead of what the contract says.
HOOK_RETURNS = st.sampled_from([None, -1, 10**30, float("nan"), "two", b"2", [1], {"a": 1}, object(), True, 2.5])


@FAST
@given(hook=st.sampled_from(["ampcore_device_count", "ampcore_check_capability", "ampcore_op_list_adjustments",
                             "ampcore_device_name"]), value=HOOK_RETURNS)  # fmt: skip
def test_misbehaving_plugin_hooks(hook: str, value: Any) -> None:
    from conftest import make_adapter

    adapter = make_adapter("contractprobe", **{hook: (lambda: value)})
    try:
        with _contract({"contractprobe": None, hook: None}):
            backend = ampcore.register_plugin(adapter, name="contractprobe")
            backend.device_count(), backend.device_name(0), backend.capability_issues(torch.bfloat16)
            ampcore.oplists("contractprobe")
    finally:
        if "contractprobe" in {p.name for p in ampcore.list_plugins()}:
            ampcore.unregister_plugin("contractprobe")


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(delay=st.sampled_from([0.0, 0.01, 3.0]), answer=st.sampled_from([None, "no device here"]))
def test_slow_availability_probes_are_bounded(delay: float, answer: str | None) -> None:
    """A plugin's ``ampcore_unavailable_reason()`` that answers late is waited for at most
    ``AMPCORE_PLUGIN_IMPORT_TIMEOUT`` (0.5 s here): its answer when in time, else an
    unavailable backend naming the time waited; never a hang, never a traceback."""
    from conftest import make_adapter

    release = threading.Event()

    def probe() -> str | None:
        release.wait(delay)
        return answer

    old = os.environ.get("AMPCORE_PLUGIN_IMPORT_TIMEOUT")
    os.environ["AMPCORE_PLUGIN_IMPORT_TIMEOUT"] = "0.5"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ampcore.PluginWarning)
            backend = ampcore.register_plugin(
                make_adapter("slowprobe", ampcore_unavailable_reason=probe), name="slowprobe"
            )
            started = time.monotonic()
            reason = backend.unavailable_reason
        assert time.monotonic() - started < 2.5
        if delay < 0.5:
            assert reason == answer
        else:
            assert reason is not None and "did not finish within 0.5 s" in reason
    finally:
        release.set()
        if old is None:
            del os.environ["AMPCORE_PLUGIN_IMPORT_TIMEOUT"]
        else:
            os.environ["AMPCORE_PLUGIN_IMPORT_TIMEOUT"] = old
        if "slowprobe" in {p.name for p in ampcore.list_plugins()}:
            ampcore.unregister_plugin("slowprobe")
