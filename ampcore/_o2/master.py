"""fp32 master weights for an optimizer whose model ``ampcore.decorate`` made low precision.

The model keeps its parameters as real (low-precision) ``nn.Parameter`` objects, so forward,
backward, DDP and module hooks see nothing unusual.  The optimizer's param groups are
rebound, in place, to fp32 *master* copies; the optimizer object keeps its type and its
state is keyed by (and created in the dtype of) the masters.  After every
``optimizer.step()`` the low-precision parameters are refreshed from the masters in one
batched copy.

Gradients reach the masters in one of two ways (see docs/o2.md):

* ``master_grad=False``: backward leaves low-precision gradients on the model; the first
  read of ``group["params"]`` after they changed (by ``GradScaler.unscale_``, by the step
  itself, by clipping over the optimizer's parameters) gives each master an fp32 copy.  The
  copies are released after the step.
  Exception: torch SGD, Adam and AdamW without step hooks: ampcore runs the update itself
  (``master_sgd.py``, ``master_sgd_torch.py``, ``master_adam.py``), reading or widening the
  low-precision gradients as it goes; in a dtype that needs no loss scaling the masters'
  ``.grad`` in torch's momentum-free SGD step even *is* the low-precision gradient.
  In both, a master gets an fp32 copy only if something reads the param groups between
  backward and the step (``GradScaler.unscale_``, clipping the optimizer's parameters; not
  ``GradScaler.step`` alone, which checks the low-precision gradients read-only and lets
  the update unscale them as it widens them: ``scaled_update.py``), and the update
  walks whole tensors (a few multi-tensor ops per param group) or, where the backend asks
  for it (``BackendSpec.master_update_chunk_elements``: the CPU), cache-sized chunks
  whenever they time faster than whole tensors (``update_walk.py``).
* ``master_grad=True``: the model's parameters get ``grad_dtype=float32``, so backward
  accumulates fp32 gradients on them, and each master's ``.grad`` *is* that tensor.

Each way is a strategy (``grad_modes.py``) that decorate's options choose once per optimizer.
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MethodType
from typing import TYPE_CHECKING, Any, Final, Literal

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .._errors import AmpcoreError
from .adam_plans import AdamPlans
from .grad_modes import GradientMode, choose_gradient_mode
from .own_update import own_update
from .scaled_update import STEP_MARK
from .torch_step import TorchStep, stand_in, torch_step_of
from .update_walk import UpdateWalk

if TYPE_CHECKING:
    from .scaled_update import PendingUnscale

__all__ = ["MasterPair", "MasterWeights", "master_of", "master_weights_of"]

_ATTR: Final = "_ampcore_master_weights"
_VERSION: Final = operator.attrgetter("_version")
_RECORDED: Final = operator.attrgetter("version")

#: the kernels of the Adam/AdamW master update (``master_kernel.py``)
MasterKernel = Literal["torch", "triton"]

#: low-precision model parameter -> the MasterWeights holding its master.  Process-wide as
#: parameters are: two models may share a parameter, and the second decorate call must see
#: that the first gave it a master (weak: it does not keep parameters alive).
_MASTER_HOLDERS: Final = WeakIdKeyDictionary()


@dataclass(eq=False)
class MasterPair:
    """One low-precision model parameter and its fp32 master."""

    model: nn.Parameter
    master: nn.Parameter
    #: ``model._version`` right after ampcore last wrote the model parameter; a different
    #: value means someone else changed it (DDP's broadcast, an in-place init, a load).
    version: int = 0
    #: The model gradient the master's gradient was last copied from, and its version.
    seen_grad: weakref.ReferenceType[torch.Tensor] | None = field(default=None, repr=False)
    seen_grad_version: int = 0

    def __getstate__(self) -> dict[str, Any]:  # copy.deepcopy, torch.save of the model
        return {"model": self.model, "master": self.master}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a copy's tensors have version counters of their own: it starts in sync
        self.model, self.master = state["model"], state["master"]
        self.version = self.model._version
        self.seen_grad, self.seen_grad_version = None, 0


def master_of(param: torch.Tensor) -> MasterWeights | None:
    """The :class:`MasterWeights` (of some decorated optimizer) that holds ``param``'s master."""
    found = _MASTER_HOLDERS.get(param)
    return found if isinstance(found, MasterWeights) else None


