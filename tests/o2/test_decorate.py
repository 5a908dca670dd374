"""``ampcore.decorate``: which tensors level O2 converts, forward casting, shapes, bad input."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import make_adapter
from torch import nn

import ampcore

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture(autouse=True)
def _quiet_emulation() -> Iterator[None]:
    with warnings.catch_warnings():  # fp16 on a CPU without avx512_fp16 "runs emulated"
        warnings.filterwarnings("ignore", ".*runs emulated", ampcore.AmpcoreWarning)
        yield


class Zoo(nn.Module):
    """One of each layer kind whose dtype O2 decides."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.linear = nn.Linear(8, 8)
        self.conv = nn.Conv1d(8, 8, 1)
        self.layer_norm = nn.LayerNorm(8)
        self.group_norm = nn.GroupNorm(2, 8)
        self.instance_norm = nn.InstanceNorm1d(8, affine=True)
        self.batch_norm = nn.BatchNorm1d(8)
        self.rms_norm = nn.RMSNorm(8)
        self.register_buffer("scale", torch.ones(8))
        self.register_buffer("count", torch.zeros(1, dtype=torch.long))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.linear(self.embed(tokens)) * self.scale  # (batch, length, 8)
        x = self.layer_norm(self.rms_norm(x))
        x = self.conv(x.transpose(1, 2))
        x = self.batch_norm(self.instance_norm(self.group_norm(x)))
        return x.float().mean()


def dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    return {name: t.dtype for name, t in (*model.named_parameters(), *model.named_buffers())}


def snapshot(*objects: nn.Module | torch.optim.Optimizer) -> list[object]:
    """Everything decorate could change, for 'nothing half-converted' checks."""
    out: list[object] = []
    for obj in objects:
        if isinstance(obj, nn.Module):
            out.append([(n, t.dtype, t.detach().clone()) for n, t in (*obj.named_parameters(), *obj.named_buffers())])
            out.append(len(obj._forward_pre_hooks))
        else:
            out.append([id(p) for g in obj.param_groups for p in g["params"]])
            out.append((type(obj.step), "step" in obj.__dict__))
    return out


def same(a: list[object], b: list[object]) -> bool:
    def norm(x: object) -> object:
        if isinstance(x, list):
            return [norm(i) for i in x]
        if isinstance(x, tuple):
            return tuple(norm(i) for i in x)
        if isinstance(x, torch.Tensor):
            return (x.dtype, x.tolist())
        return x

    return norm(a) == norm(b)


EXPECTED_BF16 = {"layer_norm": BF16, "group_norm": BF16, "instance_norm": BF16, "rms_norm": BF16}
EXPECTED_FP16 = {"layer_norm": FP32, "group_norm": FP32, "instance_norm": FP32, "rms_norm": FP32}


@pytest.mark.parametrize(("dtype", "norms"), [(BF16, EXPECTED_BF16), (FP16, EXPECTED_FP16)])
def test_o2_converts_all_but_batchnorm_and_dtype_dependent_norms(
    dtype: torch.dtype, norms: dict[str, torch.dtype]
) -> None:
    model = ampcore.decorate(Zoo(), level="O2", dtype=dtype, device="cpu")
    got = dtypes(model)
    for name, value in got.items():
        layer = name.split(".")[0]
        if name == "count":
            assert value == torch.long  # integer buffers are never touched
        elif layer == "batch_norm":
            assert value == (torch.long if name.endswith("num_batches_tracked") else FP32), name
        elif layer in norms:
            assert value == norms[layer], name
        elif name == "scale":
            assert value == FP32  # floating buffers keep their dtype (cast_buffers=False)
        else:
            assert value == dtype, name  # embedding, linear, conv


def test_cast_buffers_casts_the_floating_buffers_outside_kept_layers() -> None:
    model = ampcore.decorate(Zoo(), level="O2", dtype=BF16, device="cpu", cast_buffers=True)
    assert model.scale.dtype == BF16 and model.count.dtype == torch.long
    assert model.batch_norm.running_mean.dtype == FP32


