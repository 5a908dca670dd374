"""Programs: a settled plan applied to one model call for (nearly) nothing per module call.

While a ``level="auto"`` region *records* (:mod:`._hooks`' global module hooks are
registered), the call of each module it makes directly (a *root*: the model) is a
:class:`~._recording.Recording`: which planned modules ran, with which decision, and whether any op the
O1 lists run in low precision ran outside planned modules (a dispatch mode, present only
while recording).  When every planned call had a decision, the recording becomes a
:class:`Program` for the root and the signature of its inputs (shapes, dtypes, devices of
the tensors among its arguments, grad mode):

* its *default*: float32 (autocast switched off for the root's forward) when more planned
  modules decided float32 than low precision and the float32 default changes nothing the
  recording saw outside planned modules (no op of the O1 low-precision list ran there and
  no low-precision tensor reached an op there: :class:`_Outside`), else low precision
  (autocast on, as the region already is);
* the *switched* modules: those whose decision differs from the default, each with two
  instance hooks for the root call (a float32 module: autocast off and its inputs cast to
  float32; a low one in a float32 default: autocast on for its forward);
* the *steps* of a module called more than once with decisions that differ (the same layer
  on two batch sizes, one float32 and one low): it is switched, and its hooks follow the
  recorded decisions call by call (the ``n``-th call of the root call as the ``n``-th recorded one).

A program the whole-call check applies to (:meth:`Program.mixed`) is one whose planned
modules do not all agree, or one whose recording saw an op of the O1 low-precision list run
*outside* planned modules (``F.linear``, ``torch.matmul`` in a forward, the products of an
``nn.GRU`` or ``nn.LSTM``): that work is in no shape class's figures, so only timing the
whole call says whether float32 (autocast off for the whole root) beats it.

Every module's output has the same dtype on the recorded call and in the program: the one
torch.autocast gives for its decision (the low-precision dtype for ``"low"``, float32 for
``"fp32"``), and every op outside planned modules sees the same dtypes.

A later region hooks only the roots its thread called last time (two instance hooks per root); a root called
with the same input signature runs its program: no global hook, no per-call check for modules that follow the
default. Another signature (:mod:`._guard`: also the values of non-tensor arguments, tensors inside
containers, eval mode), a plan that changed (a new measurement, ``ampcore plan clear``, ``load_plan``), a
module tree that changed (a layer replaced) or weights no longer float32 record again. The root's planned
modules the recording did not see called (another path) are guarded: called by a later path, they apply the
plan. So are the planned calls whose shapes may change while the root's signature does not
(:mod:`._recording`), and planned calls inside ``torch.utils.checkpoint`` follow the autocast state there (its
recompute does). Numbers among the arguments that change every call but give the same program are held by type
(:func:`._loose.loosen`, applied when a program is stored). A ``torch.autocast`` the forward enters inside a
float32 default: :mod:`._entered`. A call of a program that switches nothing to low precision runs float32
throughout (:meth:`Program.throughout`): the region's ops after it do too (:mod:`._roots`).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import torch
from torch import nn

from .._policy.thread_state import thread_state
from ._guard import Weight, _saved_hooks, in_checkpoint, signature, unchanged
from ._plan import AutoPlan
from ._shapes import cast_floating, float32_weights, shape_class
from ._stale import Stale, drop_strays

if TYPE_CHECKING:
    from ._recording import Recording

__all__ = ["Program", "Running", "cast_floating", "local", "signature"]

_LOW: Final = (torch.bfloat16, torch.float16)
_thread = thread_state()
_is_compiling = torch.compiler.is_compiling
_autocast_enabled: Final = torch.is_autocast_enabled


def _nesting() -> int:
    """torch's autocast nesting in this thread (each ``torch.autocast`` and ampcore region entered)."""
    torch.autocast_increment_nesting()
    return int(torch.autocast_decrement_nesting())


#: the hook dicts :meth:`Running._hook` puts a program's hooks in
_HOOK_DICTS: Final = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called")
#: the ``stale`` cell of programs made without weak reference callbacks (never set)
_FRESH: Final[list[bool]] = [False]
_NO_VALUES: Final[list[tuple[Any, ...]]] = []


