"""The state of ``level="auto"`` regions' roots (:mod:`._roots`): per thread, the places in
the code regions were entered at and the roots they called (:class:`_Site`), the keys of
ours in torch's hook dicts (:class:`_Key`), the program each root ran last
(:class:`_Last`: what a settled root call runs without looking anything up), and the
checks of torch's state the hot path reads without calls.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Final, Literal

import torch

from .._errors import AmpcoreWarning, warn_user
from .._policy.lists import compute_oplists
from .._policy.thread_state import thread_state
from . import _hooks
from ._program import Program, Running
from ._program import local as _prog
from ._stale import Stale as Stale
from ._stale import drop_strays as drop_strays

__all__: list[str] = []

#: distinct roots a place in the code may have before its regions use the global hooks (each
#: region there marks every one: 64 marks cost less than the global hooks on one small model;
#: 16 sent an ensemble of 20 models, a region each, call by call for ever)
_MAX_ROOTS: Final = 64
#: roots a place in the code has (without pre-hooks of their own) from which its regions
#: mark only the roots they call (:func:`._root_hooks.mark_called`, one more hook call per
#: root call) instead of all of them at entry and exit (two dict operations per root):
#: in a step the marker's call costs about what 3-4 marks do (docs/performance.md, issue
#: 27, twelfth stop: benchmarks/bench_auto_site_marks.py)
_MARK_CALLED: Final = 6
_MAX_SITES: Final = 256
#: signatures a root keeps settled in a thread (:attr:`_Last.alts`): the sizes of a loop's
#: micro-batches, its short last batch, a few sequence lengths (beyond: the oldest go)
_MAX_SIGNATURES: Final = 16
#: plans a root keeps settled per signature (a region's dtype, torch's thread count)
_MAX_PLANS: Final = 4
_PACKAGE: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_thread = thread_state()
_is_compiling = torch.compiler.is_compiling
#: whether ``torch.jit.trace`` is tracing this thread's calls: ``level="auto"`` then runs as
#: torch.autocast (the O1 lists: no recording, no measuring, no program; a traced shape's
#: sizes are tensors, and the trace would bake one call's decisions in)
_tracing: Final = torch._C._is_tracing
#: ``torch.compiler.is_compiling()`` is this flag outside TorchScript (dynamo compiling,
#: an export tracing): read without its two calls where no dynamo trace can read it (a
#: region's entry: ``autocast.__enter__``'s frame, which dynamo skips; the sentinel after
#: ``is_dynamo_compiling()``, which dynamo folds to True)
_FLAG: Final = isinstance(getattr(torch.compiler, "_is_compiling_flag", None), bool)


class _AskCompiling:
    """For a torch without the flag: the flag read calls ``is_compiling()``."""

    @property
    def _is_compiling_flag(self) -> bool:
        return bool(_is_compiling())


_compiler: Final[Any] = torch.compiler if _FLAG else _AskCompiling()
_dynamo_compiling: Final = torch.compiler.is_dynamo_compiling
_autocast_enabled: Final = torch.is_autocast_enabled
_num_threads: Final = torch.get_num_threads
_set_autocast: Final = torch.set_autocast_enabled


class _Site:
    """The roots the eligible regions entered at one place in the code called (weak).  At a
    site of :data:`_MARK_CALLED` or more plain roots (``marking``) a region marks at entry
    only the ``early`` ones (pre-hooks of their own, a dict that refused our key: they need
    their mark before torch's call starts), and the others (``called``, by id) as it calls
    them (:func:`._root_hooks.mark_called`)."""

    def __init__(self) -> None:
        self.roots: list[weakref.ref[torch.nn.Module]] = []
        self.overflow = False  # more than _MAX_ROOTS roots: its regions use the global hooks
        self.marking = False
        self.called: dict[int, weakref.ref[torch.nn.Module]] = {}
        self.early: list[weakref.ref[torch.nn.Module]] = []
        self.early_ids: set[int] = set()
        self.late = (
            False  # a global pre-hook registered in its regions: every root marked late (_root_hooks.global_after)
        )

    def update(self, called: list[weakref.ref[torch.nn.Module]], early: Iterable[int] = ()) -> None:
        """Add the roots ``called`` (those met through the sentinel), and the ids of roots
        to mark at entry from now on (``early``); drop the collected ones."""
        known = {id(m): r for r in [*self.roots, *called] if (m := r()) is not None}
        self.overflow = len(known) > _MAX_ROOTS
        self.roots = list(known.values())
        ids = self.early_ids = (self.early_ids | set(early)) & known.keys()
        self.called = {i: r for i, r in known.items() if i not in ids and not _own_pre(r())}
        self.early = [r for i, r in known.items() if i not in self.called]
        self.marking = len(self.called) >= _MARK_CALLED


def _own_pre(module: Any) -> bool:
    return bool(getattr(module, "_forward_pre_hooks", None))


#: What :func:`region_entered` did for a region (undone by :func:`region_exited`): the
#: region, its site (None: not eligible, the global hooks were acquired) and the roots given
#: the instance hooks (or the hooks' handles).  A plain tuple: made on every region entry.
_Entered = tuple[Any, "_Site | None", list[Any]]


class _Key:
    """A key of ours in torch's hook dicts (hashed by identity): one per thread for its root
    hooks, one for its sentinel, one for the sentinel as a root's own last pre-hook.  A copy
    of a module made while it holds one (``copy.deepcopy``, pickling: an EMA copy in the
    step) holds a :class:`Stale` instead."""

    __slots__ = ("__weakref__",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Stale, ())


class _Last:
    """The program a root ran last in this thread for one signature, and what it was found
    under: the region's spec, the plans' generation and the thread count (what the plan
    depends on), the signature; the program's fields its guard reads (one attribute each);
    and its :class:`Running`, kept for the next call (no object per call).  ``alts``: the
    root's entries by signature (one dict per root, shared by its entries, at most
    :data:`_MAX_SIGNATURES`), each a list of up to :data:`_MAX_PLANS` entries of other plans
    (a region's dtype, torch's thread count): a root called with signatures or plans in
    turn finds each without a lookup of its program or a new entry."""

    __slots__ = (
        "alts", "changes", "generation", "plain", "plan", "program", "ref", "run", "sig", "spec", "stale",
        "switches_root", "threads", "tree", "values", "weights",
    )  # fmt: skip
    ref: weakref.ref[torch.nn.Module]
    alts: dict[Any, list[_Last]]
    plan: Any
    spec: Any
    threads: int

    def __init__(
        self,
        root: torch.nn.Module,
        sig: tuple[Any, ...],
        program: Program,
        spec: Any,
        generation: int,
        table: dict[int, _Last],
    ) -> None:
        key = id(root)
        threads = _num_threads()
        known = table.get(key)
        if known is not None and known.ref() is root:  # the root's other signatures: one ref
            self.ref, self.alts = known.ref, known.alts
            if len(self.alts) >= _MAX_SIGNATURES and sig not in self.alts:
                del self.alts[next(iter(self.alts))]  # the oldest
        else:

            def gone(ref: weakref.ref[torch.nn.Module]) -> None:  # the root was collected: drop
                if (entry := table.get(key)) is not None and entry.ref is ref:  # its programs
                    del table[key]
                    entry.alts.clear()  # the entries hold each other

            self.ref, self.alts = weakref.ref(root, gone), {}
        self.alts[sig] = [*_others(self.alts.get(sig, []), program.plan, spec, threads), self]
        self.sig, self.program, self.spec = sig, program, spec
        self.generation, self.threads = generation, threads
        self.plan, self.changes = program.plan, program.changes
        #: read per settled call: a provisional verdict's countdown to its re-check (:mod:`._again`)
        self.stale = program.stale if program.recheck is None else program.recheck
        self.tree, self.values, self.weights = program.tree, program.tree_values, program.weights
        self.plain = program.plain  # the plain containers of layers (:func:`._guard.unchanged`)
        self.run: Running | None = None
        #: the root is itself a switched module: its own pre-hook would come too late
        self.switches_root = any(ref() is root for ref in program.switched)


def _others(entries: list[_Last], plan: Any, spec: Any, threads: int) -> list[_Last]:
    """The entries a new one for the same signature keeps beside it: not one of its plan, nor
    of its region and thread count (which it replaces); the latest :data:`_MAX_PLANS` - 1."""
    kept = [e for e in entries if e.plan is not plan and not (e.spec is spec and e.threads == threads)]
    return kept[-(_MAX_PLANS - 1) :]


class _Local(threading.local):
    def __init__(self) -> None:
        self.entered: list[_Entered] = []
        self.sentinel: Any = None  # its global pre-hook's key (or handle) while it is on
        self.called: dict[int, weakref.ref[torch.nn.Module]] = {}  # roots the site did not know
        self.sites: dict[tuple[Any, int], _Site] = {}
        #: the place (code, instruction offset) of the last eligible region and its site: a
        #: region in a loop finds it without hashing the code object
        self.site_code: Any = None
        self.site_at = -1
        self.site: Any = None
        self.key = _Key()  # this thread's key in its roots' forward hooks (the post-hook) in a region
        self.ident = threading.get_ident()  # the thread's (its key in _hooks.region_threads)
        self.sentinel_key = _Key()  # its sentinel's, also in each root's with-kwargs pre-hook dict
        #: at a site that marks the roots its regions call (:attr:`_Site.marking`): the
        #: site's roots by id while a region lasts (None: none), the region's list of marked
        #: roots, and the key of the marker (a global pre-hook just before the sentinel)
        self.marking: dict[int, weakref.ref[torch.nn.Module]] | None = None
        self.marked: list[Any] = []
        self.marker_key = _Key()
        #: its key in the pre-hook dict of a root with pre-hooks of its own (the user's:
        #: FSDP2's, ZeRO-3's, an offload hook's): the sentinel as that root's last pre-hook
        self.late_key: Any = _Key()  # (Any: torch types the dicts as keyed by handle ids)
        #: the modules inside the root being recorded whose own last pre-hook is the global
        #: hooks' (``_hooks.defer``)
        self.deferred: list[torch.nn.Module] = []
        self.public: set[int] = set()  # ids of the roots hooked through torch's public API
        #: torch's next hook handle id at the eligible region's entry: the global hooks the
        #: user registers inside it have ids from here (``_root_hooks.user_hooks_last``)
        self.hooks_from = 0
        #: programs recorded while such hooks were in place (their stale flags, the hooks'
        #: ids): recorded again where a later region finds them registered before it
        self.among: list[tuple[list[bool], list[int]]] = []
        #: the region's ops between its roots (``_roots._root_post``): None while its roots so far ran
        #: float32 throughout (or none ran), the device type whose autocast the last one left off for
        #: the ops after it (on again at the next root call or a ``torch.autocast`` entered), False
        #: once a root ran anything in low precision (the O1 lists for the rest of the region)
        self.between: str | Literal[False] | None = None
        #: id(root) -> the program it ran last (valid while nothing it depends on changed);
        #: its ``alts``: the root's entries for other signatures and plans
        self.last: dict[int, _Last] = {}


_local = _Local()
#: torch's dict of global forward pre-hooks (what register_module_forward_pre_hook fills):
#: the sentinel goes in and out under a key of its own, without a handle per switch
_GLOBAL_PRE: Final = getattr(torch.nn.modules.module, "_global_forward_pre_hooks", None)
_Module: Final = torch.nn.Module
#: torch's dicts of global forward hooks (a root call's post-hook goes there, before the
#: user's registered in the region: ``_root_hooks.post_first``)
_GLOBAL_POST: Final = getattr(torch.nn.modules.module, "_global_forward_hooks", None)
_GLOBAL_ALWAYS: Final = getattr(torch.nn.modules.module, "_global_forward_hooks_always_called", None)


_GROUP_WARNED: Final = [False]


def _alone() -> bool:
    """Whether a whole-call check (:mod:`._verify`) may run a root's forward and backward
    again in this process alone: not in a process group of several processes, where the
    collectives of FSDP2, ZeRO-3 or DDP inside them would wait for ever for the other
    ranks, which do not run them (its program then runs as recorded, unchecked).  Warns
    once."""
    dist = sys.modules.get("torch.distributed")  # (imported by whoever made a group)
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() <= 1:
        return True
    if not _GROUP_WARNED[0]:
        _GROUP_WARNED[0] = True
        warn_user(
            "ampcore.autocast(level='auto'): in a process group of several processes the "
            "whole-call checks of mixed programs are skipped (their forward and backward would "
            "run collectives on this rank alone); load one checked plan on every rank "
            "(ampcore.load_plan) to run checked programs",
            AmpcoreWarning,
        )
    return False


def turn(last: _Last, sig: Any, spec: Any, threads: int, region: Any, module: torch.nn.Module) -> _Last | None:
    """The entry ``module`` keeps settled for ``sig`` under this region's plan and thread
    count (signatures, region dtypes or thread counts that take turns), remembered as its
    last; None: none."""
    entries = last.alts.get(sig)
    if not entries:
        return None
    for found in entries:  # (a loop, not a generator: this runs on every call of a root whose
        if found.spec is spec and found.threads == threads:  # micro-batches take turns)
            _local.last[id(module)] = found
            return found
    for found in entries:  # a region made another way (another spec object): its plan decides
        if found.threads == threads and _same_plan(found, region):
            _local.last[id(module)] = found
            return found
    return None


def _same_plan(last: _Last, region: Any) -> bool:
    """Whether ``region`` (another region object than ``last`` was found under: a region
    made per step) has the plan of ``last``'s program; it is then remembered as ``last``'s."""
    if _hooks.plan_of(region) is not last.plan:
        return False
    last.spec = region.spec
    return True


def _site_at(local: _Local, code: Any, at: int) -> _Site:
    """The site of the place ``(code, at)`` (``at``: the offset of the instruction that entered
    the region; made where new), remembered as the last."""
    if code is local.site_code and at == local.site_at:  # entered through ampcore's frames
        return local.site  # type: ignore[no-any-return]
    where = (code, at)
    site = local.sites.get(where)
    if site is None:
        if len(local.sites) > _MAX_SITES:
            local.sites.clear()
        site = local.sites[where] = _Site()
    local.site_code, local.site_at, local.site = code, at, site
    return site


def _idle_region() -> Any:
    """The eligible region when it is innermost and no root call of it is in progress."""
    if _prog.run is not None or _prog.rec is not None or _prog.measuring or _is_compiling() or _tracing():
        return None
    region, stack = _prog.settled, _thread.stack
    if region is None or not stack or stack[-1] is not region:
        return None
    return region if torch.is_autocast_enabled(region.spec.backend.device_type) else None  # off: nothing planned


def _white(region: Any) -> frozenset[str]:
    """The O1 lists' low-precision ops of ``region``'s spec (what a recording may switch)."""
    spec = region.spec
    return compute_oplists(spec.backend, spec.dtype, "O1", frozenset(), frozenset()).white


def _compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` is ``torch.compile``'s wrapper (its hooks do nothing)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # imported once torch.compile was used
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return optimized is not None and isinstance(module, optimized)
