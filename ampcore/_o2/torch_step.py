"""What torch's ``optimizer.step()`` does around the update, for the steps ampcore runs itself.

ampcore runs the update of torch's Adam, AdamW and momentum-free SGD itself where nothing
observes the step from inside (no step hooks: ``master_adam.py``, ``master_sgd.py``).
torch's step does more than the update, and all of it must still happen:

* the class-level wrapper (``Optimizer.profile_hook_step``) opens the profiler's
  ``Optimizer.step#<class>.step`` record, runs the step pre- and post-hooks (there are
  none on this path) and calls ``_optimizer_step_code``, the profiler's Python-tracing hook;
* ``_use_grad_for_differentiable`` turns autograd off (ampcore's updates run under
  ``no_grad``);
* Adam's step first runs the graph-capture health check (on CUDA/XPU it raises under a
  graph capture with ``capturable=False``, before anything is updated);
* an LR scheduler created before ``decorate`` wrapped the instance's ``step`` so that it
  marks ``optimizer._opt_called`` (without it the scheduler warns
  "lr_scheduler.step() before optimizer.step()").

Running torch's step a second time with every gradient hidden did all that, for about 90 us
per step on a CPU (issue 26).  :func:`torch_step_of` instead recognises torch's own code,
by the identity of its code objects (``functools.wraps`` copies names, not code), and
:func:`stand_in` does the same things around ampcore's update.  Where it cannot recognise
the code (a patched class ``step``, an instance-level wrapper it does not know, a torch
release whose wrappers differ), it returns None and torch's step still runs for its
bookkeeping, with the gradients hidden, as before.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any, Final

import torch

__all__ = ["TorchStep", "stand_in", "torch_step_of"]

#: the health-check methods a torch release's Adam step may call first (newest first)
_HEALTH_CHECKS: Final = ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check")
#: what torch's LR-scheduler wrapper of ``step`` may refer to: it marks ``_opt_called`` and
#: calls the step it wrapped, nothing else
_SCHEDULER_NAMES: Final = frozenset(("_opt_called", "__get__", "__class__"))


@dataclass(frozen=True)
class TorchStep:
    """What torch's step of one optimizer does around its update."""

    #: the profiler's record (``Optimizer.step#<class>.step``)
    label: str
    #: the method the class's step calls before updating, if any
    health_check: str | None
    #: whether an LR scheduler's wrapper on the instance marks ``_opt_called``
    marks_called: bool


def torch_step_of(optimizer: torch.optim.Optimizer, inner: Callable[..., Any] | None) -> TorchStep | None:
    """How to stand in for ``optimizer``'s step, or None where torch's step must run.

    ``inner`` is what ``optimizer.step`` was on the instance before decorate (None: the
    class's own method).  Only torch's own class step (behind torch's profiling and
    no-grad wrappers) qualifies, alone or behind torch's LR-scheduler wrapper.
    """
    cls = type(optimizer)
    step = cls.step
    raw = _torch_own_step(step)
    if raw is None:
        return None
    marks_called = False
    if inner is not None:
        if not _scheduler_wrapper_of(inner, optimizer, step):
            return None
        marks_called = True
    names = raw.__code__.co_names
    health_check = next((name for name in _HEALTH_CHECKS if name in names), None)
    return TorchStep(f"Optimizer.step#{cls.__name__}.step", health_check, marks_called)


def stand_in(step: TorchStep, optimizer: torch.optim.Optimizer, update: Callable[[], object]) -> None:
    """``update()`` wrapped in what torch's step would do around it (see the module docstring)."""
    if step.marks_called:
        optimizer._opt_called = True  # type: ignore[attr-defined]
    with torch.autograd.profiler.record_function(step.label):
        if step.health_check is not None:
            getattr(optimizer, step.health_check)()
        update()
        optimizer._optimizer_step_code()


def _torch_own_step(step: object) -> Any:
    """The undecorated function behind ``step`` if ``step`` is torch's profiling wrapper
    around torch's no-grad wrapper around a ``step`` defined in ``torch.optim``; else None."""
    codes = _reference_codes()
    if codes is None or getattr(step, "__code__", None) is not codes[0]:
        return None
    use_grad = getattr(step, "__wrapped__", None)
    if getattr(use_grad, "__code__", None) is not codes[1]:
        return None
    raw = getattr(use_grad, "__wrapped__", None)
    code = getattr(raw, "__code__", None)
    module = sys.modules.get(getattr(raw, "__module__", None) or "")
    if not isinstance(code, CodeType) or module is None or not module.__name__.startswith("torch.optim."):
        return None
    return raw if code.co_name == "step" and code.co_filename == getattr(module, "__file__", None) else None


def _scheduler_wrapper_of(inner: Callable[..., Any], optimizer: torch.optim.Optimizer, step: object) -> bool:
    """Whether ``inner`` is torch's LR-scheduler wrapper of ``optimizer``'s class step (it
    marks ``_opt_called`` on ``optimizer`` and calls ``step``, nothing else)."""
    codes = _reference_codes()
    code = getattr(inner, "__code__", None)
    if codes is None or codes[2] is None or code is not codes[2] or not set(code.co_names) <= _SCHEDULER_NAMES:
        return False
    cells = dict(zip(code.co_freevars, getattr(inner, "__closure__", None) or (), strict=False))
    try:
        func, opt_ref = cells["func"].cell_contents, cells["opt_ref"].cell_contents
    except (KeyError, ValueError):  # another torch's wrapper, or an empty cell
        return False
    return func is step and callable(opt_ref) and opt_ref() is optimizer


_CODES: list[tuple[CodeType, CodeType, CodeType | None] | None] = []


def _reference_codes() -> tuple[CodeType, CodeType, CodeType | None] | None:
    """The code objects of torch's step wrappers: profiling, no-grad, LR scheduler's."""
    if not _CODES:
        from torch.optim import lr_scheduler, optimizer

        profile = _nested(getattr(optimizer.Optimizer, "profile_hook_step", None), "wrapper")
        use_grad = _nested(getattr(optimizer, "_use_grad_for_differentiable", None), "_use_grad")
        scheduler = _nested(getattr(lr_scheduler, "LRScheduler", None), "__init__", "patch_track_step_called")
        scheduler = _nested(scheduler, "wrap_step", "wrapper")
        # the profiling wrapper this module stands in for: the record named as ``TorchStep.label``
        # and the profiler's Python-tracing hook, called after the update
        if profile is None or use_grad is None:
            _CODES.append(None)
        elif "Optimizer.step#" in profile.co_consts and "_optimizer_step_code" in profile.co_names:
            _CODES.append((profile, use_grad, scheduler))
        else:
            _CODES.append(None)
    return _CODES[0]


def _nested(owner: object, *names: str) -> CodeType | None:
    """The code of the function ``names[-1]`` defined in ... ``names[0]`` defined in
    ``owner`` (a code object, a function, or a class whose attribute ``names[0]`` is taken)."""
    if isinstance(owner, type):
        owner, names = getattr(owner, names[0], None), names[1:]
    found = owner if isinstance(owner, CodeType) else getattr(owner, "__code__", None)
    for name in names:
        consts = found.co_consts if found is not None else ()
        found = next((c for c in consts if isinstance(c, CodeType) and c.co_name == name), None)
    return found