class Program(NamedTuple):
    """What a root call runs with: ``default_fp32`` and the modules switched to the other
    precision, valid while ``plan`` has ``changes`` changes."""

    plan: AutoPlan
    changes: int
    default_fp32: bool
    switched: tuple[weakref.ref[nn.Module], ...]
    #: every planned module of the recording, and whether a float32 default changes no
    #: dtype the recording saw (the fixed choices a whole-call check compares with)
    planned: tuple[weakref.ref[nn.Module], ...] = ()
    fp32_ok: bool = False
    #: the whole-call check (:mod:`._verify`) was applied: this is what the root runs
    checked: bool = False
    #: what the float32-decided calls save against the O1 lists by their classes' own
    #: figures (ms, sum of low - fp32 per call): the whole-call check's plausibility bound
    saving_ms: float = 0.0
    #: the planned modules of the root the recording did not see called (another path of its control
    #: flow) or saw only inside a checkpoint: each gets a guard that applies the plan when it is called
    unseen: tuple[weakref.ref[nn.Module], ...] = ()
    #: [True] once a module of the program was collected (a replaced layer) or a guard met
    #: a class to measure: record again (set by weak reference callbacks, read per call)
    stale: list[bool] = _FRESH
    #: a guard that meets an undecided class marks the program stale (it can be measured)
    measurable: bool = False
    #: the ``_modules`` dicts of the root's modules that have children, and their values
    #: when recorded: a module replaced, added or removed since makes it record again
    tree: tuple[dict[str, Any], ...] = ()
    tree_values: list[tuple[Any, ...]] = _NO_VALUES
    #: the floating-point parameters of the planned modules (all float32 when recorded): one converted
    #: (``model.bfloat16()``) or replaced (``load_state_dict(..., assign=True)``) since records again
    weights: tuple[Weight, ...] = ()
    #: switched modules whose calls differ: (module, per call in order: switch it or not)
    steps: tuple[tuple[weakref.ref[nn.Module], tuple[bool, ...]], ...] = ()
    #: an op of the O1 low-precision list ran outside planned modules (``F.linear``,
    #: ``torch.matmul`` in a forward, an ``nn.GRU``'s or ``nn.LSTM``'s products): work no
    #: class's figures cover, so the whole-call check applies
    low_outside: bool = False
    #: the root's inputs and parameters are float32: with ``low_outside``, the ``fp32`` fixed choice switches
    #: autocast off for the whole root (that work in float32 too, as the float32 step runs); other programs keep
    #: their planned modules switched (their hooks cast a low-precision tensor made inside the root to float32)
    fp32_root: bool = False
    #: plain lists, tuples and dicts of the root's modules that hold layers, as recorded
    plain: tuple[Any, ...] = ()
    #: the last ``inner`` of ``unseen`` are guarded because their shapes may change while the
    #: root's signature does not (a fixed choice, ``"low"`` or ``"fp32"``, drops them)
    inner: int = 0
    #: ids of the guarded modules of changing shapes (all float32 when recorded, where the default is
    #: float32: only a low decision of theirs makes the root record again)
    inner_ids: frozenset[int] = frozenset()
    #: whole-call checks failed as the forward raised (a bad batch?): again up to :data:`._verify.CHECK_TRIES` times
    check_tries: int = 0
    #: planned calls ran inside ``torch.utils.checkpoint`` (they follow its autocast state)
    checkpointed: bool = False
    #: the fixed choice it is (:meth:`fixed`: ``"low"``, ``"fp32"``), else ``"plan"`` (guards apply it on other paths)
    verdict: str = "plan"
    #: a provisional verdict's re-check in this process (:class:`._again.Recheck`), else None
    recheck: Any = None

    def same_tree(self) -> bool:
        """Whether the root's modules are those it had when recorded and their weights are
        still float32 (C calls only: this runs on every root call)."""
        return unchanged(self.tree, self.tree_values, self.weights, self.plain)

    def mixed(self) -> bool:
        """Whether the whole-call check applies: some planned calls run in float32 and others
        in low precision, or ops of the O1 low-precision list ran outside planned modules
        (the program is then not exactly either fixed choice: float32 may win as a whole), or
        planned calls inside a checkpoint ran low beside switched float32 ones."""
        mixed = 0 < len(self.switched) < len(self.planned) or (self.checkpointed and bool(self.switched))
        return bool(self.steps) or mixed or self.low_outside

    def uniform(self) -> str | None:
        """The fixed choice a program that is not mixed is exactly (``"low"``: every planned
        call low, torch.autocast's program; ``"fp32"``: every one float32), None for a mixed
        program or one without planned calls.  Its whole-call check (:mod:`._verify`) times
        it against the other fixed choice only.

        Example::

            >>> Program(None, 0, False, (), (), False).uniform() is None  # type: ignore[arg-type]
            True
        """
        if not self.planned or self.mixed():
            return None
        if self.switched:  # every planned module switched away from the default
            return "low" if self.default_fp32 else "fp32"
        return "fp32" if self.default_fp32 else "low"

    def throughout(self) -> bool:
        """Whether a call runs all in float32: nothing switched to low, a float32 default or no planned module and no
        low work seen outside them, or the check's float32 choice of a default low (float32 inputs, none seen)."""
        if self.verdict == "fp32" and not self.default_fp32:  # every planned call switched to float32 (fixed)
            return self.fp32_root and not self.low_outside and not self.checkpointed
        return (self.default_fp32 or (self.fp32_ok and not self.planned)) and not self.switched and not self.steps

    def fixed(self, verdict: str) -> Program:
        """This program (``"plan"``) or a fixed choice: ``"low"`` (the O1 lists alone, as
        torch.autocast) or ``"fp32"`` (every planned module in float32), marked checked."""
        if verdict in ("low", "fp32"):
            kept = self.unseen[: len(self.unseen) - self.inner]
            fixed = self._replace(unseen=kept, inner=0, inner_ids=frozenset(), checked=True, steps=(), verdict=verdict)
            if verdict == "low":
                return fixed._replace(default_fp32=False, switched=())
            # autocast off for the whole root where ops outside planned modules ran in low precision, or
            # planned calls inside a checkpoint (its autocast state, its recompute too): float32 as the step
            if self.fp32_ok or ((self.low_outside or self.checkpointed) and self.fp32_root):
                return fixed._replace(default_fp32=True, switched=())
            # every planned module in float32: also those guarded per call (shapes that do not
            # follow the arguments: a strided convolution), no longer guarded
            inner = tuple(r for r in self.unseen[len(kept) :] if id(r()) in self.inner_ids)
            return fixed._replace(default_fp32=False, switched=self.planned + inner)
        return self._replace(checked=True)

    def valid(self, plan: AutoPlan) -> bool:
        return plan is self.plan and plan.changes == self.changes and not self.stale[0] and self.same_tree()