@pytest.mark.parametrize(("dtype", "keep", "expected"), [(BF16, True, FP32), (FP16, False, FP16)])
def test_keep_norm_fp32_overrides_the_dtype_rule_but_batchnorm_stays_fp32(
    dtype: torch.dtype, keep: bool, expected: torch.dtype
) -> None:
    model = ampcore.decorate(Zoo(), dtype=dtype, device="cpu", keep_norm_fp32=keep)
    assert model.layer_norm.weight.dtype == model.group_norm.weight.dtype == expected
    assert model.rms_norm.weight.dtype == model.instance_norm.weight.dtype == expected
    assert model.batch_norm.weight.dtype == model.batch_norm.running_mean.dtype == FP32
    assert model.linear.weight.dtype == dtype


def test_excluded_layers_by_instance_and_type_stay_fp32_with_their_subtree() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), nn.Embedding(3, 4))
    ampcore.decorate(model, device="cpu", excluded_layers=[model[1], nn.Embedding])
    assert model[0].weight.dtype == BF16
    assert model[1][0].weight.dtype == model[1][1].weight.dtype == FP32
    assert model[2].weight.dtype == FP32


def test_shared_parameters_are_converted_once_and_stay_shared() -> None:
    embed, head = nn.Embedding(5, 4), nn.Linear(4, 5, bias=False)
    head.weight = embed.weight
    model = nn.Sequential(embed, head)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ampcore.decorate(model, opt, device="cpu")
    assert head.weight is embed.weight and embed.weight.dtype == BF16
    assert len(opt.param_groups[0]["params"]) == 1


def test_a_shared_parameter_kept_by_one_owner_stays_fp32() -> None:
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight
    model = nn.Sequential(first, second)
    ampcore.decorate(model, device="cpu", excluded_layers=second)
    assert first.weight.dtype == FP32 and first.bias.dtype == BF16 and second.bias.dtype == FP32


@pytest.mark.parametrize("level", ["O0", "OD", "O1", "o1"])
def test_levels_below_o2_return_the_arguments_unchanged(level: str) -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model, opt)
    out_model, out_opt = ampcore.decorate(model, opt, level=level, device="cpu")
    assert out_model is model and out_opt is opt and same(before, snapshot(model, opt))


def test_returns_the_shapes_it_was_given() -> None:
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    assert ampcore.decorate(nn.Linear(2, 2), device="cpu").weight.dtype == BF16
    models, opts = ampcore.decorate([a, b], (opt_a, opt_b), device="cpu")
    assert models == [a, b] and isinstance(models, list)
    assert opts == (opt_a, opt_b) and isinstance(opts, tuple)
    model, opt = ampcore.decorate(nn.Linear(2, 2), torch.optim.Adam(nn.Linear(1, 1).parameters()), level="O1")
    assert isinstance(opt, torch.optim.Adam)


def test_optimizer_keeps_object_and_type_and_holds_exact_fp32_masters() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    original = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, out = ampcore.decorate(model, opt, device="cpu")
    assert out is opt and type(opt) is torch.optim.SGD
    masters = opt.param_groups[0]["params"]
    assert [m.dtype for m in masters] == [FP32] * 4
    assert all(torch.equal(m, o) for m, o in zip(masters, original, strict=False))  # not rounded through bf16
    assert masters[0] is not model[0].weight and masters[2] is model[1].weight  # BN: no master
    assert torch.equal(model[0].weight, original[0].to(BF16))


