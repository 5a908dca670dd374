"""torch.compile support for ``ampcore.autocast``, without importing ``torch._dynamo``.

Three pieces:

* :func:`opaque`: marks a function so that dynamo neither inlines it nor compiles its
  frame (``ampcore.autocast``'s ``__init__``/``__enter__``/``__exit__`` change thread
  state that dynamo cannot model).  A customised region inside a compiled function is
  therefore a graph break: the region is entered eagerly and the code inside it is
  compiled under its policy.
* :func:`constant_result`: marks a function whose result dynamo may fold into a constant
  (used to turn an uncustomised O1 region inside a compiled function into a plain
  ``torch.autocast``, which dynamo compiles without a graph break).
* :func:`guard_mode`: a do-nothing ``TorchFunctionMode`` of a class unique to each policy,
  pushed while a region with a policy is active once dynamo has processed a frame in this
  process (:func:`compile_in_use`).  ampcore's kernels run while AOTAutograd traces, so a
  compiled graph bakes the casts of the policy it was traced under; dynamo guards on the
  classes of the active torch-function modes, so a graph traced under one policy is not
  reused under another (it recompiles instead).  Cost: about 1-2 us per torch call in
  regions with a policy, only in processes that use torch.compile.  A graph first traced
  in a policy region entered before any compile was traced without a mode: regions with a
  policy entered later have one (no reuse), code outside policy regions differs in its
  tensor guards (the shadow key is in the key sets only inside them).  Left open: another
  thread's policy region entered before that first compile could reuse it.

The markers use dynamo's C-level frame API and function attributes that
``torch._dynamo.disable`` and ``torch._dynamo.assume_constant_result`` set; on a torch
without them they do nothing.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

from .._forklock import LOCK

__all__ = ["compile_in_use", "constant_result", "foreign_mode", "guard_mode", "opaque"]

F = TypeVar("F", bound=Callable[..., Any])


def opaque(fn: F) -> F:
    """Keep dynamo out of ``fn``: not inlined, its frame (and callees) not compiled."""
    fn._torchdynamo_disable = True  # type: ignore[attr-defined]
    try:
        from torch._C._dynamo import eval_frame

        skip = eval_frame._FrameAction.SKIP
        eval_frame.set_code_exec_strategy(fn.__code__, eval_frame._FrameExecStrategy(skip, skip))
    except (ImportError, AttributeError):  # a torch without dynamo's frame API
        pass
    return fn


def constant_result(fn: F) -> F:
    """Let dynamo call ``fn`` once while tracing and treat its result as a constant."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


def compile_in_use() -> bool:
    """Whether dynamo has processed a frame in this process (``torch.compile`` ran).

    Not whether ``torch._dynamo`` is imported: constructing any torch optimizer imports it,
    and the guard mode would then cost every training loop 1-2 us per torch call.
    """
    utils = sys.modules.get("torch._dynamo.utils")
    frames = getattr(utils, "counters", {}).get("frames") if utils is not None else None
    return bool(frames and frames.get("total"))


class _PolicyGuardMode(TorchFunctionMode):
    """Passes every call through; only its class matters (dynamo guards on it)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


_lock = LOCK  # fork-safe (see ampcore._forklock)


#: policy -> its guard mode class (policies are frozen: the class lives beside them)
_classes: weakref.WeakKeyDictionary[object, type[_PolicyGuardMode]] = weakref.WeakKeyDictionary()


def guard_mode(policy: object) -> TorchFunctionMode:
    """A new guard mode whose class is unique to ``policy``."""
    cls = _classes.get(policy)
    if cls is None:
        with _lock:
            cls = _classes.get(policy)
            if cls is None:
                cls = _classes[policy] = type(f"AmpcorePolicy_{id(policy):x}", (_PolicyGuardMode,), {})
    return cls()


def foreign_mode() -> bool:
    """Whether a torch-function mode other than ampcore's guard modes is active (as
    ``torch.export``'s pre-dispatch tracing, which must see torch.autocast's entry)."""
    if not torch._C._is_torch_function_mode_enabled():
        return False
    try:
        at, length = torch._C._get_function_stack_at, torch._C._len_torch_function_stack
    except AttributeError:  # a torch without the stack's accessors: every mode is foreign
        return True
    return not all(isinstance(at(i), _PolicyGuardMode) for i in range(length()))
