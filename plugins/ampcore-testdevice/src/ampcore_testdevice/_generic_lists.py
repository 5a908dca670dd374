"""torch's generic autocast lists (``AT_FORALL_*`` in ``aten/src/ATen/autocast_mode.h``).

These are the kernels torch registers for ``AutocastXPU`` and ``AutocastMTIA`` (CUDA's lists
without the cuDNN-only ops), which torch shares "so that other backends can reuse the policy
op list".  A vendor that copies them (torch_npu does) registers exactly this table on
``AutocastPrivateUse1``; the test device's mode ``"generic"`` does too.  The tests check
the names against torch's own ``AutocastXPU`` registrations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

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

#: overload -> cast policy
GENERIC: Final[Mapping[str, str]] = {op: policy for policy, ops in _BY_POLICY.items() for op in ops}

#: ``fp32_append_dtype`` overloads -> the overload they call with ``dtype=float32``.
APPEND_DTYPE: Final[Mapping[str, str]] = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}