def master_weights_of(optimizer: object) -> MasterWeights | None:
    """The :class:`MasterWeights` installed on ``optimizer`` by decorate, or None."""
    found = getattr(optimizer, "__dict__", {}).get(_ATTR)
    return found if isinstance(found, MasterWeights) else None


class _MasterGroup(dict):  # type: ignore[type-arg]
    """A param group whose ``"params"`` lookup first brings the masters' gradients up to
    date, so that GradScaler, clipping and the optimizer all read current gradients."""

    __slots__ = ("_sync",)

    def __init__(self, group: Mapping[str, Any], sync: Callable[[], None]) -> None:
        super().__init__(group)
        self._sync = sync

    def __getitem__(self, key: str) -> Any:
        if key == "params":
            self._sync()
        return dict.__getitem__(self, key)

    def __reduce__(self) -> tuple[Any, ...]:  # pickles and deep-copies as a plain dict
        return (dict, (dict(self),))


def _step_function(inner: Callable[..., Any] | None) -> Callable[..., Any]:
    def step(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        return _require(optimizer).step(args, kwargs)

    if getattr(inner, "_wrapped_by_lr_sched", False):  # an LR scheduler wrapped it before us
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    setattr(step, STEP_MARK, True)  # GradScaler may defer unscaling to this step (scaled_update.py)
    return step


def _zero_grad(optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
    _require(optimizer).zero_grad(set_to_none)


def _unsynced(name: str, inner: Callable[..., Any] | None) -> Callable[..., Any]:
    """The optimizer's method ``name`` (``inner``: the instance's) with no gradient sync: it
    reads the parameters, not their gradients (a copy would go stale as backward accumulates)."""

    def method(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        with _require(optimizer).unsynced():
            if inner is not None:
                return inner(*args, **kwargs)
            return getattr(type(optimizer), name)(optimizer, *args, **kwargs)

    return method


def _require(optimizer: torch.optim.Optimizer) -> MasterWeights:
    weights = master_weights_of(optimizer)
    if weights is None:  # only if someone deleted the attribute
        raise AmpcoreError(f"{type(optimizer).__name__}: its ampcore master weights are gone")
    return weights


class MasterWeights:
    """The master-weight machinery of one optimizer (created by ``ampcore.decorate``)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        pairs: list[MasterPair],
        master_grad: bool,
        may_share: bool = False,
        chunk: int | None = None,
        onepass: bool = False,
    ) -> None:
        self.optimizer = optimizer
        #: Adam/AdamW/SGD groups may run the one-pass CPU kernels (``BackendSpec.master_update_onepass``)
        self.onepass = onepass
        #: how ampcore's own updates walk the parameters: the backend's chunks
        #: (``BackendSpec.master_update_chunk_elements``), measured against whole tensors
        self.walk = UpdateWalk(chunk)
        #: torch's Adam kernels, or ampcore's one-pass Triton kernel for fused groups
        #: (``ampcore.set_master_update_kernel``)
        self.kernel: MasterKernel = "torch"
        self.pairs = pairs
        self.master_grad = master_grad
        #: how the masters get their gradients, chosen once (``grad_modes.py``)
        self.grad_mode: GradientMode = choose_gradient_mode(master_grad, may_share)
        self.models: list[torch.Tensor] = [pair.model for pair in pairs]
        self.masters: list[torch.Tensor] = [pair.master for pair in pairs]
        #: master -> its low-precision model parameter (for the fused updates)
        self.low_of: dict[torch.Tensor, torch.Tensor] = {pair.master: pair.model for pair in pairs}
        self._suspended = False
        #: the optimizer's own step runs (``grad_modes.LowGradsWhenExact`` may share then)
        self.stepping = False
        #: False only while no pair holds a gradient copy (``seen_grad``): the sync before
        #: ampcore's own update then has nothing to bring up to date (``grad_modes.py``)
        self.copies_held = False
        #: a GradScaler step in progress whose unscaling the update does (``scaled_update.py``)
        self.pending: PendingUnscale | None = None
        # What ``step``/``zero_grad`` meant before (an instance-level wrapper such as an LR
        # scheduler's counts too); None means the class's own method.
        self._inner_step: Callable[..., Any] | None = optimizer.__dict__.get("step")
        self._inner_zero_grad: Callable[..., Any] | None = optimizer.__dict__.get("zero_grad")
        #: (the class's ``step`` it was found for, how to stand in for torch's step or None)
        self._torch_step: tuple[object, TorchStep | None] | None = None
        #: update kind -> whether chunks and whole tensors walk it differently (cleared when
        #: the param groups change)
        self.walks_differ: dict[str, bool] = {}
        #: what the whole-tensor Adam updates keep between steps (``adam_plans.py``)
        self.adam_plans = AdamPlans(self.low_of)

    # -- installation -----------------------------------------------------------------
    def install(self) -> None:
        """Rebind the param groups to the masters and wrap step, zero_grad and state dicts."""
        optimizer = self.optimizer
        master_of = {pair.model: pair.master for pair in self.pairs}
        for group in optimizer.param_groups:
            params = group["params"]
            params[:] = [master_of.get(p, p) for p in params]  # in place: LBFGS keeps the list
        self.wrap_groups()
        state = optimizer.state
        for pair in self.pairs:
            if pair.model in state:
                state[pair.master] = _cast_state(state.pop(pair.model), pair.master.dtype)
        self.grad_mode.install(self.pairs)
        optimizer.__dict__[_ATTR] = self
        for pair in self.pairs:
            _MASTER_HOLDERS[pair.model] = self
        optimizer.step = MethodType(_step_function(self._inner_step), optimizer)  # type: ignore[method-assign]
        optimizer.zero_grad = MethodType(_zero_grad, optimizer)  # type: ignore[method-assign]
        for name in ("state_dict", "load_state_dict", "add_param_group"):
            setattr(optimizer, name, MethodType(_unsynced(name, optimizer.__dict__.get(name)), optimizer))
        self.record_versions()

    def wrap_groups(self) -> None:
        """Make every param group sync gradients on read (after add_param_group or a load)."""
        groups = self.optimizer.param_groups
        for index, group in enumerate(groups):
            if not isinstance(group, _MasterGroup):
                self.walks_differ.clear()
                if any(_low_precision(p) for p in dict.__getitem__(group, "params")):
                    raise AmpcoreError(
                        f"{type(self.optimizer).__name__}: a param group added after ampcore.decorate "
                        "holds low-precision parameters, which would be updated without fp32 master "
                        "weights; add every param group before decorating"
                    )
                groups[index] = _MasterGroup(group, self.sync_grads)

    # -- gradients --------------------------------------------------------------------
    def sync_grads(self, copy_missing: bool = True) -> None:
        """Give each master the current gradient of its model parameter (by the gradient
        mode; with ``copy_missing=False`` no new fp32 copies are made)."""
        if not self._suspended:
            self.grad_mode.sync(self, copy_missing)

    @contextlib.contextmanager
    def unsynced(self) -> Iterator[None]:
        """No gradient sync inside (reads of the parameters, not of their gradients)."""
        before, self._suspended = self._suspended, True
        try:
            yield
        finally:
            self._suspended = before

    def release_grads(self) -> None:
        """Drop the masters' fp32 gradient copies (after the step consumed them)."""
        self.grad_mode.release(self.pairs)

    def zero_grad(self, set_to_none: bool) -> None:
        """``optimizer.zero_grad``: clears the model's gradients and the masters'."""
        with torch.no_grad():
            for pair in self.pairs:
                grad = pair.model.grad
                if grad is None:
                    continue
                if set_to_none:
                    pair.model.grad = None
                else:
                    grad.zero_()
        self._suspended = True
        try:
            if self._inner_zero_grad is not None:
                self._inner_zero_grad(set_to_none)
            else:
                type(self.optimizer).zero_grad(self.optimizer, set_to_none)
        finally:
            self._suspended = False
        for pair in self.pairs:
            pair.seen_grad = None
        self.copies_held = False

    # -- weights ----------------------------------------------------------------------
    def adopt_model_changes(self) -> None:
        """Copy into the masters any model parameter that was changed outside ampcore."""
        if list(map(_VERSION, self.models)) == list(map(_RECORDED, self.pairs)):  # (the common case)
            return
        changed = [pair for pair in self.pairs if pair.model._version != pair.version]
        if changed:
            with torch.no_grad():
                torch._foreach_copy_([p.master for p in changed], [p.model for p in changed])
            for pair in changed:
                pair.version = pair.model._version

    def refresh(self) -> None:
        """Copy the masters into the low-precision model parameters (one batched pass)."""
        if self.pairs:
            with torch.no_grad():
                torch._foreach_copy_(self.models, self.masters)
        self.record_versions()

    def record_versions(self) -> None:
        """Remember the model parameters' versions: ampcore's own writes are not adopted."""
        for pair, version in zip(self.pairs, map(_VERSION, self.models), strict=True):
            pair.version = version

    # -- step -------------------------------------------------------------------------
    def step(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``optimizer.step``: update the masters, then refresh the model parameters."""
        self.wrap_groups()  # a group added by add_param_group since decorate
        self.adopt_model_changes()
        own = own_update(self, plain=not args and not kwargs)
        if own is not None:
            self.sync_grads(copy_missing=False)  # fresh copies if some exist; no new ones
            return self._own_step(own)
        if args and callable(args[0]):
            args = (self._wrap_closure(args[0]), *args[1:])
        elif callable(kwargs.get("closure")):
            kwargs = {**kwargs, "closure": self._wrap_closure(kwargs["closure"])}
        self.stepping = True
        try:
            self.sync_grads()
            return self._call_inner_step(args, kwargs)
        finally:
            self.stepping = False
            self.refresh()
            self.release_grads()

    def _call_inner_step(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._inner_step is not None:
            return self._inner_step(*args, **kwargs)
        return type(self.optimizer).step(self.optimizer, *args, **kwargs)

    def _own_step(self, update: Callable[[], list[torch.Tensor]]) -> Any:
        """ampcore's update (of the masters, and of the float32 parameters it updates whole)
        with what torch's step does around an update (``torch_step.py``); where ampcore
        cannot do that itself, torch's own step runs afterwards with those gradients hidden,
        an update of nothing, for its bookkeeping."""
        step = self._stand_in()
        if step is None:
            return self._bookkeeping_step(update())
        stand_in(step, self.optimizer, update)
        self.record_versions()
        self.release_grads()
        return None

    def _stand_in(self) -> TorchStep | None:
        """How to do what torch's step does around the update (None: run torch's step)."""
        cls_step = type(self.optimizer).step
        found = self._torch_step
        if found is None or found[0] is not cls_step:
            found = self._torch_step = (cls_step, torch_step_of(self.optimizer, self._inner_step))
        return found[1]

    def _bookkeeping_step(self, own: list[torch.Tensor]) -> Any:
        """After an update of the masters and of ``own`` (the float32 parameters it updated
        whole): torch's own step with those gradients hidden, an update of nothing, for its
        bookkeeping (where :meth:`_stand_in` cannot stand in for it)."""
        self.record_versions()
        hidden = [(p, p.grad) for p in (*own, *self.masters) if p.grad is not None]
        for param, _ in hidden:
            param.grad = None
        self._suspended = True
        try:
            return self._call_inner_step((), {})
        finally:
            self._suspended = False
            for param, grad in hidden:
                param.grad = grad
            self.release_grads()

    def _wrap_closure(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        def evaluate() -> Any:
            self.refresh()  # the optimizer may have moved the masters since (LBFGS)
            loss = closure()
            self.sync_grads()
            return loss

        return evaluate


def _low_precision(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and torch.promote_types(tensor.dtype, torch.float32) != tensor.dtype


def _cast_state(state: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Optimizer state created before decorate, in the masters' dtype (``step`` untouched)."""
    return {
        key: value.to(dtype)
        if isinstance(value, torch.Tensor) and value.is_floating_point() and key != "step" and value.dim() > 0
        else value
        for key, value in state.items()
    }
