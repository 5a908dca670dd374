"""The native ``torch.autocast`` op lists, as data, keyed by torch device type.

torch registers its autocast kernels in C++ per dispatch key
(``aten/src/ATen/autocast_mode.cpp`` and the ``AT_FORALL_*`` macros of
``autocast_mode.h``).  This module copies those registrations: for every table, each
registered operator overload (``"mm"``, ``"softmax.int"``) with its cast policy:

* ``lower_precision_fp``: inputs cast to the autocast dtype (the *white* list);
* ``fp32``: inputs cast to float32 (the *black* list);
* ``fp32_set_opt_dtype``: run in float32 by passing ``dtype=torch.float32`` when the
  caller gave none (black list, e.g. ``softmax`` and ``sum`` on CUDA);
* ``fp32_append_dtype``: redispatched to the overload that takes an output dtype, with
  float32 (black list, ``norm`` on CUDA);
* ``promote``: inputs cast to the widest floating dtype among them;
* ``banned``: raises (``binary_cross_entropy`` on CUDA and XPU).

Membership is checked against the dispatcher of the installed torch by
``tests/policy/test_oplists.py`` (``torch._C._dispatch_get_registrations_for_dispatch_key``), so a
torch upgrade that changes the lists fails that test instead of drifting silently.
Policies were read from the torch sources of the 2.x series matching torch 2.13's
registrations.  The lists differ across the supported releases (2.8 to 2.13):
:data:`TABLE_CHANGES` records each difference with the releases that have it, and the
tables of this module are those of the installed torch (:func:`tables_for`; the
registrations of each release, recorded from its wheels, are checked in the tests).
:data:`UNMIRRORED` lists the native registrations ampcore deliberately does not copy.

Which table a device type uses (:data:`TABLE_OF_DEVICE_TYPE`): ``cpu``, ``cuda`` and
``mps`` have their own lists in torch.  ``xpu`` and ``mtia`` register torch's generic
``AT_FORALL_*`` lists (CUDA's lists without the cuDNN-only ops), which torch shares "so
that other backends can reuse the policy op list".  torch registers *no* kernels for
``AutocastPrivateUse1`` (vendors such as torch_npu register their own, mostly copied from
the generic lists) nor for HPU, IPU or XLA: ampcore uses the generic table for them, and an
adapter describes its differences with the ``ampcore_op_list_adjustments`` hook.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import torch

__all__ = [
    "APPEND_DTYPE_OVERLOADS",
    "AUTOCAST_DISPATCH_KEYS",
    "BANNED_MESSAGES",
    "CastPolicy",
    "DEFAULT_DISPATCH_KEY",
    "GENERIC_TABLE",
    "NATIVE_TABLES",
    "TABLE_CHANGES",
    "TABLE_OF_DEVICE_TYPE",
    "TENSOR_DEVICE_CHECKS",
    "TORCH_KERNEL_DEVICE_TYPES",
    "TORCH_RELEASE",
    "UNMIRRORED",
    "TableChange",
    "dispatch_key_of",
    "native_table",
    "release_of",
    "table_name_of",
    "tables_for",
]

CastPolicy = Literal["lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned"]


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _invert(by_policy: Mapping[CastPolicy, tuple[str, ...]]) -> dict[str, CastPolicy]:
    return {op: policy for policy, ops in by_policy.items() for op in ops}


_GENERIC: Final[dict[CastPolicy, tuple[str, ...]]] = {
    "lower_precision_fp": _split("""
        _convolution _convolution.deprecated _scaled_dot_product_flash_attention
        _thnn_fused_gru_cell _thnn_fused_lstm_cell addbmm addmm addmv addr baddbmm bmm
        chain_matmul conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d.input
        conv_transpose3d.input convolution einsum gru_cell linalg_multi_dot linalg_vecdot
        linear lstm_cell matmul mm mv prelu rnn_relu_cell rnn_tanh_cell
        scaled_dot_product_attention
    """),
    "fp32": _split("""
        _upsample_bicubic2d_aa _upsample_bilinear2d_aa _upsample_nearest_exact1d
        _upsample_nearest_exact2d _upsample_nearest_exact3d acos asin
        binary_cross_entropy_with_logits cdist cosh cosine_embedding_loss cosine_similarity
        dist erfinv exp expm1 frobenius_norm.dim group_norm hinge_embedding_loss huber_loss
        kl_div l1_loss layer_norm log log10 log1p log2 logsumexp margin_ranking_loss
        mse_loss multi_margin_loss multilabel_margin_loss native_layer_norm nll_loss
        nll_loss2d nuclear_norm nuclear_norm.dim pdist poisson_nll_loss pow.Scalar
        pow.Tensor_Scalar pow.Tensor_Tensor reciprocal renorm rsqrt sinh
        smooth_l1_loss soft_margin_loss softplus tan triplet_margin_loss upsample_bicubic2d
        upsample_bilinear2d upsample_linear1d upsample_nearest1d upsample_nearest2d
        upsample_nearest3d upsample_trilinear3d
    """),
    "fp32_set_opt_dtype": _split("""
        cumprod cumsum linalg_matrix_norm linalg_matrix_norm.str_ord linalg_vector_norm
        log_softmax.int prod prod.dim_int softmax.int sum sum.dim_IntList
    """),
    "fp32_append_dtype": _split("norm.Scalar norm.ScalarOpt_dim"),
    "promote": _split("""
        addcdiv addcmul atan2 bilinear cross dot grid_sampler index_put scatter_add
        tensordot vdot
    """),
    "banned": _split("binary_cross_entropy"),
}

_CPU: Final[dict[CastPolicy, tuple[str, ...]]] = {
    "lower_precision_fp": _split("""
        _addmm_activation _convolution.deprecated _native_multi_head_attention addbmm addmm
        baddbmm bmm conv1d conv1d.padding conv2d conv2d.padding conv3d conv3d.padding
        conv_tbc conv_transpose1d conv_transpose2d.input conv_transpose3d.input
        linalg_vecdot linear matmul mkldnn_rnn_layer mm prelu scaled_dot_product_attention
    """),
    "fp32": _split("""
        _grid_sampler_2d_cpu_fallback _lu_with_info adaptive_avg_pool3d adaptive_max_pool3d
        avg_pool3d binary_cross_entropy binary_cross_entropy_with_logits cdist cholesky
        cholesky_inverse cholesky_solve cosine_embedding_loss cross_entropy_loss
        ctc_loss.IntList ctc_loss.Tensor fake_quantize_per_tensor_affine fft_fft fft_fft2
        fft_fftn fft_hfft fft_ifft fft_ifft2 fft_ifftn fft_ihfft fft_irfft fft_irfft2
        fft_irfftn fft_rfft fft_rfft2 fft_rfftn fractional_max_pool2d fractional_max_pool3d
        geqrf grid_sampler grid_sampler_2d grid_sampler_3d hinge_embedding_loss huber_loss
        inverse kl_div l1_loss linalg_cholesky linalg_cholesky_ex linalg_cond
        linalg_cond.p_str linalg_eig linalg_eigh linalg_eigvals linalg_eigvalsh
        linalg_householder_product linalg_inv linalg_inv_ex linalg_lstsq linalg_matrix_rank
        linalg_matrix_rank.atol_rtol_float linalg_matrix_rank.atol_rtol_tensor
        linalg_matrix_rank.tol_tensor linalg_qr linalg_solve linalg_svd linalg_svdvals
        linalg_tensorinv linalg_tensorsolve lu_solve margin_ranking_loss max_pool3d
        max_unpool2d max_unpool3d mse_loss multi_margin_loss multilabel_margin_loss
        multilabel_margin_loss_forward nanquantile nanquantile.scalar nll_loss nll_loss2d
        orgqr ormqr pinverse poisson_nll_loss polar prod prod.dim_int qr quantile
        quantile.scalar reflection_pad1d reflection_pad2d replication_pad1d
        replication_pad2d replication_pad3d smooth_l1_loss soft_margin_loss stft
        stft.center svd trace triangular_solve triplet_margin_loss view_as_complex
    """),
    "promote": _split("cat index_copy stack"),
}

_MPS: Final[dict[CastPolicy, tuple[str, ...]]] = {
    "lower_precision_fp": _split("""
        _convolution _convolution.deprecated _mps_convolution addbmm addmm addmv addr
        baddbmm bmm chain_matmul conv1d conv2d conv_tbc conv_transpose1d
        conv_transpose2d.input convolution einsum linalg_multi_dot
        linear lstm_cell matmul mm mv prelu scaled_dot_product_attention
    """),
    "fp32": _split("""
        acos asin batch_norm binary_cross_entropy_with_logits cdist cosh
        cosine_embedding_loss cosine_similarity cumprod cumsum dist erfinv exp expm1
        frobenius_norm.dim group_norm hinge_embedding_loss huber_loss kl_div l1_loss
        layer_norm linalg_matrix_norm linalg_matrix_norm.str_ord linalg_vector_norm log
        log10 log1p log2 log_softmax.int logsumexp margin_ranking_loss mse_loss
        multi_margin_loss multilabel_margin_loss native_layer_norm nll_loss nll_loss2d
        nuclear_norm nuclear_norm.dim pdist poisson_nll_loss pow.Scalar pow.Tensor_Scalar
        pow.Tensor_Tensor prod prod.dim_int reciprocal renorm rsqrt sinh smooth_l1_loss
        soft_margin_loss softmax.int softplus sum sum.dim_IntList tan triplet_margin_loss
    """),
    "promote": _split("""
        addcdiv addcmul atan2 bilinear cross dot grid_sampler index_put scatter_add
        tensordot
    """),
}

_CUDA: Final[dict[CastPolicy, tuple[str, ...]]] = {
    **_GENERIC,
    "lower_precision_fp": _GENERIC["lower_precision_fp"] + _split("cudnn_convolution cudnn_convolution_transpose"),
}

#: The name of the table used for device types torch has no own lists for.
GENERIC_TABLE: Final = "generic"

Release = tuple[int, int]


@dataclass(frozen=True)
class TableChange:
    """Overloads ``ops`` with ``policy`` in ``tables``, registered by torch from release
    ``since`` (None: every supported one) up to, not including, release ``until``."""

    tables: tuple[str, ...]
    policy: CastPolicy
    ops: tuple[str, ...]
    since: Release | None = None
    until: Release | None = None

    def applies_to(self, release: Release) -> bool:
        return (self.since is None or release >= self.since) and (self.until is None or release < self.until)


_NAMED = _split("""
    cumprod.dimname cumsum.dimname log_softmax.Dimname prod.dim_Dimname softmax.Dimname sum.dim_DimnameList
