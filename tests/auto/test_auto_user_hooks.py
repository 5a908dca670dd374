"""Issue 27: roots with forward pre-hooks of their own run settled programs.

FSDP2's ``fully_shard``, DeepSpeed ZeRO-3, accelerate's ``cpu_offload`` and users of
``register_forward_pre_hook(with_kwargs=True)`` put pre-hooks on the model a region calls
(its root).  torch runs a module's own pre-hooks after the global ones, so the sentinel
(a global pre-hook) took the root's signature before they changed the arguments and
before they put the parameters in place: such roots ran call by call (correct, not free).
Now the sentinel is the last of the root's own pre-hooks (:func:`._root_hooks.last_pre`).

Each case: its steps under auto (a plan loaded) equal them under the fixed precision the
plan gives (outputs, dtypes, gradients; :func:`test_auto_sweep3.fixed`), nothing of auto
left after each step (hooks of ours, dispatch modes, autocast state), also after an
exception; then further steps make no recording at all (:func:`counting_all`: also the
unrecorded ones of a call applied call by call, which the sweeps' counter does not see).
The hook pairs that gather or offload parameters simulate FSDP2 / ZeRO-3 / accelerate in
pure torch; FSDP2's own ``fully_shard`` runs on a one-process gloo group where it can.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_sweep import _flat
from test_auto_sweep3 import BF16, _auto, _backward, _clean, _decide, _equal, _mlp, _wide, fixed
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import ampcore
from ampcore._auto import _roots, _roots_state, _store

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

Step = Callable[[nn.Module, int, Any], Any]
MAKERS = pytest.mark.parametrize("make", [_mlp, _wide], ids=["low-default", "fp32-default"])


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every root call recorded or applied call by call from now on (a settled call runs its
    program: none)."""
    made: list[Any] = []
    real = _roots.Recording

    def counted(*args: Any) -> Any:
        made.append(args[0])
        return real(*args)

    monkeypatch.setattr(_roots, "Recording", counted)
    return made


def _none_left(model: nn.Module) -> None:
    _clean(model)
    assert _get_current_dispatch_mode_stack() == [], "a dispatch mode left"


