"""autocast as Paddle and torch users write it (issue 30): the three positional orders, Paddle's
``auto_cast`` name and ``use_promote``, aliases of custom_fwd and AmpcoreSettings, short errors."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import ampcore
from ampcore._errors import MESSAGE_LIMIT
from ampcore.integrations import AmpcoreSettings

X = torch.randn(4, 4)


def _region_of(*args: Any, **kwargs: Any) -> ampcore.RegionInfo | None:
    with ampcore.autocast(*args, **kwargs):
        return ampcore.active_region("cpu")


def test_auto_cast_is_paddles_name_for_autocast(cuda_absent: ampcore.Backend) -> None:
    """Paddle's call names no device: the region is on the best available backend, the
    host's here (``cuda_absent``: also on a machine with a GPU, where it would be cuda)."""
    assert ampcore.auto_cast is ampcore.autocast
    assert "auto_cast" in ampcore.__all__
    with ampcore.auto_cast(enable=True, custom_white_list={"elementwise_add"}, level="O1", dtype="bfloat16"):
        assert (X + X).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("args", "white", "black", "level"),
    [
        ((True, {"elementwise_add"}), {"add"}, set(), "O1"),
        ((True, {"elementwise_add"}, {"mm"}), {"add"}, {"mm"}, "O1"),
        ((True, None, {"mm"}, "OD", "bfloat16"), set(), {"mm"}, "OD"),
        ((True, None, None, "O2", "bfloat16", False), set(), set(), "O2"),
    ],
)
def test_paddles_positional_order(args: tuple[Any, ...], white: set[str], black: set[str], level: str) -> None:
    region = _region_of(*args, device="cpu")
    assert region is not None
    assert (set(region.custom_white_list), set(region.custom_black_list), region.level) == (white, black, level)


def test_paddles_positional_order_with_enable_false_turns_autocast_off() -> None:
    with ampcore.autocast(False, {"elementwise_add"}):
        assert torch.mm(X, X).dtype == torch.float32


@pytest.mark.parametrize(("enabled", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
def test_torchs_positional_order_reads_the_third_argument_as_enabled(enabled: bool, expected: torch.dtype) -> None:
    with ampcore.autocast("cpu", torch.bfloat16, enabled):
        assert torch.mm(X, X).dtype == expected
    with ampcore.autocast("cpu", torch.bfloat16, enabled, False):  # cache_enabled fourth
        assert torch.mm(X, X).dtype == expected


def test_ampcores_positional_order_still_works() -> None:
    region = _region_of("cpu", torch.bfloat16, "OD", True, None, {"gelu"}, {"mm"})
    assert region is not None
    assert (region.level, set(region.custom_white_list), set(region.custom_black_list)) == ("OD", {"gelu"}, {"mm"})


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (({"add"},), {}, r"first positional argument must be a device .* got set.*three orders"),
        ((torch.bfloat16,), {}, r"first positional argument must be a device .* got dtype"),
        (("cpu", None, {"add"}), {}, r"third positional argument is ampcore's level .* got set"),
        (("cpu", None, 3), {}, r"third positional argument .* got int"),
        (("cpu", torch.bfloat16, True, None, 1), {}, r"at most 4 positional arguments in torch.autocast's order"),
        ((True, None, None, "O1", None, True, 1), {}, r"at most 6 positional arguments in paddle.amp.auto_cast"),
        ((True, {"add"}), {"custom_white_list": {"mm"}}, r"'custom_white_list' was given twice"),
        (("cpu",), {"device": "cpu"}, r"'device' was given twice"),
        ((True, None, None, "O1", None, True), {"use_promote": True}, r"'use_promote' was given twice"),
        ((), {"use_promote": "yes"}, r"use_promote='yes'\): expected True or False"),
        ((), {"devce": "cpu"}, r"did you mean 'device'"),
    ],
)
def test_ambiguous_or_doubled_arguments_raise_clearly(
    args: tuple[Any, ...], kwargs: dict[str, Any], match: str
) -> None:
    before = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    with pytest.raises(ampcore.AmpcoreError, match=match):
        ampcore.autocast(*args, **kwargs)
    assert (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")) == before


def test_use_promote_true_at_o2_warns_that_ampcore_does_not_promote() -> None:
    with pytest.warns(ampcore.AmpcoreWarning, match=r"use_promote=True.*does not promote"):
        ampcore.autocast(device="cpu", level="O2", use_promote=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ampcore.autocast(device="cpu", level="O2", use_promote=False)
        ampcore.autocast(device="cpu", level="O1", use_promote=True)  # Paddle ignores it below O2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"custom_white_list": ampcore.oplists("cpu")},
        {"custom_black_list": ampcore.oplists("cpu")},
        {"custom_white_list": 12345},
        {"level": list(range(2000))},
        {"dtype": list(range(2000))},
        {"enabled": list(range(2000))},
        {"custom_white_list": [list(range(2000))]},
    ],
    ids=["oplists-white", "oplists-black", "int", "level", "dtype", "enabled", "nested"],
)
def test_errors_echo_a_short_form_of_huge_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ampcore.AmpcoreError) as info:
        ampcore.autocast(device="cpu", **kwargs)
    assert len(str(info.value)) < 600, str(info.value)[:300]


def test_oplists_given_as_a_list_points_to_its_white_attribute() -> None:
    with pytest.raises(ampcore.AmpcoreError, match=r"whole OpLists object; .*oplists\('cpu'\)\.white"):
        ampcore.autocast(custom_white_list=ampcore.oplists("cpu"))


def test_any_ampcore_error_message_is_capped() -> None:
    text = str(ampcore.AmpcoreError("what was wrong: " + "x" * 10_000 + " valid: a, b"))
    assert len(text) <= MESSAGE_LIMIT and text.startswith("what was wrong") and text.endswith("valid: a, b")
    assert "characters left out" in text


def test_custom_fwd_accepts_torchs_device_type() -> None:
    class Double(torch.autograd.Function):
        @staticmethod
        @ampcore.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return torch.mm(x, x)

        @staticmethod
        @ampcore.custom_bwd(device_type="cpu")
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad

    with ampcore.autocast(device="cpu"):
        assert Double.apply(X).dtype == torch.float32


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ampcore.custom_fwd(cast_input=torch.float32), r"custom_fwd\(cast_input=...\).*'cast_inputs'"),
        (lambda: ampcore.custom_fwd(device="cpu", device_type="cpu"), r"give the device once"),
        (lambda: ampcore.custom_bwd(devices="cpu"), r"custom_bwd\(devices=...\): unknown keyword"),
    ],
)
def test_custom_fwd_and_bwd_refuse_unknown_keywords_with_an_ampcore_error(call: Any, match: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=match):
        call()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"use_dynamic_loss_scaling": True}, r"GradScaler option: pass scaler=\{'use_dynamic_loss_scaling': True\}"),
        ({"init_scale": 8.0}, r"pass scaler=\{'init_scale': 8.0\}"),
        ({"master_grad": True}, r"decorate option: pass decorate=\{'master_grad': True\}"),
        ({"devce": "cpu"}, r"did you mean 'device'"),
    ],
)
def test_settings_point_misplaced_options_to_where_they_belong(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ampcore.AmpcoreError, match=match):
        AmpcoreSettings(**kwargs)
