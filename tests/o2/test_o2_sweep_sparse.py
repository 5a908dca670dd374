"""Held-out sweep (issue 31): sparse gradients (``nn.Embedding(sparse=True)``) under O2,
against torch's optimizers on float32 copies of the masters, bit for bit
(``o2_sweep_harness.py``): SparseAdam (its only use), SGD with and without momentum in both
flavours, Adagrad; where torch refuses sparse gradients (SGD's weight decay), the same error.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from o2_sweep_harness import Case, Options, build, step, train_both

#: SparseAdam takes only parameters with sparse gradients: the embedding alone
_DENSE = frozenset(
    ("lin.weight", "lin.bias", "norm.weight", "norm.bias", "scalar", "empty", "strided")
    + ("side.weight", "side.bias", "wide.weight", "wide.bias", "frozen.weight", "frozen.bias")
)
_O = torch.optim
SPARSE: dict[str, Case] = {
    "sparse-adam": Case(lambda g: _O.SparseAdam(g, lr=0.01), exclude=_DENSE, sparse=True, one_group=True),
    "sparse-adam-maximize": Case(
        lambda g: _O.SparseAdam(g, lr=0.01, betas=(0.5, 0.9), maximize=True), exclude=_DENSE, sparse=True
    ),
    "sgd-loop": Case(lambda g: _O.SGD(g, lr=0.1, foreach=False), sparse=True),
    "sgd-foreach": Case(lambda g: _O.SGD(g, lr=0.1, foreach=True), sparse=True),
    "sgd-momentum-loop": Case(lambda g: _O.SGD(g, lr=0.1, momentum=0.9, foreach=False), sparse=True),
    "sgd-momentum-foreach": Case(lambda g: _O.SGD(g, lr=0.1, momentum=0.9, nesterov=True, foreach=True), sparse=True),
    "adagrad-loop": Case(lambda g: _O.Adagrad(g, lr=0.1, foreach=False), sparse=True),
}


@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")  # torch's Adagrad builds one
@pytest.mark.parametrize("scaler", [None, "ampcore", "torch"], ids=["no-scaler", "ampcore-scaler", "torch-scaler"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", sorted(SPARSE))
def test_sparse_gradients_as_torch_on_the_masters(name: str, dtype: str, scaler: str | None) -> None:
    train_both(SPARSE[name], Options(dtype=dtype, scaler=scaler))


def _fails(run: Callable[[], None]) -> BaseException:
    with pytest.raises(RuntimeError) as raised:
        run()
    return raised.value


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_sparse_gradients_torch_refuses_are_refused_as_torch(dtype: str) -> None:
    case = Case(lambda g: _O.SGD(g, lr=0.1, weight_decay=0.1, foreach=False), sparse=True)
    options = Options(dtype=dtype)
    dec, ref = build(case, options)
    refused = _fails(lambda: step(ref, 0, options, widen=True, closure=False))
    before = {key: value.clone() for key, value in dec.model.state_dict().items()}
    mine = _fails(lambda: step(dec, 0, options, widen=False, closure=False))
    assert str(mine) == str(refused)
    assert all(torch.equal(value, before[key]) for key, value in dec.model.state_dict().items())