def _tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's parameters as they are when its forward runs (a gathering hook's full ones)."""
    full = model.__dict__.get("full")
    return list(full.items()) if full is not None else list(model.named_parameters())


def _same_params(model: nn.Module, reference: nn.Module, what: str) -> None:
    for (name, p), (_, q) in zip(_tensors(model), _tensors(reference), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=f"{what}: {name}")
        assert (p.grad is None) == (q.grad is None), f"{what}: {name}.grad"
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=f"{what}: {name}.grad")


def run(make: Callable[[], nn.Module], step: Step, steps: int, made: list[Any], plain: Any = None) -> Any:
    """``step`` under auto equals it under :func:`fixed` step by step (the model made twice,
    seeded: FSDP2's cannot be copied), nothing left after each; then as many steps again make
    no recording.  ``plain``: a model of the same layers the plan is decided with."""
    torch.manual_seed(0)
    model = make()
    torch.manual_seed(0)
    reference = make()
    _decide(model if plain is None else plain, step, steps)
    for i in range(steps):
        _pair(model, reference, step, i)
    made.clear()
    for i in range(steps):
        step(model, i % steps, _auto)
        _none_left(model)
    assert made == [], f"{len(made)} root calls recorded or applied call by call in settled steps"
    return model


def _pair(model: nn.Module, reference: nn.Module, step: Step, i: int) -> None:
    """Step ``i`` under auto equals it under :func:`fixed`; nothing of auto left after it."""
    outs = []
    for m, enter in ((reference, fixed), (model, _auto)):
        torch.manual_seed(i)
        outs.append(step(m, i, enter))
    _none_left(model)
    _equal(outs[1], outs[0], f"step {i}")
    _same_params(model, reference, f"step {i}")


def _train(model: nn.Module, x: torch.Tensor, enter: Any, **kw: Any) -> Any:
    with enter(BF16):
        out = model(x, **kw)
    _backward(out)
    return out


def _noop(module: nn.Module, args: tuple[Any, ...]) -> None:
    module.seen = args[0].shape  # (reads its input, changes nothing)


def _hooked(make: Callable[[], nn.Module], hook: Any, **how: Any) -> Callable[[], nn.Module]:
    def made() -> nn.Module:
        model = make()
        model.calls = 0  # (on the module: copies count their own calls)
        model.register_forward_pre_hook(hook, **how)
        return model

    return made


X = torch.randn(8, 16)


# --- (1) hooks that change the arguments ----------------------------------------------------


@MAKERS
def test_a_no_op_pre_hook_on_the_root(make: Any, recordings: list[Any]) -> None:
    run(_hooked(make, _noop), lambda m, i, enter: _train(m, X, enter), 3, recordings)


def _new_args(module: nn.Module, args: tuple[Any, ...]) -> Any:
    """Casts the input to bfloat16 on even calls, doubles the batch on every third."""
    module.calls += 1
    (x,) = args
    if module.calls % 3 == 0:
        return torch.cat([x, x])
    return x.to(BF16) if module.calls % 2 == 0 else None


@MAKERS
def test_a_pre_hook_that_returns_new_arguments(make: Any, recordings: list[Any]) -> None:
    run(_hooked(make, _new_args), lambda m, i, enter: _train(m, X, enter), 6, recordings)


class Scaled(nn.Module):
    def __init__(self, make: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.body = make()

    def forward(self, x: torch.Tensor, scale: float = 1.0, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.body(x * scale)
        return h if mask is None else h * mask


def _with_kwargs(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Returns (args, kwargs): a new scale, a mask added, the input in bfloat16 on odd calls."""
    module.calls += 1
    (x,) = args
    kwargs = {**kwargs, "scale": 0.5 if module.calls % 2 else 2.0, "mask": torch.ones(x.shape[0], 1)}
    return ((x.to(BF16) if module.calls % 2 else x,), kwargs)


@MAKERS
def test_a_with_kwargs_pre_hook_that_returns_args_and_kwargs(make: Any, recordings: list[Any]) -> None:
    run(_hooked(lambda: Scaled(make), _with_kwargs, with_kwargs=True), lambda m, i, e: _train(m, X, e), 4, recordings)


# --- (2) hooks that put the parameters in place ---------------------------------------------


def _gather(module: nn.Module, args: tuple[Any, ...]) -> None:
    """FSDP2 / ZeRO-3 in pure torch: the full parameters go in place for the forward (the
    same objects each step: gradients accumulate there), an empty placeholder between."""
    for owner, name, full, _ in module.slots:
        owner._parameters[name] = full


def _reshard(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
    for owner, name, _, shard in module.slots:
        owner._parameters[name] = shard


def _offload(module: nn.Module, args: tuple[Any, ...]) -> None:
    """accelerate's offload in pure torch: new parameter objects each call, made from the
    stored weights (a copy: the storage moves), placeholders on the meta device between."""
    for owner, name, full, _ in module.slots:
        owner._parameters[name] = nn.Parameter(full.detach().clone(), requires_grad=False)


def _sharded(make: Callable[[], nn.Module], pre: Any, meta: bool = False) -> Callable[[], nn.Module]:
    def made() -> nn.Module:
        model = make()
        slots = []
        for owner in model.modules():
            for name, p in list(owner._parameters.items()):
                shard = nn.Parameter(torch.empty(0, device="meta" if meta else "cpu"))
                slots.append((owner, name, p, shard))
                owner._parameters[name] = shard
        model.slots = slots
        model.full = {f"{i}": s[2] for i, s in enumerate(slots)}
        model.register_forward_pre_hook(pre)
        model.register_forward_hook(_reshard, always_call=True)
        return model

    return made


@MAKERS
def test_a_gathering_hook_pair_as_fsdp2_and_zero3(make: Any, recordings: list[Any]) -> None:
    model = run(_sharded(make, _gather), lambda m, i, enter: _train(m, X, enter), 3, recordings)
    assert all(p.numel() == 0 for p in model.parameters())  # resharded after each step


@MAKERS
def test_an_offloading_hook_pair_as_accelerate(make: Any, recordings: list[Any]) -> None:
    def step(model: nn.Module, i: int, enter: Any) -> Any:
        with torch.no_grad(), enter(BF16):
            return model(X + i)

    run(_sharded(make, _offload, meta=True), step, 3, recordings)


@pytest.fixture
def fsdp2(tmp_path: Path) -> Iterator[Any]:
    """``torch.distributed.fsdp`` with a gloo group of one process for the test."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    fsdp = pytest.importorskip("torch.distributed.fsdp", reason="this torch has no FSDP2")
    if not hasattr(fsdp, "fully_shard"):
        pytest.skip("this torch has no torch.distributed.fsdp.fully_shard (FSDP2)")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield fsdp
    finally:
        dist.destroy_process_group()


def _fully_sharded(fsdp: Any, **how: Any) -> nn.Module:
    model = _mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fsdp.fully_shard(layer, **how)
    return fsdp.fully_shard(model, **how)  # type: ignore[no-any-return]


def test_fsdp2_fully_shard_on_one_process(fsdp2: Any, recordings: list[Any]) -> None:
    """``torch.distributed.fsdp.fully_shard`` on each Linear and the root, a gloo group of
    one process (the gathering and freeing are FSDP2's own)."""
    run(lambda: _fully_sharded(fsdp2), lambda m, i, enter: _train(m, X, enter), 3, recordings, plain=_mlp())


def test_fsdp2_with_bfloat16_parameters(fsdp2: Any, recordings: list[Any]) -> None:
    """``MixedPrecisionPolicy(param_dtype=bfloat16)``: each layer's own pre-hook (FSDP2's
    unshard) casts its weights.  The global hooks that record a root's call saw them before
    it (float32 shards): the layer was planned, then measured with float32 inputs on its
    bfloat16 weights (``mat1 and mat2 must have the same dtype``; de3c7f1 too).  Now the
    recording's pre-hook is each such layer's last (``_hooks.defer``): its bfloat16 weights
    run it with the O1 lists, as torch.autocast (measured plan: nothing to measure)."""
    policy = fsdp2.MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=torch.float32)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(_fully_sharded(fsdp2, mp_policy=policy))
    model, reference = models
    for i in range(4):
        if i == 2:
            recordings.clear()
        got = _train(model, X + i, _auto)
        want = _train(reference, X + i, lambda dtype: torch.autocast("cpu", dtype=dtype))
        _none_left(model)
        _equal(got, want, f"step {i}")
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad.to_local(), q.grad.to_local(), rtol=0, atol=0)
    assert recordings == [], "settled"


@MAKERS
def test_a_layers_own_pre_hook_that_raises_while_its_root_is_recorded(make: Any, recordings: list[Any]) -> None:
    """The recording's pre-hook is the layer's last one for that call (``_hooks.defer``):
    gone after the call, also when the layer's own hook raised."""
    model = make()
    layer = model[2] if isinstance(model[2], nn.Linear) else model[1]

    def raises(module: nn.Module, args: tuple[Any, ...]) -> None:
        module.calls += 1
        if module.calls in (1, 3):
            raise ValueError("bad layer input")

    layer.register_forward_pre_hook(raises)
    layer.calls = 10
    _decide(model, lambda m, i, enter: _train(m, X, enter), 1)
    reference = copy.deepcopy(model)
    layer.calls = 0
    for i in range(6):
        if i == 4:
            recordings.clear()
        try:
            got = _train(model, X + i, _auto)
        except ValueError:
            got = None
        _none_left(model)
        assert (got is None) == (i in (0, 2)), i
        if got is not None:
            _equal(got, _train(reference, X + i, fixed), f"step {i}")
    assert recordings == []


@pytest.mark.parametrize("world", [1, 2])
def test_no_whole_call_check_in_a_group_of_several_processes(
    world: int, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """A root that now settles under FSDP2 or ZeRO-3 gets a mixed program's whole-call
    check: its forward and backward again, on one rank (their collectives would wait for
    ever for the others).  In a group of several processes (faked) the check is skipped and
    warned about; alone, it runs."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: world)
    monkeypatch.setattr(_roots_state, "_GROUP_WARNED", [False])
    clocks: list[Any] = []
    real = _roots.settle

    def settle(*args: Any) -> Any:
        clocks.append(args[-1])
        return real(*args)

    monkeypatch.setattr(_roots, "settle", settle)
    model = _sharded(_mlp, _gather)()
    step = lambda m, i, enter: _train(m, X, enter)  # noqa: E731
    _decide(model, step, 1, measured=True)  # (a plan that measures: checks may run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ampcore.AmpcoreWarning)
        for i in range(3):
            step(model, i, _auto)
            _none_left(model)
    assert clocks, "the root met no program"
    assert all(c is None for c in clocks) == (world > 1), clocks
    assert any("process group" in str(w.message) for w in caught) == (world > 1)


# --- (3) hooks registered, removed and reordered between and inside regions ------------------


def _steps(model: nn.Module, reference: nn.Module, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        _pair(model, reference, lambda m, i, enter: _train(m, X + i, enter), i)


@MAKERS
def test_a_hook_registered_and_removed_between_steps(make: Any, recordings: list[Any]) -> None:
    model = make()
    _decide(model, lambda m, i, enter: _train(m, X + i, enter), 6)
    reference = copy.deepcopy(model)
    _steps(model, reference, 2)
    handles = [m.register_forward_pre_hook(_noop) for m in (model, reference)]
    _steps(model, reference, 2, 2)  # the first of them is applied call by call
    recordings.clear()
    _steps(model, reference, 2, 2)
    assert recordings == []
    for handle in handles:
        handle.remove()
    _steps(model, reference, 2, 4)
    recordings.clear()
    _steps(model, reference, 2, 4)
    assert recordings == []


def _bf16(module: nn.Module, args: tuple[Any, ...]) -> Any:
    return (args[0].to(BF16),)


@MAKERS
@pytest.mark.parametrize("prepend", [False, True], ids=["appended", "prepended"])
def test_a_hook_added_inside_one_long_region_after_the_root_settled(
    make: Any, prepend: bool, recordings: list[Any]
) -> None:
    """One region around the whole loop: a hook that casts the input registered after the
    root settled, behind the sentinel (``prepend=False``, the default: ours goes last again)
    or before it (``prepend=True``); then a second hook appended after the first."""
    model = _hooked(make, _noop)()
    _decide(model, lambda m, i, enter: _train(m, X, enter), 1)
    reference = copy.deepcopy(model)
    got: list[Any] = []
    with _auto(BF16):
        for i in range(8):
            if i == 2:
                model.register_forward_pre_hook(_bf16, prepend=prepend)
            if i == 5:
                model.register_forward_pre_hook(_noop)
            if i in (4, 7):
                recordings.clear()
            got.append(model(X + i))
            assert not (i in (4, 7) and recordings), f"step {i}: {len(recordings)} recordings"
    _none_left(model)
    for i, out in enumerate(got):
        with fixed(BF16):
            want = reference(X + i if i < 2 else (X + i).to(BF16))
        _equal(out, want, f"call {i}")


def _raises(module: nn.Module, args: tuple[Any, ...]) -> None:
    module.calls += 1
    if module.calls in (2, 4):
        raise ValueError("bad batch")


@MAKERS
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_pre_hook_that_raises_leaves_nothing(make: Any, where: str, recordings: list[Any]) -> None:
    """A hook before the sentinel raises (nothing of ours ran yet), or one registered after
    it inside the region (the sentinel ran: its call applied call by call is undone)."""
    model = _hooked(make, _noop)()
    model.calls = 0
    if where == "before":
        model.register_forward_pre_hook(_raises, prepend=True)
    _decide(model, lambda m, i, enter: _train(m, X, enter), 1)
    reference = copy.deepcopy(model)
    for i in range(6):
        for m in (model, reference):
            m.calls = i
        with contextlib.ExitStack() as stack:
            stack.enter_context(_auto(BF16))
            if where == "after":
                handle = model.register_forward_pre_hook(_raises)
                stack.callback(handle.remove)
            try:
                got = model(X + i)
            except ValueError:
                got = None
        _none_left(model)
        if got is not None:
            model.calls = reference.calls = i
            with fixed(BF16):
                _equal(got, reference(X + i), f"step {i}")
    model.calls = 10  # (no more raising)
    for i in range(4):  # a new place: its first call (met with hooks of its own) runs call by call,
        if i == 2:  # the next one records (the hook after the sentinel: no earlier call recorded)
            recordings.clear()
        with _auto(BF16):
            model(X + i)
    _none_left(model)
    assert recordings == []


# --- (4) a global pre-hook of the user's ----------------------------------------------------


@contextlib.contextmanager
def _global_hook(root_of: list[nn.Module]) -> Iterator[None]:
    """A global pre-hook that casts the input of the roots in ``root_of`` to bfloat16."""

    def cast(module: nn.Module, args: tuple[Any, ...]) -> Any:
        return (args[0].to(BF16),) if any(module is r for r in root_of) else None

    handle = nn.modules.module.register_module_forward_pre_hook(cast)
    try:
        yield
    finally:
        handle.remove()


@MAKERS
@pytest.mark.parametrize("when", ["before-the-regions", "inside-a-region"])
@pytest.mark.parametrize("own", [False, True], ids=["no-own-hooks", "own-hook"])
def test_a_global_pre_hook_of_the_users(make: Any, when: str, own: bool, recordings: list[Any]) -> None:
    """torch runs global pre-hooks before a module's own, in order: one registered inside a
    region comes after the sentinel (a global one for a root without pre-hooks of its own)."""
    model = _hooked(make, _noop)() if own else make()
    _decide(model, lambda m, i, enter: _train(m, X, enter), 1)
    reference = copy.deepcopy(model)
    roots = [model, reference]
    got, want = [], []
    with contextlib.ExitStack() as outer:
        if when == "before-the-regions":
            outer.enter_context(_global_hook(roots))
        for i in range(6):
            with _auto(BF16):
                if when == "inside-a-region" and i == 2:
                    outer.enter_context(_global_hook(roots))
                if i == 5:
                    recordings.clear()
                got.append(model(X + i))
            with fixed(BF16):
                want.append(reference(X + i))
    _none_left(model)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _equal(g, w, f"step {i}")
    assert recordings == [], "settled"


def test_the_sentinel_is_the_last_pre_hook_and_leaves_with_the_region() -> None:
    model = _hooked(_mlp, _noop)()
    _decide(model, lambda m, i, enter: _train(m, X, enter), 1)
    for _ in range(2):
        with _auto(BF16):
            model(X)
            keys = list(model._forward_pre_hooks)
            assert len(keys) == 2 and type(keys[0]) is int and type(keys[-1]) is not int
            assert keys[-1] in model._forward_pre_hooks_with_kwargs
        assert all(type(k) is int for k in [*model._forward_pre_hooks, *model._forward_pre_hooks_with_kwargs])
    _none_left(model)
    assert not any(type(t) is not torch.Tensor for t in _flat(model(X)))
    assert ampcore.active_region() is None


def _ours(module: nn.Module) -> list[Any]:
    """Keys in ``module``'s hook dicts that are not torch's handle ids (ours, or copies of ours)."""
    dicts = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs")
    return [k for m in module.modules() for d in dicts for k in getattr(m, d) if type(k) is not int]


class _Inert:
    """A pre-hook that does nothing (what :class:`_CopyInForward` becomes in its copies)."""

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        return None


class _CopyInForward(_Inert):
    """A layer's pre-hook that copies the whole model at its first call (an EMA copy in the
    forward), while the root's call is recorded."""

    def __init__(self, duplicate: Callable[[nn.Module], nn.Module]) -> None:
        self.duplicate, self.model, self.copies = duplicate, None, list[nn.Module]()

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self.model is not None and not self.copies:
            self.copies.append(self.duplicate(self.model))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Inert, ())


