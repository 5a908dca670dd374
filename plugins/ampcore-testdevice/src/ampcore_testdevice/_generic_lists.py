"""torch's generic autocast lists (``AT_FORALL_*`` in ``aten/src/ATen/autocast_mode.h``).

These are the kernels torch registers for ``AutocastXPU`` and ``AutocastMTIA`` (CUDA's lists
without the cuDNN-only ops), which torch shares "so that other backends can reuse the policy
op list".  A vendor that copies them (torch_npu does) registers exactly this table on
``AutocastPrivateUse1``; the test device's mode ``"generic"`` does too.  The tests check
the names against torch's own ``AutocastXPU`` registrations.

The lists are torch 2.13's; like a vendor that supports several torch releases, the table
follows the installed one (:data:`_RELEASE_CHANGES`: named-tensor overloads registered
until 2.13, ``rms_norm`` in float32 since 2.12).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import torch

__all__ = ["APPEND_DTYPE", "GENERIC"]


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_BY_POLICY: Final[dict[str, tuple[str, ...]]] = {
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
        pow.Tensor_Scalar pow.Tensor_Tensor reciprocal renorm rms_norm rsqrt sinh
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

#: The installed torch's (major, minor).
_RELEASE: Final = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])

_NAMED: Final = _split("""
    cumprod.dimname cumsum.dimname log_softmax.Dimname prod.dim_Dimname softmax.Dimname sum.dim_DimnameList
""")

#: (policy, overloads, first release that has them, first release that no longer has them).
_RELEASE_CHANGES: Final[tuple[tuple[str, tuple[str, ...], tuple[int, ...], tuple[int, ...]], ...]] = (
    ("fp32_set_opt_dtype", _NAMED, (0, 0), (2, 13)),
    ("fp32_append_dtype", ("norm.names_ScalarOpt_dim",), (0, 0), (2, 13)),
    ("fp32", ("rms_norm",), (2, 12), (99, 0)),
)


def _for_release(release: tuple[int, ...]) -> dict[str, str]:
    """The generic table as torch ``release`` registers it: overload -> cast policy."""
    table = {op: policy for policy, ops in _BY_POLICY.items() for op in ops}
    for policy, ops, since, until in _RELEASE_CHANGES:
        for op in ops:
            if since <= release < until:
                table[op] = policy
            else:
                table.pop(op, None)
    return table


#: overload -> cast policy, for the installed torch
GENERIC: Final[Mapping[str, str]] = _for_release(_RELEASE)

#: ``fp32_append_dtype`` overloads -> the overload they call with ``dtype=float32``.
APPEND_DTYPE: Final[Mapping[str, str]] = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}
