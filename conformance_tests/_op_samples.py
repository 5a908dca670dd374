"""How to call each ATen op the suite knows, on small tensors of any device.

The op lists of a backend (white, black, promote) name ATen ops; this table says how to
call one.  A sample lists its floating-point inputs as :class:`Arg` specs, built in a
chosen dtype on the device under test, and a ``call`` that takes them (followed by the
non-floating extras such as class indices).  Which dtype an op *should* produce is not
here: it follows from the backend's lists (see :mod:`ampcore_conformance._lists`).

Adding an op is one line: ``_add("name", call, (Arg(shape), ...), extras=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import torch
import torch.nn.functional as F

__all__ = ["SAMPLES", "Arg", "OpSample", "sample_for"]

Kind = Literal["normal", "positive", "unit", "prob", "sign", "spd"]
aten = torch.ops.aten


@dataclass(frozen=True)
class Arg:
    """One floating input: its shape and the range of its values."""

    shape: tuple[int, ...]
    kind: Kind = "normal"

    def build(self, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> torch.Tensor:
        """A tensor of this spec (drawn on the CPU for reproducibility, then moved)."""
        if self.kind == "spd":
            n = self.shape[-1]
            a = torch.randn(self.shape, generator=gen) * 0.1
            base = torch.eye(n) * 2 + a @ a.transpose(-1, -2)
        elif self.kind == "positive":
            base = torch.rand(self.shape, generator=gen) + 0.5
        elif self.kind == "unit":
            base = torch.rand(self.shape, generator=gen) * 1.6 - 0.8
        elif self.kind == "prob":
            base = torch.rand(self.shape, generator=gen) * 0.8 + 0.1
        elif self.kind == "sign":
            base = torch.randint(0, 2, self.shape, generator=gen).float() * 2 - 1
        else:
            base = torch.randn(self.shape, generator=gen)
        return base.to(device=device, dtype=dtype)


@dataclass(frozen=True)
class OpSample:
    """A way to call ATen op ``name``: ``call(*floating_inputs, *extras(device))``."""

    name: str
    call: Callable[..., Any]
    args: tuple[Arg, ...]
    extras: Callable[[torch.device], tuple[Any, ...]] = field(default=lambda device: ())

    def inputs(
        self, dtypes: torch.dtype | Sequence[torch.dtype], device: torch.device, seed: int = 0
    ) -> list[torch.Tensor]:
        """The floating inputs; ``dtypes`` is one dtype or one per input (cycled)."""
        gen = torch.Generator().manual_seed(seed)
        per_arg = [dtypes] if isinstance(dtypes, torch.dtype) else list(dtypes)
        return [arg.build(per_arg[i % len(per_arg)], device, gen) for i, arg in enumerate(self.args)]

    def run(self, inputs: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
        """Call the op; a tuple result gives its first tensor."""
        out = self.call(*inputs, *self.extras(device))
        if isinstance(out, (tuple, list)):
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"sample of {self.name} returned {type(out).__name__}, not a tensor")
        return out


_samples: dict[str, OpSample] = {}


def _add(
    name: str,
    call: Callable[..., Any],
    args: tuple[Arg, ...],
    extras: Callable[[torch.device], tuple[Any, ...]] | None = None,
) -> None:
    _samples[name] = OpSample(name, call, args, extras or (lambda device: ()))


def _long(*values: Any) -> Callable[[torch.device], tuple[Any, ...]]:
    # built on the CPU, then moved: torch.tensor(..., device=) inside a TorchDispatchMode
    # trips an INTERNAL ASSERT for a device registered from Python
    return lambda device: (torch.tensor(values).to(device),)


def _A(*shape: int, kind: Kind = "normal") -> Arg:
    return Arg(shape, kind)


M, V = _A(8, 8), _A(8)
B3 = _A(2, 8, 8)
ROWS = _A(4, 8)

# -- matrix products and convolutions (typically white) ------------------------------------
_add("mm", torch.mm, (M, M))
_add("bmm", torch.bmm, (B3, B3))
_add("addmm", torch.addmm, (M, M, M))
_add("baddbmm", torch.baddbmm, (B3, B3, B3))
_add("addbmm", torch.addbmm, (M, B3, B3))
_add("matmul", torch.matmul, (M, M))
_add("linear", F.linear, (ROWS, _A(6, 8), _A(6)))
_add("mv", torch.mv, (M, V))
_add("addmv", torch.addmv, (V, M, V))
_add("addr", torch.addr, (M, V, V))
_add("linalg_vecdot", torch.linalg.vecdot, (ROWS, ROWS))
_add("conv1d", F.conv1d, (_A(1, 2, 8), _A(3, 2, 3)))
_add("conv2d", F.conv2d, (_A(1, 2, 6, 6), _A(3, 2, 3, 3)))
_add("conv3d", F.conv3d, (_A(1, 2, 4, 4, 4), _A(3, 2, 3, 3, 3)))
_add("conv_transpose1d", F.conv_transpose1d, (_A(1, 2, 6), _A(2, 3, 3)))
_add("conv_transpose2d", F.conv_transpose2d, (_A(1, 2, 5, 5), _A(2, 3, 3, 3)))
_add("conv_transpose3d", F.conv_transpose3d, (_A(1, 2, 3, 3, 3), _A(2, 3, 2, 2, 2)))
_add("prelu", F.prelu, (_A(2, 3, 4), _A(3)))
_add("scaled_dot_product_attention", F.scaled_dot_product_attention, (_A(1, 2, 4, 8),) * 3)

# -- losses (typically black) --------------------------------------------------------------
for _loss in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"):
    _add(_loss, getattr(F, _loss), (ROWS, ROWS))
_add("nll_loss", F.nll_loss, (_A(4, 5),), _long(0, 3, 1, 4))
_add("cross_entropy_loss", F.cross_entropy, (_A(4, 5),), _long(0, 3, 1, 4))
_add("kl_div", lambda x, t: F.kl_div(x, t, reduction="sum"), (ROWS, _A(4, 8, kind="prob")))
_add("binary_cross_entropy_with_logits", F.binary_cross_entropy_with_logits, (ROWS, _A(4, 8, kind="prob")))
_add("poisson_nll_loss", F.poisson_nll_loss, (ROWS, _A(4, 8, kind="positive")))
_add("soft_margin_loss", F.soft_margin_loss, (ROWS, _A(4, 8, kind="sign")))
_add("hinge_embedding_loss", F.hinge_embedding_loss, (ROWS, _A(4, 8, kind="sign")))
_add("margin_ranking_loss", F.margin_ranking_loss, (V, V, _A(8, kind="sign")))
_add("cosine_embedding_loss", F.cosine_embedding_loss, (ROWS, ROWS), _long(1, -1, 1, -1))
_add("triplet_margin_loss", F.triplet_margin_loss, (ROWS, ROWS, ROWS))
_add("multi_margin_loss", F.multi_margin_loss, (_A(4, 5),), _long(0, 3, 1, 4))
_add("multilabel_margin_loss", F.multilabel_margin_loss, (_A(4, 5),), _long(*[[1, 2, -1, 0, 0]] * 4))

# -- reductions, pooling, padding, linear algebra, pointwise math -------------------------
_add("prod", torch.prod, (_A(4, 8, kind="positive"),))
_add("sum", torch.sum, (ROWS,))
_add("cumsum", lambda x: torch.cumsum(x, 1), (ROWS,))
_add("cumprod", lambda x: torch.cumprod(x, 1), (_A(4, 8, kind="positive"),))
_add("softmax", lambda x: F.softmax(x, -1), (ROWS,))
_add("log_softmax", lambda x: F.log_softmax(x, -1), (ROWS,))
_add("logsumexp", lambda x: torch.logsumexp(x, 1), (ROWS,))
_add("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b), (ROWS, V, V))
_add("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), (_A(2, 4, 3), _A(4), _A(4)))
_add("norm", aten.norm, (ROWS,))
_add("linalg_vector_norm", torch.linalg.vector_norm, (ROWS,))
_add("cdist", torch.cdist, (ROWS, _A(5, 8)))
_add("dist", torch.dist, (ROWS, ROWS))
_add("pdist", F.pdist, (ROWS,))
_add("cosine_similarity", F.cosine_similarity, (ROWS, ROWS))
_add("renorm", lambda x: torch.renorm(x, 2, 0, 1.0), (ROWS,))
_add("trace", torch.trace, (M,))
_add("avg_pool3d", lambda x: F.avg_pool3d(x, 2), (_A(1, 2, 4, 4, 4),))
_add("max_pool3d", lambda x: F.max_pool3d(x, 2), (_A(1, 2, 4, 4, 4),))
_add("adaptive_avg_pool3d", lambda x: F.adaptive_avg_pool3d(x, 2), (_A(1, 2, 4, 4, 4),))
_add("reflection_pad1d", lambda x: aten.reflection_pad1d(x, [2, 2]), (_A(1, 2, 6),))
_add("reflection_pad2d", lambda x: aten.reflection_pad2d(x, [1, 1, 1, 1]), (_A(1, 2, 4, 4),))
_add("replication_pad1d", lambda x: aten.replication_pad1d(x, [2, 2]), (_A(1, 2, 6),))
_add("replication_pad2d", lambda x: aten.replication_pad2d(x, [1, 1, 1, 1]), (_A(1, 2, 4, 4),))
_add("replication_pad3d", lambda x: aten.replication_pad3d(x, [1, 1, 1, 1, 1, 1]), (_A(1, 2, 3, 3, 3),))
_add("inverse", torch.inverse, (_A(4, 4, kind="spd"),))
_add("linalg_inv", torch.linalg.inv, (_A(4, 4, kind="spd"),))
_add("linalg_cholesky", torch.linalg.cholesky, (_A(4, 4, kind="spd"),))
_add("pinverse", torch.pinverse, (_A(4, 4, kind="spd"),))
_add("quantile", lambda x: torch.quantile(x, 0.5), (ROWS,))
_add("fft_fft", torch.fft.fft, (_A(16),))
_add("fft_rfft", torch.fft.rfft, (_A(16),))
_UNARY: tuple[tuple[str, Kind], ...] = (
    ("exp", "normal"), ("expm1", "normal"), ("log", "positive"), ("log2", "positive"),
    ("log10", "positive"), ("log1p", "positive"), ("reciprocal", "positive"), ("rsqrt", "positive"),
    ("acos", "unit"), ("asin", "unit"), ("erfinv", "unit"), ("cosh", "normal"), ("sinh", "normal"),
    ("tan", "unit"), ("relu", "normal"), ("tanh", "normal"), ("sigmoid", "normal"),
)  # fmt: skip
for _unary, _kind in _UNARY:
    _add(_unary, getattr(torch, _unary), (_A(4, 8, kind=_kind),))
_add("pow", lambda x: torch.pow(x, 2.0), (_A(4, 8, kind="positive"),))
_add("softplus", F.softplus, (ROWS,))
_add("gelu", F.gelu, (ROWS,))
_add("silu", F.silu, (ROWS,))
_add("add", torch.add, (ROWS, ROWS))
_add("mul", torch.mul, (ROWS, ROWS))
_add("max_pool2d", lambda x: F.max_pool2d(x, 2), (_A(1, 2, 4, 4),))
_add("embedding", lambda w, idx: F.embedding(idx, w), (_A(6, 4),), _long(0, 5, 2))

# -- ops that take several floating inputs of possibly different dtypes (promote) ---------
_add("cat", lambda a, b: torch.cat([a, b]), (ROWS, ROWS))
_add("stack", lambda a, b: torch.stack([a, b]), (ROWS, ROWS))
_add("index_copy", lambda a, b, idx: torch.index_copy(a, 0, idx, b), (ROWS, _A(2, 8)), _long(0, 2))
_add("addcmul", torch.addcmul, (ROWS, ROWS, ROWS))
_add("addcdiv", torch.addcdiv, (ROWS, ROWS, _A(4, 8, kind="positive")))
_add("atan2", torch.atan2, (ROWS, ROWS))
_add("cross", lambda a, b: aten.cross.default(a, b, 1), (_A(4, 3), _A(4, 3)))  # aten::cross, not linalg_cross
_add("dot", torch.dot, (V, V))
_add("tensordot", lambda a, b: torch.tensordot(a, b, dims=1), (ROWS, _A(8, 3)))
_add(
    "scatter_add",
    lambda a, b, idx: torch.scatter_add(a, 0, idx, b),
    (ROWS, ROWS),
    lambda d: (torch.zeros(4, 8, dtype=torch.long, device=d),),
)
_add("bilinear", F.bilinear, (_A(4, 3), _A(4, 5), _A(2, 3, 5), _A(2)))

#: Every sample, by ATen op name.
SAMPLES: Final[Mapping[str, OpSample]] = dict(_samples)


def sample_for(op: str) -> OpSample | None:
    """The sample of ``op`` (``"aten::mm.default"``, ``"mm"``), or None when there is none."""
    return SAMPLES.get(op.removeprefix("aten::").split(".")[0])