""")

#: How torch's lists changed between the supported releases (2.8 to 2.13), read from each
#: release's dispatcher (``tests/policy/data/autocast-registrations-*.json``).
TABLE_CHANGES: Final[tuple[TableChange, ...]] = (
    # named-tensor overloads: gone from torch 2.13 (the operators no longer exist)
    TableChange(("cuda", GENERIC_TABLE), "fp32_set_opt_dtype", _NAMED, until=(2, 13)),
    TableChange(("cuda", GENERIC_TABLE), "fp32_append_dtype", ("norm.names_ScalarOpt_dim",), until=(2, 13)),
    TableChange(("mps",), "fp32", _NAMED, until=(2, 13)),
    TableChange(("cpu",), "fp32", ("prod.dim_Dimname",), until=(2, 13)),
    TableChange(("cpu",), "promote", ("index_copy.dimname",), until=(2, 13)),
    # rms_norm joined the float32 list in torch 2.12
    TableChange(("cuda", GENERIC_TABLE), "fp32", ("rms_norm",), since=(2, 12)),
    # MPS runs 3-d convolutions in low precision since torch 2.9
    TableChange(("mps",), "lower_precision_fp", ("conv3d", "conv_transpose3d.input"), since=(2, 9)),
)

#: Native registrations ampcore's tables leave out on purpose: table -> {overload: why}.
UNMIRRORED: Final[Mapping[str, Mapping[str, str]]] = {
    "cuda": {
        "_cudnn_rnn": "registered by torch builds with cuDNN only; its kernel casts and re-flattens the "
        "RNN's packed weights itself, which no per-argument cast policy can copy (under a customised "
        "region the op runs in its inputs' dtype)",
    },
}


def release_of(version: str) -> Release:
    """``"2.11.0+cu130"`` -> ``(2, 11)``.

    Example::

        >>> release_of("2.11.0+cu130"), release_of("2.13.0a0+git1234")
        ((2, 11), (2, 13))
    """
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


#: The installed torch's release (major, minor).
TORCH_RELEASE: Final = release_of(torch.__version__)


def tables_for(release: Release) -> dict[str, dict[str, CastPolicy]]:
    """Every native table as torch ``release`` registers it: ``{table: {overload: policy}}``."""
    tables = {"cpu": _invert(_CPU), "cuda": _invert(_CUDA), "mps": _invert(_MPS), GENERIC_TABLE: _invert(_GENERIC)}
    for change in TABLE_CHANGES:
        if change.applies_to(release):
            for table in change.tables:
                tables[table].update(dict.fromkeys(change.ops, change.policy))
    return tables


#: table name -> {operator overload ("mm", "softmax.int"): cast policy}, for the installed torch.
NATIVE_TABLES: Final[Mapping[str, Mapping[str, CastPolicy]]] = tables_for(TORCH_RELEASE)

#: torch device type -> native table (anything else: :data:`GENERIC_TABLE`).
TABLE_OF_DEVICE_TYPE: Final[Mapping[str, str]] = {"cpu": "cpu", "cuda": "cuda", "mps": "mps"}

#: Device types whose autocast kernels torch registers itself, from the table
#: :func:`native_table` gives them (a vendor registers its own for the others).
TORCH_KERNEL_DEVICE_TYPES: Final = frozenset({"cpu", "cuda", "mps", "xpu", "mtia"})

#: torch device type -> autocast dispatch key, as torch's
#: ``get_autocast_dispatch_key_from_device_type`` maps them.
AUTOCAST_DISPATCH_KEYS: Final[Mapping[str, str]] = {
    "cpu": "AutocastCPU",
    "cuda": "AutocastCUDA",
    "xpu": "AutocastXPU",
    "mps": "AutocastMPS",
    "hpu": "AutocastHPU",
    "ipu": "AutocastIPU",
    "xla": "AutocastXLA",
    "mtia": "AutocastMTIA",
}

#: The autocast key of every other device type (torch_npu's "npu" and other vendors).
DEFAULT_DISPATCH_KEY: Final = "AutocastPrivateUse1"

#: ``fp32_append_dtype`` overloads -> the overload they redispatch to with a dtype.
APPEND_DTYPE_OVERLOADS: Final[Mapping[str, str]] = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}

#: The error a ``banned`` op raises, as torch words it.
BANNED_MESSAGES: Final[Mapping[str, str]] = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    ),
}

#: device type -> the ``torch.Tensor`` attribute that says a tensor lives there (faster
#: than comparing ``tensor.device.type``; other device types compare the device type).
TENSOR_DEVICE_CHECKS: Final[Mapping[str, str]] = {
    "cpu": "is_cpu",
    "cuda": "is_cuda",
    "xpu": "is_xpu",
    "mps": "is_mps",
    "hpu": "is_hpu",
    "ipu": "is_ipu",
    "xla": "is_xla",
    "mtia": "is_mtia",
}


def dispatch_key_of(device_type: str) -> str:
    """The autocast dispatch key torch uses for ``device_type``.

    Example::

        >>> dispatch_key_of("cpu"), dispatch_key_of("npu")
        ('AutocastCPU', 'AutocastPrivateUse1')
    """
    return AUTOCAST_DISPATCH_KEYS.get(device_type, DEFAULT_DISPATCH_KEY)


def table_name_of(device_type: str) -> str:
    """The native table used for ``device_type`` (``"generic"`` when torch has none)."""
    return TABLE_OF_DEVICE_TYPE.get(device_type, GENERIC_TABLE)


def native_table(device_type: str) -> Mapping[str, CastPolicy]:
    """``{overload: policy}`` of the native autocast lists of ``device_type``.

    Example::

        >>> native_table("cpu")["mm"], native_table("cuda")["softmax.int"]
        ('lower_precision_fp', 'fp32_set_opt_dtype')
    """
    return NATIVE_TABLES[table_name_of(device_type)]
