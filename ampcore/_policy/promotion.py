"""Which ops reconcile mixed floating input dtypes by themselves, as autocast's ``promote`` would.

Inside a composite that a policy with custom lists decomposes, ops on no list follow the
*inner* policy, whose default is ``promote`` (:mod:`ampcore._policy.registration`): a
custom-listed op's cast may hand its neighbours inputs of mixed dtypes, which ops such as
``mm`` refuse.  For the ops here that step changes nothing, so they need no policy kernel
for it (:func:`ampcore._policy.decisions.unlisted`), and the dispatcher passes them by: an op
with at most one tensor argument (nothing to reconcile), or a binary pointwise op whose
TensorIterator promotes mixed floating inputs to the wider dtype itself
(:data:`TYPE_PROMOTING_POINTWISE`; the ops of torch's own ``promote`` lists are left out,
whatever this torch does, since torch casts them).

The one difference a reader may meet: a 0-dim float32 tensor next to a bfloat16 one keeps
the result bfloat16 natively (dimension categories), where ``promote`` gives float32.
"""

from __future__ import annotations

import functools
from typing import Final

import torch

from .torch_tables import NATIVE_TABLES

__all__ = ["TYPE_PROMOTING_POINTWISE", "promotes_natively"]

#: Pointwise overloads with two or more tensor arguments that return the wider floating dtype
#: of mixed bfloat16/float32 inputs in either order (probed on torch 2.13's CPU kernels;
#: tests/policy/test_promotion.py probes the installed torch).
TYPE_PROMOTING_POINTWISE: Final = frozenset(
    """
    add.Tensor atan2 clamp.Tensor clamp_max.Tensor clamp_min.Tensor clip.Tensor copysign.Tensor
    div.Tensor eq.Tensor fmax fmin fmod.Tensor ge.Tensor gelu_backward gt.Tensor hypot igamma
    igammac ldexp.Tensor le.Tensor logaddexp logaddexp2 logical_and logical_or logical_xor
    logit_backward lt.Tensor max.other maximum min.other minimum mul.Tensor
    native_dropout_backward ne.Tensor nextafter pow.Tensor_Tensor remainder.Tensor
    sigmoid_backward silu_backward special_xlog1py special_zeta sub.Tensor tanh_backward
    true_divide.Tensor xlogy.Tensor
    """.split()
)


@functools.cache
def _torch_promotes() -> frozenset[str]:
    """The overloads on any of torch's own ``promote`` lists."""
    return frozenset(o for table in NATIVE_TABLES.values() for o, policy in table.items() if policy == "promote")


def promotes_natively(overload: str, schema: torch.FunctionSchema) -> bool:
    """Whether autocast's ``promote`` step would change nothing a call of ``overload`` does
    by itself (see the module docstring)."""
    if overload in _torch_promotes():
        return False
    tensors = [str(a.type) for a in schema.arguments if "Tensor" in str(a.type)]
    if len(tensors) <= 1 and not any(t.startswith("List[") for t in tensors):
        return True
    return overload in TYPE_PROMOTING_POINTWISE