def test_floating_inputs_are_cast_to_the_model_dtype() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    ampcore.decorate(model, device="cpu")
    out = model(torch.randn(3, 4))  # no autocast needed: the input arrives as bf16, and
    assert out.dtype == BF16  # BatchNorm (fp32 weights, fp32 compute) hands on bf16


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_batchnorm_running_statistics_update_under_autocast(level: str) -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    model = ampcore.decorate(copy.deepcopy(plain), device="cpu")
    x = torch.randn(16, 8)
    plain(x.to(BF16).float())
    with ampcore.autocast(device="cpu", level=level):  # O2 must not cast the running stats
        out = model(x)
    assert out.dtype == BF16 and model[1].running_mean.dtype == FP32
    assert model[1].num_batches_tracked.item() == 1
    torch.testing.assert_close(model[1].running_mean, plain[1].running_mean, rtol=0.05, atol=1e-3)
    assert model[1].running_mean.abs().sum() > 0


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_kept_layers_get_fp32_inputs_and_excluded_layers_run_without_autocast(level: str) -> None:
    seen: dict[str, torch.dtype] = {}

    def record(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            seen[name + ".in"], seen[name + ".out"] = args[0].dtype, output.dtype

        return hook

    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    for index, name in enumerate(["first", "norm", "next", "excluded", "last"]):
        model[index].register_forward_hook(record(name))
    ampcore.decorate(model, dtype=FP16, device="cpu", excluded_layers=model[3])
    with ampcore.autocast(device="cpu", dtype=FP16, level=level):
        out = model(torch.randn(3, 4))
    assert seen["first.out"] == FP16
    assert seen["norm.in"] == FP32  # LayerNorm, kept fp32 for fp16, computes in fp32...
    assert seen["next.in"] == FP16  # ...and hands fp16 on
    assert seen["excluded.in"] == FP32 and seen["excluded.out"] == FP32  # an fp32 island
    assert seen["last.out"] == FP16 and out.dtype == FP16  # autocast is back on after it
    assert torch.is_autocast_enabled("cpu") is False


def test_an_exception_inside_an_excluded_layer_restores_autocast() -> None:
    class Boom(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    model = nn.Sequential(nn.Linear(4, 4), Boom(4, 4))
    ampcore.decorate(model, device="cpu", excluded_layers=Boom)
    with ampcore.autocast(device="cpu"):
        with pytest.raises(ValueError, match="boom"):
            model(torch.randn(2, 4))
        assert torch.is_autocast_enabled("cpu")


# -- bad input: clear errors, nothing changed -------------------------------------------


def test_decorating_twice_raises_and_changes_nothing_more() -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ampcore.decorate(model, opt, device="cpu")
    before = snapshot(model, opt)
    with pytest.raises(ampcore.AmpcoreError, match=r"ampcore.decorate\(models\[0\]\).*already decorated"):
        ampcore.decorate(model, device="cpu")
    with pytest.raises(ampcore.AmpcoreError, match="already decorated"):
        ampcore.decorate(nn.Sequential(model), device="cpu")
    assert same(before, snapshot(model, opt))


def test_a_decorated_optimizer_cannot_be_decorated_again() -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ampcore.decorate(model, opt, device="cpu")
    with pytest.raises(ampcore.AmpcoreError, match="optimizer was already decorated"):
        ampcore.decorate(nn.Linear(2, 2), opt, device="cpu")


def test_an_optimizer_with_foreign_parameters_raises_and_changes_nothing() -> None:
    model, other = nn.Linear(4, 4), nn.Linear(3, 3)
    opt = torch.optim.SGD([*model.parameters(), *other.parameters()], lr=0.1)
    before = snapshot(model, other, opt)
    with pytest.raises(
        ampcore.AmpcoreError, match=r"optimizers\[0\] \(SGD\)\): 2 of its 4 parameters \(shapes \(3, 3\)"
    ):
        ampcore.decorate(model, opt, device="cpu")
    assert same(before, snapshot(model, other, opt))


def test_a_parameter_in_two_optimizers_raises() -> None:
    model = nn.Linear(4, 4)
    first, second = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.Adam([model.weight])
    before = snapshot(model, first, second)
    with pytest.raises(ampcore.AmpcoreError, match=r"also in optimizers\[0\]"):
        ampcore.decorate(model, [first, second], device="cpu")
    assert same(before, snapshot(model, first, second))


def test_a_wrapped_model_raises_and_explains_the_order(cuda_absent: ampcore.Backend) -> None:
    # DataParallel moves the module to the only GPU when there is one: built without one
    model = nn.DataParallel(nn.Linear(4, 4))
    with pytest.raises(ampcore.AmpcoreError, match=r"already wrapped in DataParallel. Decorate first, then wrap"):
        ampcore.decorate(model, device="cpu")
    assert model.module.weight.dtype == FP32


BAD_ARGUMENTS: list[tuple[dict[str, object], str]] = [
    ({"level": "O3"}, r"ampcore.decorate\(level='O3'\): invalid level; valid levels: O0, OD, O1, O2"),
    ({"dtype": torch.float64}, r"does not support torch.float64; supported dtypes: torch.bfloat16, torch.float16"),
    (
        {"dtype": "bfloat61"},
        r"dtype='bfloat61'\): unknown dtype name \(did you mean 'bfloat16'\?\)",
    ),  # names are accepted (issue 14)
    ({"save_dtype": torch.int32}, r"save_dtype=torch.int32\): not a floating dtype"),
    ({"keep_norm_fp32": "yes"}, r"keep_norm_fp32='yes'\): expected None, True or False"),
    ({"master_weight": 1}, r"master_weight=1\): expected True or False"),
    ({"master_grad": True, "optimizers": None}, r"master_grad=True\): float32 master gradients need"),
    ({"excluded_layers": nn.Linear(1, 1)}, r"excluded_layers=...\): Linear instance is not a submodule"),
    ({"excluded_layers": ["linear"]}, r"'linear' is neither an nn.Module instance nor an nn.Module subclass"),
    ({"device": "nosuchbackend"}, r"unknown backend 'nosuchbackend'"),
    ({"device": "cuda"}, r'backend "cuda" .* is unavailable|drives .cuda. tensors'),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_ARGUMENTS)
def test_bad_arguments_raise_clear_errors_and_change_nothing(kwargs: dict[str, object], message: str) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model, opt)
    optimizers = kwargs.pop("optimizers", opt)
    with pytest.raises(ampcore.AmpcoreError, match=message):
        ampcore.decorate(model, optimizers, **{"device": "cpu", **kwargs})  # type: ignore[arg-type]
    assert same(before, snapshot(model, opt))


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ("net", r"models=str\): expected a torch.nn.modules.module.Module"),
        ([], r"models=\[\]\): expected at least one"),
    ],
)
def test_models_must_be_modules(models: object, message: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=message):
        ampcore.decorate(models, device="cpu")  # type: ignore[call-overload]


