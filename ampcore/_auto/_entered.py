"""A ``torch.autocast`` the forward enters itself inside a float32-default program.

A program whose default is float32 (:class:`~._program.Program`) switches autocast off for
the root's forward and hooks only the modules it switches to low precision: its
float32-decided modules run unhooked.  A forward that turns autocast on again itself
(``torch.autocast("cpu", dtype=torch.float16)``, ``torch.autocast`` as a decorator, in a
submodule, nested in another region) ran those modules in that region's dtype, where the
global hooks (call by call) run them in float32: neither fixed choice's numerics.  The
recording sees the forward's state only on the steps it recorded (issue 27: the strict xfail
of ``test_auto_sweep3``).

So while an eligible auto region is active in some thread, ``torch.autocast.__enter__`` is
wrapped (:func:`._roots.region_entered` puts :func:`_enter` in, ``region_exited`` takes it
out: the class ``torch.amp.autocast_mode.autocast``,
which ``torch.amp.autocast``, ``torch.cpu.amp.autocast``, the decorator form and
``torch.amp.custom_fwd`` use; torch's own again once no thread is in one).  After
torch's own entry, where this thread runs a float32-default program, no ampcore region was
entered since (its own rules apply there) and autocast is now on, the program's planned
modules that follow the default get :func:`_inside` as a pre-hook for the rest of that root
call (:func:`watch`; :meth:`~._program.Running.stop` removes them with the program's own): the
plan's decision where autocast is on, as the global hooks apply it (float32: autocast off for
the module, its low-precision inputs cast).  Where autocast is off they do nothing (the
program's default).  The wrapper costs one thread-local read per ``torch.autocast`` entry
(about 0.07 us on a 2.4 us entry) inside auto regions, nothing outside them; putting it in
and taking it out cost about 0.3 us a region.  A settled call that does not enter one runs
exactly as before.  Not seen: ``torch.set_autocast_enabled(True)`` called by the forward directly.

A forward decorated by ``torch.amp.custom_fwd(cast_inputs=...)`` (or ``ampcore.custom_fwd``)
switches autocast off only where it finds it on: under a float32 default it finds it off and
does nothing, so a module the program switches to low precision inside it would run low where
the global hooks leave it in float32.  A root whose module classes have such a method
(:func:`casts_inputs`, looked up once per class) gets no float32 default: the recording
cannot tell whether a step's path goes through it.

Between roots, where a float32 root left autocast off for the region's ops after it
(``_roots._root_post``), a ``torch.autocast`` entered in the region itself first puts the
region's state back, so torch saves and restores that state (docs/auto.md, "Ops between roots");
not one ampcore enters for a nested region (a disabled one's first entry: it restores the off
state, as the nested regions whose flags are set directly do).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, Final

import torch
from torch import nn
from torch.amp.autocast_mode import autocast as _torch_autocast

from .._policy.custom_fwd import _decorated_fwd
from .._policy.thread_state import thread_state
from .._policy.torch_state import enter_torch_autocast
from ._guard import in_checkpoint
from ._program import Running, local
from ._roots_state import _local as _roots_local
from ._shapes import float32_weights, shape_class
from ._stale import drop_strays

__all__ = ["casts_inputs", "installed", "watch"]

_thread = thread_state()
_autocast_enabled: Final = torch.is_autocast_enabled
_is_compiling = torch.compiler.is_compiling
#: torch's own ``__enter__`` (the wrapper calls it first)
_torch_enter: Final[Callable[[Any], Any]] = _torch_autocast.__enter__
#: ampcore's own entry of ``torch.autocast`` (a nested region's first entry of its flags): it
#: saves and restores the state between roots as it is, as its later entries (flags set directly) do
_AMPCORE_ENTRY: Final = enter_torch_autocast.__code__
#: the code of the functions ``torch.amp.custom_fwd`` and ``ampcore.custom_fwd`` return
_CUSTOM_FWD: Final = frozenset(
    (
        torch.amp.custom_fwd(lambda: None, device_type="cpu", cast_inputs=torch.float32).__code__,
        _decorated_fwd(lambda: None, None, torch.float32).__code__,
    )
)
_BASES: Final = (nn.Module, object)
#: class -> whether one of its methods is such a function with ``cast_inputs``
_CASTING: dict[type, bool] = {}


def _enter(self: Any) -> Any:
    between = _roots_local.between  # between roots, autocast left off (_roots): the region's state first
    if (
        between
        and local.run is None
        and _thread.stack
        and _thread.stack[-1] is local.settled
        and sys._getframe(1).f_code is not _AMPCORE_ENTRY  # (a nested ampcore region: as it sets flags directly)
    ):
        _roots_local.between = None
        torch.set_autocast_enabled(between, True)
    found = _torch_enter(self)
    run = local.run
    if run is not None and run.default_fp32 and not run.watching:
        watch(run)
    return found


_enter.__doc__ = _torch_enter.__doc__
_enter.__wrapped__ = _torch_enter  # type: ignore[attr-defined]


#: the class whose entry is wrapped, and the lock :func:`._roots.region_exited` takes to put
#: torch's own entry back where no thread is in an auto region (inline there: no Python call)
_TORCH_AUTOCAST: Final[Any] = _torch_autocast
_ENTERED_LOCK: Final = threading.Lock()


def installed() -> bool:
    """Whether ``torch.autocast.__enter__`` is wrapped."""
    return _torch_autocast.__enter__ is _enter


def watch(run: Running) -> None:
    """The forward of ``run``'s root call (a float32 default) entered a ``torch.autocast``:
    where it turned autocast on, hook the program's planned modules that follow the default
    (not switched nor guarded) with :func:`_inside` until the call ends."""
    stack = _thread.stack
    if (
        run.root is None
        or local.measuring
        or not stack
        or stack[-1] is not run.region
        or not _autocast_enabled(run.device_type)
    ):
        return
    program = run.program
    hooked = {id(ref()) for ref in program.switched + program.unseen}
    pre = functools.partial(_inside, run)
    for ref in program.planned:
        module = ref()
        if module is not None and id(module) not in hooked:
            run._hook(module, pre)
    run.watching = True
    run.simple = False  # (its root's post-hook calls stop, which removes these hooks)


def _inside(run: Running, module: nn.Module, args: tuple[Any, ...]) -> Any:
    """A planned module following a float32 default, called after the forward entered a
    ``torch.autocast``: where autocast is on, the plan's decision as the global hooks apply
    it (a fixed choice's verdict: every planned call that way)."""
    if local.run is not run or _is_compiling() or local.measuring:
        if type(run) is not Running:  # a deep copy's stray (bound to the copied key)
            drop_strays(module)
        return None
    stack = _thread.stack
    if not stack or stack[-1] is not run.region or in_checkpoint() or not _autocast_enabled(run.device_type):
        return None  # autocast off: the program's default
    key = shape_class(module, args, run.device_type)
    if key is None:
        return None
    program = run.program
    weights32 = float32_weights(module)
    decision = program.plan.decision(key) if weights32 else "low"  # else: the O1 lists
    if program.verdict != "plan":
        decision = "fp32" if program.verdict == "fp32" and weights32 else "low"
    if decision is None and program.measurable:  # (this call runs with the O1 lists, as a class's first call does)
        from ._deciding import measure_now  # (it imports the program's module)

        if measure_now(module, args, key, program.plan, run.region) is None:
            program.stale[0] = True  # the next call records: the class can be measured then
    return run.switch(module, args, off=True) if decision == "fp32" else None


def casts_inputs(root: nn.Module) -> bool:
    """Whether a module of ``root`` has a method decorated by ``custom_fwd(cast_inputs=...)``
    (torch's or ampcore's): it switches autocast off only where it was on."""
    for module in root.modules():
        cls = type(module)
        found = _CASTING.get(cls)
        if found is None:
            methods = [value for k in cls.__mro__ if k not in _BASES for value in vars(k).values()]
            found = _CASTING[cls] = any(_casting(value) for value in methods)
        if found:
            return True
    return False


def _casting(value: Any) -> bool:
    code = getattr(value, "__code__", None)
    if code is None or code not in _CUSTOM_FWD:
        return False
    cells = dict(zip(code.co_freevars, value.__closure__ or (), strict=False))
    cell = cells.get("cast_inputs")
    return cell is not None and cell.cell_contents is not None