class _Local(threading.local):
    def __init__(self) -> None:
        self.rec: Recording | None = None
        self.run: Running | None = None
        self.measuring = False
        self.settled: Any = None  # the thread's active region whose roots run programs


local = _Local()


class Running:
    """A program applied to one root call: its default set, instance hooks on the switched
    modules (removed by :meth:`stop`).  The hooks go into the modules' hook dicts under this
    object as key (no handle objects: 5 dict operations a module instead of two handles
    made and removed, about 3 us a module on a CPU), through torch's public registration
    where those dicts are not there."""

    def __init__(self, program: Program, root: nn.Module, region: Any) -> None:
        self.program = program
        #: the root and region of the call it applies to (None between calls: keeps no dropped model alive)
        self.root: nn.Module | None = None
        self.region: Any = None
        self.grad = True  # grad mode at the call's start (a reentrant checkpoint's forward runs without)
        self.device_type: str = region.spec.backend.device_type
        self.pushed: list[nn.Module] = []
        self.was: list[bool] = []  # per pushed module: whether autocast was on before it
        self.nesting = 0  # torch's autocast nesting when a float32 default with hooks started
        self.handles: list[Any] = []  # modules with our key in their dicts, or public handles
        #: id of a module with steps -> [whether to switch it, per call; calls so far]
        self.steps: dict[int, list[Any]] | None = None
        #: whether the program hooks any module (else start and stop only set autocast)
        self.hooks = bool(program.switched or program.unseen)
        self.simple = not self.hooks and not program.steps
        self.default_fp32 = program.default_fp32
        self.fp32, self.lowered = program.throughout(), False  # (_roots._root_post; a guard ran low this call)
        self.watching = False  # a torch.autocast the forward entered hooked the default's modules
        self.start(root, region)

    def start(self, root: nn.Module, region: Any) -> None:
        """Apply the program to a call of ``root`` in ``region`` (again: a root's settled
        calls reuse one object, see ``_roots._Last``)."""
        self.root, self.region, self.grad = root, region, torch.is_grad_enabled()
        program = self.program
        if program.steps:
            self.steps = {id(m): [calls, 0] for ref, calls in program.steps if (m := ref()) is not None}
        if program.default_fp32:
            torch.set_autocast_enabled(self.device_type, False)
            if self.hooks:  # a torch.autocast(enabled=False) the forward enters: not the default's state
                self.nesting = _nesting()
        if self.hooks:
            for refs, pre in ((program.switched, self._pre), (program.unseen, self._guard)):
                for ref in refs:
                    module: Any = ref()
                    if module is not None:
                        self._hook(module, pre)

    def _hook(self, module: Any, pre: Any) -> None:
        post = self._post
        try:  # torch types the dicts as keyed by handle ids; any hashable key works
            module._forward_pre_hooks[self] = pre
            module._forward_hooks[self] = post
            module._forward_hooks_always_called[self] = True
            self.handles.append(module)
        except (AttributeError, TypeError):  # (what went in is taken back: no entry left behind)
            for name in _HOOK_DICTS:
                with contextlib.suppress(AttributeError, TypeError):
                    getattr(module, name).pop(self, None)
            self.handles.append(module.register_forward_pre_hook(pre))
            self.handles.append(module.register_forward_hook(post, always_call=True))

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy of a module made while the run's hooks are on it (``copy.deepcopy``,
        pickling in the forward) holds a :class:`~._stale.Stale` key: its entries are strays."""
        return (Stale, ())

    def _pre(self, module: nn.Module, args: tuple[Any, ...]) -> Any:
        if local.run is not self:  # runs on every switched module call: kept lean
            if type(self) is not Running:  # a deep copy's stray (bound to the copied key)
                drop_strays(module)
            return None
        stack = _thread.stack  # a region nested inside the root call: its own lists
        if not stack or stack[-1] is not self.region:
            return None
        if self.steps is not None and not self._this_call(module):
            return None
        if _autocast_enabled(self.device_type) == self.default_fp32 or (
            self.default_fp32 and _nesting() != self.nesting
        ):
            return None  # the forward switched autocast itself (torch.autocast inside): as the global hooks
        if (_saved_hooks(False) is not None or (self.grad and not torch.is_grad_enabled())) and in_checkpoint():
            if self.default_fp32 or self.program.verdict == "fp32":  # a recording there runs it otherwise
                self.program.stale[0] = True
            return None  # inside a checkpoint the recording did not see: its autocast state, as its recompute
        return self.switch(module, args)

    def _this_call(self, module: nn.Module) -> bool:
        """Whether this call of ``module`` is switched: its recorded decision for the call in
        this order (a module without steps: always)."""
        found = self.steps.get(id(module)) if self.steps is not None else None
        if found is None:
            return True
        calls, n = found
        found[1] = n + 1
        return bool(calls[min(n, len(calls) - 1)])

    def _guard(self, module: nn.Module, args: tuple[Any, ...]) -> Any:
        """A planned module the recording did not see called (another path, or only in a checkpoint): the plan's
        decision as the global hooks would apply it (a class undecided, measured now, or weights not float32: the
        O1 lists); the next call records where it could not be measured or the default is float32 (this path's
        ops outside planned modules were not seen)."""
        if local.run is not self or _is_compiling() or local.measuring:  # (a check's or class's measurement)
            if type(self) is not Running:  # a deep copy's stray (bound to the copied key)
                drop_strays(module)
            return None
        stack = _thread.stack
        if not stack or stack[-1] is not self.region or in_checkpoint():  # a checkpoint: its autocast state
            return None
        key = shape_class(module, args, self.device_type)
        if key is None:
            return None
        program = self.program
        decision = program.plan.decision(key) if float32_weights(module) else "low"  # else: the O1 lists
        if program.verdict != "plan":  # a fixed choice: every planned call one way (also undecided classes)
            decision = "fp32" if program.verdict == "fp32" and float32_weights(module) else "low"
        enabled = _autocast_enabled(self.device_type)
        if enabled == program.default_fp32 or (program.default_fp32 and _nesting() != self.nesting):
            return self.switch(module, args, off=True) if decision == "fp32" and enabled else None  # as above
        undecided = decision is None and program.measurable  # measured now: the next call may not meet it
        if undecided:  # (this call runs with the O1 lists, as a class's first call does)
            from ._deciding import measure_now  # (it imports this module)

            undecided = measure_now(module, args, key, program.plan, self.region) is None
        known = id(module) in program.inner_ids or program.verdict == "fp32"  # (a float32 verdict suits every op)
        if undecided or (program.default_fp32 and (decision != "fp32" or not known)):
            # the next call records: to measure the class, or (a float32 default) to see this path's other ops
            program.stale[0] = True
        if (decision == "fp32") != program.default_fp32:
            return self.switch(module, args)
        if program.default_fp32:  # float32 as the default: its inputs from a low module in float32
            return cast_floating(args, torch.float32, self.device_type, low=True)
        return None  # the default's precision

    def switch(self, module: nn.Module, args: tuple[Any, ...], off: bool = False) -> Any:
        """Run ``module``'s forward in the precision other than the default (``off``: in
        float32 whatever the default) (its new arguments, or None); its forward hook switches
        back to the state before it."""
        self.pushed.append(module)
        self.was.append(_autocast_enabled(self.device_type))
        if self.program.default_fp32 and not off:  # a low-precision module: autocast on for its forward
            torch.set_autocast_enabled(self.device_type, True)
            self.lowered = True
            return None
        torch.set_autocast_enabled(self.device_type, False)
        for value in args:  # float32 tensors only (the usual case): the arguments as they are
            if not isinstance(value, torch.Tensor) or value.dtype in _LOW:
                return cast_floating(args, torch.float32, self.device_type, low=True)
        return None

    def _post(self, module: nn.Module, args: tuple[Any, ...], output: Any = None) -> None:
        if not self.pushed or self.pushed[-1] is not module or local.run is not self:
            return
        self.pushed.pop()
        torch.set_autocast_enabled(self.device_type, self.was.pop())

    def stop(self) -> bool:
        """End the root call (autocast back to the region's state): whether it ran float32 throughout."""
        fp32, self.lowered = self.fp32 and not self.lowered and not self.watching, False
        handles = self.handles
        if handles:
            for handle in handles:
                if isinstance(handle, nn.Module):
                    dicts: Any = handle
                    dicts._forward_pre_hooks.pop(self, None)
                    dicts._forward_hooks.pop(self, None)
                    dicts._forward_hooks_always_called.pop(self, None)
                else:
                    handle.remove()
            handles.clear()
        if self.watching:  # (_entered.watch)
            self.watching, self.simple = False, not self.hooks and not self.program.steps
        if self.program.default_fp32 or self.pushed:
            torch.set_autocast_enabled(self.device_type, True)  # the region's state (it is enabled)
            self.pushed.clear()
            self.was.clear()
        self.root = self.region = None
        return fp32


def __getattr__(name: str) -> Any:
    """``Recording`` (moved to :mod:`._recording`), for code that reads it from here."""
    if name == "Recording":
        from ._recording import Recording

        return Recording
    raise AttributeError(name)