def test_a_capability_error_raises_before_converting(register: Callable[..., ampcore.Backend]) -> None:
    register(
        make_adapter(
            "nobf16", ampcore_check_capability=lambda dtype: [ampcore.CapabilityIssue("error", "no bf16 here")]
        )
    )
    model = nn.Linear(4, 4)
    with pytest.raises(ampcore.AmpcoreError, match="no bf16 here"):
        ampcore.decorate(model, device="nobf16")
    assert model.weight.dtype == FP32


def test_the_backends_own_o2_tool_takes_over_for_default_options(register: Callable[..., ampcore.Backend]) -> None:
    calls: list[tuple[nn.Module, object, torch.dtype]] = []

    def prepare(model: nn.Module, optimizer: object, dtype: torch.dtype) -> tuple[nn.Module, object]:
        calls.append((model, optimizer, dtype))
        return nn.Sequential(model), optimizer

    register(make_adapter("vendor", ampcore_prepare_o2=prepare))
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out_model, out_opt = ampcore.decorate(model, opt, device="vendor")
    assert calls == [(model, opt, BF16)] and isinstance(out_model, nn.Sequential) and out_opt is opt
    assert model.weight.dtype == FP32  # the vendor tool, not the core, converts
    # options only the core implements: the core does it
    other = nn.Linear(4, 4)
    ampcore.decorate(other, device="vendor", save_dtype=FP32)
    assert len(calls) == 1 and other.weight.dtype == BF16


def test_a_decorated_model_can_be_deep_copied_and_saved_whole(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ampcore.decorate(model, opt, device="cpu", excluded_layers=model[3])
    twin = copy.deepcopy(model)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    x = torch.randn(3, 4)
    for other in (twin, loaded):
        assert dtypes(other) == dtypes(model)
        assert torch.equal(other(x), model(x))
        assert torch.equal(other.state_dict()["0.weight"], model.state_dict()["0.weight"])
