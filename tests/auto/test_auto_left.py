"""Issue 27, eleventh stop: the gaps the last stop noticed and left alone.

1. Two threads recording one model at once: each thread's layers with pre-hooks of their own
   are planned after those hooks (``_hooks.defer`` keys per thread; one thread's end of
   recording left the other's layers to the global hook for the rest of its call).
2. Roots applied call by call for good (arguments the guard cannot see, churning
   signatures) plan such layers after their own hooks too.
3. Hand-written plan entries (no costs) loaded unfrozen: applied, kept out of the cache's
   measured figures, never refused by the next process.
4. A deepcopy or pickle made while a program runs keeps no key of the running program.
5. ``_kinds`` judges a class per instance where its forward's products differ by instance.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep3 import BF16, _auto, _clean, _decide, _equal, _wide, fixed
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

X = torch.randn(8, 16)


def _half_weights(layer: nn.Linear) -> None:
    """FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16)`` in pure torch: the layer's own
    pre-hook puts bfloat16 weights in place for its forward (its float32 ones back after)."""
    master = dict(layer._parameters)

    def pre(module: nn.Module, args: tuple[Any, ...]) -> None:
        for name, p in master.items():
            module._parameters[name] = nn.Parameter(p.detach().to(BF16), requires_grad=False)

    def post(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        module._parameters.update(master)

    layer.register_forward_pre_hook(pre)
    layer.register_forward_hook(post)


def _model() -> nn.Sequential:
    """:func:`_wide` (its Linear(16, 16) layers decided float32) with bfloat16 weights put in
    place by the own pre-hook of its third layer: run with the O1 lists, as torch.autocast."""
    torch.manual_seed(0)
    model = _wide()
    _half_weights(model[2])
    return model


def _reference(x: torch.Tensor) -> Any:
    """:func:`_model`'s output under :func:`fixed`: its third layer's weights bfloat16 for good."""
    torch.manual_seed(0)
    model = _wide()
    model[2].to(BF16)
    with torch.no_grad(), fixed(BF16):
        return model(x)


def _plan_for(model: nn.Module) -> None:
    torch.manual_seed(0)
    _decide(_wide(), lambda m, i, enter: _call(m, X, enter), 1)  # the same layers, no hook


def _call(model: nn.Module, x: Any, enter: Callable[[torch.dtype], Any]) -> Any:
    with torch.no_grad(), enter(BF16):
        return model(x)


# --- (1) two threads recording one model at once ---------------------------------------------


def test_two_threads_recording_one_model_at_once_plan_each_layer_after_its_own_hooks() -> None:
    """Thread A's recording ends while thread B's is inside the model (B waits in the second
    layer's own pre-hook until A is done): B's third layer, whose own pre-hook puts bfloat16
    weights in place, is still planned after that hook (before: A's end of recording removed
    the one deferral both shared, the global hook planned B's layer on its float32 weights
    and ran it in float32 on bfloat16 weights: ``mat1 and mat2 must have the same dtype``)."""
    model = _model()
    _plan_for(model)
    want = _reference(X)
    b_inside, a_done = threading.Event(), threading.Event()

    def wait(module: nn.Module, args: tuple[Any, ...]) -> None:
        if threading.current_thread().name == "A":
            assert b_inside.wait(30), "B never entered"
        elif threading.current_thread().name == "B":
            b_inside.set()
            assert a_done.wait(30), "A never finished"

    model[1].register_forward_pre_hook(wait)
    got: dict[str, Any] = {}

    def worker() -> None:
        name = threading.current_thread().name
        try:
            got[name] = _call(model, X, _auto)
        except BaseException as exc:  # noqa: BLE001 - compared below
            got[name] = exc
        finally:
            if name == "A":
                a_done.set()
            else:
                b_inside.set()

    threads = [threading.Thread(target=worker, name=n) for n in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for name in ("A", "B"):
        assert not isinstance(got[name], BaseException), f"{name}: {got[name]!r}"
        _equal(got[name], want, name)
    _clean(model)


# --- (2) roots applied call by call for good -------------------------------------------------


class _Root(nn.Module):
    """:func:`_model` behind a forward that takes an argument the guard cannot see (a callable)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _model()

    def forward(self, x: torch.Tensor, then: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return out if then is None else then(out)


def _casts_input(layer: nn.Module) -> None:
    """A layer's own pre-hook that casts its input to bfloat16 (an offload or a user's hook)."""
    layer.register_forward_pre_hook(lambda m, args: (args[0].to(BF16),))


class _ToLow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(BF16)


@pytest.mark.parametrize("own", ["weights", "input"])
@pytest.mark.parametrize("why", ["unsigned", "churning"])
def test_a_root_applied_call_by_call_plans_layers_after_their_own_hooks(
    why: str, own: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root whose calls the guard cannot see (a callable among its arguments), or one whose
    signatures churn (a new batch size every call, beyond its table), applies the plan call
    by call for good: its third layer, whose own pre-hook puts bfloat16 weights in place
    (FSDP2's ``param_dtype``) or casts its input to bfloat16, is planned after that hook on
    every call, as a recorded root's (before: only on the first call; later ones planned it
    float32 on its float32 weights and ran it on bfloat16 ones, ``mat1 and mat2 must have
    the same dtype``, or cast the bfloat16 input to float32 and ran the layer in float32)."""
    from ampcore._auto import _store

    monkeypatch.setattr(_store, "_MAX_SIGNATURES", 2)
    root = _Root()
    if own == "input":
        root.body[2]._forward_pre_hooks.clear()
        root.body[2]._forward_hooks.clear()
        _casts_input(root.body[2])
    torch.manual_seed(0)
    batches = [9 + i % 8 for i in range(12)] if why == "churning" else [8] * 4
    plain = _wide()
    _decide(plain, lambda m, i, enter: [_call(m, torch.randn(b, 16), enter) for b in sorted(set(batches))], 1)
    reference = _wide()
    reference.load_state_dict(root.body.state_dict())
    if own == "weights":
        reference[2].to(BF16)
    else:  # the cast as a module of its own before the layer: the layer planned on its result
        reference = nn.Sequential(*reference[:2], _ToLow(), *reference[2:])
    for i, b in enumerate(batches):
        x = torch.randn(b, 16)
        with torch.no_grad():
            with _auto(BF16):
                got = root(x, torch.relu) if why == "unsigned" else root(x)
            with fixed(BF16):
                out = reference(x)
                want = torch.relu(out) if why == "unsigned" else out
        _equal(got, want, f"call {i}")
    _clean(root)
