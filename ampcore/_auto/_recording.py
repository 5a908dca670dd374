"""Recordings: one root call while :mod:`._hooks`' global module hooks apply the plan.

A :class:`Recording` notes which planned modules ran, with which decision, and what a
float32 default would change outside them (:class:`_Outside`, a dispatch mode present only
while recording); :meth:`Recording.program` turns it into the root's
:class:`~._program.Program` for the call's input signature.  It also notes what the
program cannot replay (:mod:`._guard`): planned calls whose input shapes may change while
the root's signature does not (after a data-dependent op such as ``torch.nonzero``,
boolean indexing or ``.item()``; shapes that do not follow from the root's arguments; a
kind whose shape classes decide differently in the plan), guarded per call, and planned
calls inside ``torch.utils.checkpoint``, which follow the autocast state there.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Final

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ._costs import Decision, family
from ._entered import casts_inputs
from ._guard import low_held, snapshot, unseen_modules
from ._heal import cell
from ._hook_probe import low_hooks
from ._loose import explained, follows
from ._plan import AutoPlan
from ._program import _LOW, Program, local
from ._settings import before, watch
from ._shapes import float32_weights

__all__ = ["Recording"]

#: recordings of one root and signature that may fail (a class left undecided) before the
#: program treats what is still undecided as the O1 lists do (low precision)
_TRIES: Final = 3
#: ops whose output shape or value depends on the data (nonzero, boolean indexing, .item())
_DYNAMIC: Final = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)


def _dynamic(func: Any, args: Any) -> bool:
    """Whether ``func`` gives a shape or a size that depends on the data: ``torch.nonzero``,
    ``masked_select``, ``bincount``, indexing with a boolean mask, ``.item()`` / ``int()`` of
    an integer tensor (a count).  Not counted: indexing with integer tensors (the indices'
    shape) and ``.item()`` / ``bool()`` of a floating or boolean tensor (a loss logged, a
    mask tested: ``if torch.all(mask)``), which pick no size."""
    if not any(t in _DYNAMIC for t in getattr(func, "tags", ())):
        return False
    if func is _INDEX:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
    if func is _SCALAR:
        return not args[0].is_floating_point() and not args[0].is_complex() and args[0].dtype != torch.bool
    return True


#: ops outside autocast's lists whose kernels run products of the lists inside, through
#: the dispatcher, where autocast casts them (``nn.Bilinear``'s ``_trilinear`` and
#: ``F.affine_grid``'s ``affine_grid_generator`` run ``bmm`` in low precision under
#: autocast): what a float32 default changes, as a listed op.  Of about 60 products,
#: distances, cells, attention, norms, losses, spectral, sampling and linear-algebra ops run
#: under autocast with and without a dispatch mode (torch 2.13, CPU), only these differed
#: (``tests/auto/test_auto_sweep10_inner.py`` checks the list).  Not every composite op
#: without an autocast kernel: ``_euclidean_dist`` and ``linalg_pinv`` are reached under
#: ``cdist``'s and ``pinverse``'s float32 kernels, where autocast is off on purpose
_INNER_PRODUCTS: Final = frozenset({"_trilinear", "affine_grid_generator"})


def _autocast_inside(device_type: str) -> Any:
    """The dispatcher's state with ``device_type``'s autocast key not excluded: a dispatch
    mode's handler runs an op with every key above it excluded, so an op of
    :data:`_INNER_PRODUCTS` would run its inner products in float32 there, where the
    region (autocast on outside planned modules) runs them in low precision."""
    try:  # (private torch API: a torch without it records as before)
        key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type), None)
        include, exclude = torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()
    except (AttributeError, RuntimeError):
        return contextlib.nullcontext()
    if key is None or not exclude.has(key) or not hasattr(torch._C, "_ForceDispatchKeyGuard"):
        return contextlib.nullcontext()
    return torch._C._ForceDispatchKeyGuard(include, exclude.remove(key))


_INDEX: Final = torch.ops.aten.index.Tensor
_SCALAR: Final = torch.ops.aten._local_scalar_dense.default


def _to_low(args: Any, kwargs: Any) -> bool:
    """Whether a ``_to_copy`` casts a float32 tensor to low precision: autocast's cast for an
    op of its low-precision list, also one that reaches the dispatch mode only decomposed
    (``scaled_dot_product_attention`` runs as ``_scaled_dot_product_flash_attention_for_cpu``)."""
    return bool(kwargs) and kwargs.get("dtype") in _LOW and bool(args) and args[0].dtype == torch.float32


class _Outside(TorchDispatchMode):
    """While recording: notes what a float32 default would change outside planned modules:
    an op of the O1 low-precision list or a cast of a float32 tensor to low precision
    (``low_outside`` too: the whole-call check applies),
    or any op given a low-precision floating tensor of the region's device type (autocast
    may cast it, and a float32 default would not)."""

    def __init__(self, rec: Recording, white: frozenset[str], device_type: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.rec, self.white, self.device_type = rec, white, device_type

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        rec = self.rec
        if not rec.dynamic and not local.measuring and _dynamic(func, args):
            rec.dynamic = True  # the planned calls after it may see shapes the signature does not show
        if not rec.planned and not rec.low_outside and not local.measuring:
            packet = getattr(func, "overloadpacket", None)  # higher-order ops have none
            name = getattr(packet, "__name__", None)
            if name in self.white or name in _INNER_PRODUCTS or (name == "_to_copy" and _to_low(args, kwargs)):
                rec.outside = rec.low_outside = True
            elif not rec.outside and self._low_input(args, kwargs):
                rec.outside = True
        if not rec.planned and not local.measuring and getattr(func, "_opname", None) in _INNER_PRODUCTS:
            with _autocast_inside(self.device_type):  # as without this mode: the region's autocast
                return func(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))

    def _low_input(self, args: Any, kwargs: Any) -> bool:
        values = [*args, *(kwargs or {}).values()]
        for value in values:
            if isinstance(value, (list, tuple)):
                values.extend(value)  # one level: the tensor lists of cat, stack, ...
            elif isinstance(value, torch.Tensor) and value.dtype in _LOW and value.device.type == self.device_type:
                return True
        return False


class Recording:
    """One root call while the global hooks run: the planned calls and their decisions."""

    def __init__(self, root: nn.Module, region: Any, plan: AutoPlan, white: frozenset[str] | None, done: Any) -> None:
        self.root, self.region, self.plan, self.changes = root, region, plan, plan.changes
        self.added = plan.added  # classes added since make a program with undecided calls stale
        #: called as done(recording, args, kwargs, ok) when the root call ended
        self.done = done
        self.stack: list[tuple[nn.Module, bool]] = []
        self.planned = 0
        self.calls: dict[int, tuple[nn.Module, Decision | None]] = {}
        self.sequence: dict[int, list[Decision | None]] = {}  # each module's decisions in call order
        self.keys: list[str] = []  # the shape classes of the planned calls (:func:`._heal.cell`)
        self.outside = False
        self.low_outside = False  # an op of the O1 low-precision list ran outside planned modules
        #: planned calls whose shapes may change while the root's signature does not (after
        #: a data-dependent op, or shapes that do not follow from the root's arguments):
        #: guarded per call; and planned calls inside torch.utils.checkpoint (unplanned)
        self.dynamic = False
        self.inner: dict[int, nn.Module] = {}
        self.watch: dict[int, nn.Module] = {}
        self.ambient: dict[int, nn.Module] = {}
        self.dims: dict[int, set[int]] = {}  # the input dimensions of each planned module's calls
        self.kinds: dict[tuple[Any, ...], set[str]] | None = None  # family -> the plan's decisions
        self.saving_ms = 0.0  # sum of low - fp32 ms over the float32-decided calls
        self.args: tuple[Any, ...] = ()  # the root call's arguments as called
        #: the call's signature taken before its forward (which may change a list argument)
        self.sig: tuple[Any, ...] | None = None
        self.kept = True  # False: no program kept, only whether it ran all in float32 (all_fp32)
        #: None: the global hooks apply the plan to this call, nothing is recorded
        self.mode = None if white is None else _Outside(self, white, region.spec.backend.device_type)
        #: the root's watched settings at the call's start (:mod:`._settings`)
        self.settings = None if self.mode is None else before(list(root.modules()))
        if self.mode is not None:
            if low_hooks(root):  # its own pre-hooks (run before this) made low-precision tensors
                self.outside = self.low_outside = True
            self.mode.__enter__()  # type: ignore[no-untyped-call]

    def note(
        self,
        module: nn.Module,
        decision: Decision | None,
        saving_ms: float = 0.0,
        args: tuple[Any, ...] = (),
        key: str = "",
    ) -> None:
        """A planned call of ``module`` on ``args`` (shape class ``key``), its decision and
        what float32 saves there (ms)."""
        if self.mode is None:  # nothing is recorded (the plan applies call by call)
            return
        self.saving_ms += saving_ms
        if self.dynamic:
            self.inner[id(module)] = module  # guarded, not part of the program
        else:  # whether its shapes follow the root's arguments: decided with the signature
            self.dims.setdefault(id(module), set()).update(
                d for a in args if isinstance(a, torch.Tensor) for d in a.shape
            )
        if key and self._differs(key):
            self.watch[id(module)] = module  # guarded, and part of the program (for its check)
        self.calls[id(module)] = (module, decision)
        if key:
            self.keys.append(key)
        self.sequence.setdefault(id(module), []).append(decision)

    def _differs(self, key: str) -> bool:
        """Whether the plan holds classes of ``key``'s family (module kind, input dtypes, grad
        mode: all but the shapes) with different decisions: a shape that changes inside the
        root call could change its decision."""
        if self.kinds is None:
            self.kinds = {}
            for other, entry in self.plan.entries.items():
                self.kinds.setdefault(family(other), set()).add(entry.decision)
        return len(self.kinds.get(family(key), ())) > 1

    def in_checkpoint(self, module: nn.Module) -> None:
        """A planned call inside ``torch.utils.checkpoint``: it follows the autocast state."""
        self.ambient[id(module)] = module

    def close(self) -> None:
        if self.mode is None:
            return
        try:
            self.mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        except Exception:  # an inner mode left on the stack (an exception): drop ours with it
            pass

    def all_fp32(self) -> bool:
        """Whether this call ran all in float32: every planned call decided float32, no
        low-precision tensor outside planned modules or in the arguments, none checkpointed."""
        if self.mode is None or self.outside or self.ambient:
            return False
        low_args = any(isinstance(a, torch.Tensor) and a.dtype in _LOW for a in self.args)
        return not low_args and all(d == "fp32" for seq in self.sequence.values() for d in seq)

    def program(self, sig: tuple[Any, ...], tries: int, can_measure: bool) -> Program | None:
        """The program this recording gives (None: record again at the next call)."""
        if self.mode is None or self.plan.changes != self.changes:
            return None
        undecided = any(d is None for seq in self.sequence.values() for d in seq)
        if undecided and can_measure and tries < _TRIES:
            return None
        # inner (shapes that may change) and checkpointed calls are not part of the program
        sizes = explained(sig)  # the whole signature: also the keyword arguments' tensors
        for i, dims in self.dims.items():
            if not follows(self.calls[i][0], dims, sizes):
                self.inner[i] = self.calls[i][0]
        apart = self.inner.keys() | self.ambient.keys()
        varies = {i for i, seq in self.sequence.items() if len({d == "fp32" for d in seq}) > 1} - apart
        fp32 = [m for i, (m, d) in self.calls.items() if d == "fp32" and i not in varies and i not in apart]
        low = [m for i, (m, d) in self.calls.items() if d != "fp32" and i not in varies and i not in apart]
        low_inputs = any(isinstance(s, tuple) and s[-2] in _LOW for s in sig[1:]) or low_held(sig)
        # the default that hooks fewer modules; a float32 one only where it changes no dtype
        # the recording saw (no low-precision tensor reached an op outside planned modules,
        # no call following a checkpoint's autocast state or guarded for a kind whose classes
        # decide differently, guarded calls of changing shapes all float32 so far)
        inner_fp32 = all(d == "fp32" for i in self.inner for d in self.sequence.get(i, ()))
        fp32_ok = not self.outside and not low_inputs and not self.ambient and not self.watch and inner_fp32
        fp32_ok = fp32_ok and not casts_inputs(self.root)  # a custom_fwd(cast_inputs=...) would see autocast off
        default_fp32 = fp32_ok and len(low) < len(fp32)
        varying = [self.calls[i][0] for i in varies]
        guarded = list(self.inner.values()) + [m for i, m in self.watch.items() if i not in self.inner]
        # calls inside a checkpoint guarded (the plan applies where one runs outside it: a checkpoint switched off)
        ambient = [m for i, m in self.ambient.items() if i not in self.inner]
        unseen = unseen_modules(self.root, {**self.calls, **self.ambient}) + ambient + guarded
        tree, values, weights, plain = snapshot(self.root, fp32 + low + varying + unseen)
        watched = watch(list(self.root.modules()), self.settings)
        if watched is not None:  # a setting changed since records again (._guard.unchanged)
            plain = (*plain, (None, "", *watched))
        stale = cell(self.plan, self.keys, self.region, can_measure)  # a countdown where classes are provisional
        if undecided:  # they ran as the O1 lists: record again once the plan gains a class
            self.plan.wait(stale, self.added)

        def collected(_: object) -> None:  # a module of the program is gone (replaced): record again
            stale[0] = True

        def refs(modules: list[nn.Module]) -> tuple[weakref.ref[nn.Module], ...]:
            return tuple(weakref.ref(m, collected) for m in modules)

        steps = tuple(
            (weakref.ref(m, collected), tuple((d == "fp32") != default_fp32 for d in self.sequence[id(m)]))
            for m in varying
        )
        return Program(
            self.plan,
            self.changes,
            default_fp32,
            refs((low if default_fp32 else fp32) + varying),
            refs(fp32 + low + varying),
            fp32_ok,
            False,
            self.saving_ms,
            refs(unseen),
            stale,
            can_measure,
            tree,
            values,
            weights,
            steps,
            self.low_outside,
            not low_inputs and float32_weights(self.root),  # a bf16 layer cannot take float32 inputs
            plain,
            len(guarded),
            frozenset(map(id, self.inner.values())),
            checkpointed=bool(self.ambient),
        )
