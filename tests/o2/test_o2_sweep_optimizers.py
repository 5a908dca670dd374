"""Held-out sweep (issue 31): every torch.optim optimizer, in each of its flavours, under
``ampcore.decorate`` at O2 in bfloat16 and float16, without a loss scaler and with ampcore's
and torch's GradScaler (a step of inf gradients skipped), against torch's optimizer stepping
float32 copies of the masters with the same widened gradients: the masters, the weights, the
optimizer state and the loss scale bit for bit after every step (``o2_sweep_harness.py``),
on a model with tied, 0-dim, empty, non-contiguous, frozen and sometimes gradient-less
parameters in two param groups.  ampcore's own updates (SGD, Adam, AdamW) run with the
one-pass CPU kernels and with torch's path (``AMPCORE_O2_ONEPASS``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from o2_sweep_harness import CASES, OWN, Options, train_both

from ampcore._o2 import master_adam, onepass, onepass_choice, onepass_loop

#: one chooser of each one-pass kernel per AMPCORE_O2_ONEPASS value (each builds and checks once)
_CHOOSERS: dict[str, tuple[onepass_choice.Chooser, onepass_choice.Chooser]] = {}


@pytest.fixture(params=["auto", "torch"], ids=["onepass-auto", "onepass-torch"])
def onepass_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """AMPCORE_O2_ONEPASS for ampcore's own updates, with choosers of that value."""
    mode: str = request.param
    monkeypatch.setenv(onepass.ENV, mode)
    if mode not in _CHOOSERS:
        _CHOOSERS[mode] = (onepass_choice.Chooser(onepass.FUSED), onepass_choice.Chooser(onepass_loop.LOOP))
    fused, loop = _CHOOSERS[mode]
    monkeypatch.setattr(onepass, "_chooser", fused)
    monkeypatch.setattr(onepass_loop, "_chooser", loop)
    yield mode


@pytest.mark.filterwarnings("ignore::ampcore._o2.onepass_choice.OnePassWarning")
@pytest.mark.parametrize("scaler", [None, "ampcore", "torch"], ids=["no-scaler", "ampcore-scaler", "torch-scaler"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", [name for name in CASES if name not in OWN])
def test_generic_path_is_torchs_optimizer_on_the_masters(name: str, dtype: str, scaler: str | None) -> None:
    if CASES[name].closure and scaler is not None:
        pytest.skip("GradScaler.step refuses closures")
    train_both(CASES[name], Options(dtype=dtype, scaler=scaler))


@pytest.mark.filterwarnings("ignore::ampcore._o2.onepass_choice.OnePassWarning")
@pytest.mark.parametrize("scaler", [None, "ampcore", "torch"], ids=["no-scaler", "ampcore-scaler", "torch-scaler"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", OWN)
def test_own_updates_are_torchs_optimizer_on_the_masters(
    name: str, dtype: str, scaler: str | None, onepass_mode: str
) -> None:
    train_both(CASES[name], Options(dtype=dtype, scaler=scaler))


def test_the_one_pass_kernels_ran_where_they_build(onepass_mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernels build here, the sweep's fused and for-loop Adam steps go through them
    (so that the comparisons above compare the kernels, not only torch's path)."""
    calls: list[str] = []
    for module, name in ((onepass, "adam_update"), (master_adam, "loop_adam_update")):
        original = getattr(module, name)

        def spy(*args: object, _original: object = original, _name: str = name, **kwargs: object) -> object:
            calls.append(_name)
            return _original(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(module, name, spy)
    for name in ("adam-fused", "adam-loop"):
        train_both(CASES[name], Options(steps=2))
    built = onepass.choice().name == "onepass" and onepass_loop.loop_choice().name == "onepass"
    if onepass_mode == "torch":
        assert onepass.choice().name == "torch" and not calls
    elif not built:
        pytest.skip(f"the one-pass kernels are not used here: {onepass.choice().reason}")
    else:
        assert set(calls) == {"adam_update", "loop_adam_update"}


@pytest.mark.parametrize("scaler", [None, "torch"], ids=["no-scaler", "torch-scaler"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_master_grad_float32_gradients(name: str, scaler: str | None) -> None:
    """``master_grad=True``: model and masters share backward's float32 gradients."""
    if not hasattr(torch.Tensor, "grad_dtype"):
        pytest.skip(f"master_grad needs Tensor.grad_dtype (torch >= 2.13); torch {torch.__version__}")
    if CASES[name].closure and scaler is not None:
        pytest.skip("GradScaler.step refuses closures")
    train_both(CASES[name], Options(dtype="fp16" if scaler else "bf16", scaler=scaler, master_grad=True))


@pytest.mark.filterwarnings("ignore::ampcore._o2.onepass_choice.OnePassWarning")
@pytest.mark.parametrize("scaler", [None, "ampcore", "torch"], ids=["no-scaler", "ampcore-scaler", "torch-scaler"])
@pytest.mark.parametrize("chunk", [7, 16, 100])
@pytest.mark.parametrize("name", OWN)
def test_own_updates_in_chunks(name: str, chunk: int, scaler: str | None, onepass_mode: str) -> None:
    """The chunked walk (the CPU's, for parameters larger than a chunk) with chunks so small
    that every parameter spans several, a tail included."""
    train_both(CASES[name], Options(dtype="fp16" if scaler else "bf16", scaler=scaler, chunk=chunk))