def _duplicate(how: str) -> Callable[[nn.Module], nn.Module]:
    def duplicate(m: nn.Module) -> nn.Module:
        if how == "deepcopy":
            return copy.deepcopy(m)
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    return duplicate


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("when", ["in-region", "in-forward"])
def test_a_copy_made_while_the_root_is_hooked_keeps_no_hook_of_ours(how: str, when: str) -> None:
    """A root (or a layer of a recorded root) copied while our keys are in its dicts (an EMA
    copy in the step, a whole model pickled in the region): the copy's entries are strays,
    gone at its next call outside a region and never applied twice in a region."""
    hook = _CopyInForward(_duplicate(how))
    model = _hooked(_mlp, _noop)()
    model[0].register_forward_pre_hook(hook)
    reference = copy.deepcopy(model)
    _decide(model, lambda m, i, enter: _train(m, X, enter), 1)
    for _ in range(3):
        with _auto(BF16):
            if when == "in-forward" and hook.model is None:  # armed for a recorded call:
                hook.model = model  # the layers' own pre-hooks deferred (_hooks.defer)
                _store.forget()
            model(X)
            if when == "in-region" and not hook.copies:
                hook.copies.append(_duplicate(how)(model))
    (clone,) = hook.copies
    clone(X)  # outside a region: a stray of ours goes
    assert _ours(clone) == [], "a hook of ours left on the copy"
    for _ in range(3):  # in regions the copy is a root of its own, its results the fixed choice's
        with _auto(BF16):
            got = clone(X)
        with fixed(BF16):
            want = reference(X)
        _equal(got, want, "copy")
        assert _ours(clone) == []
    _none_left(model)
