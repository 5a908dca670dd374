"""Programs for copies of a root: a model copied per step (``copy.deepcopy``, replicas as
``nn.DataParallel`` makes them, an EMA or teacher copy) runs the program of the root it was
copied from instead of being recorded again.

A program is kept by the root's *layers* (:func:`layers`: every module's name, class,
``extra_repr``, parameter shapes and dtypes), its input signature and plan, with its modules
named by their paths in the root (:func:`keep`, as recorded, then as its whole-call check
settled it).  A root
without a program for a call, whose layers and signature match a kept one, gets that program
with its own modules in those places (:func:`adopt`): the decisions, the steps and the
whole-call verdict are the kept one's, the guards (its tree, its weights) its own.  The
copies of one kept program share its stale flag: a guard of one that meets a class to
measure (or a class added that one ran undecided) makes the next copy record (and measure)
again; a root whose own program went stale records again too.  (No weak reference
callback marks a copy's program stale: a replaced layer changes the tree it guards, and a
collected copy runs nothing.)  A copy's digest reuses the texts made for its source's modules
(:func:`_piece`: the same class, attribute names and attribute objects; about a third of
the cost of making them, the thirteenth stop).  Before,
each copy was a new root: a recording per step, 1.4-1.5 x the better fixed choice on a
2-layer encoder copied each step.  The first call of a module not yet a root gets its
keyword arguments from torch's call frame (:func:`call_kwargs`: its global pre-hooks are
given the positional ones only); where that frame is not torch's, the call is recorded as
before.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import weakref
from collections import OrderedDict
from functools import partial
from operator import attrgetter, is_, is_not, itemgetter
from typing import Any, Final, NamedTuple

from torch import nn
from torch.nn.parameter import is_lazy

from ._guard import signature, snapshot
from ._heal import portable as portable_cell
from ._heal import quiet
from ._plan import AutoPlan, Stale
from ._program import Program
from ._settings import any_held as _settings_held
from ._settings import held_of, watch_now
from ._settings import text as settings

__all__ = ["adopt", "call_kwargs", "drop_walk", "keep", "layer", "layers", "torch_kwargs"]

#: (layers, signature, id of the plan) -> the program with module paths for its modules
_kept: OrderedDict[tuple[str, Any, int], tuple[Program, int | None]] = OrderedDict()
#: programs kept (the oldest goes first)
_MAX_KEPT: Final = 64
#: the digest :func:`call_kwargs` took of a copy's layers, for :func:`adopt` in the same call
#: (a replica per step: its layers walked once, not twice; about 0.7 ms on a 2-layer encoder)
_digest = threading.local()
#: the code of torch's module call, whose closure calls the global pre-hooks
_CALL: Final = nn.Module._call_impl.__code__


def layer(module: nn.Module) -> str:
    """A module as the whole-call check's key sees it: class, ``extra_repr``, parameter
    shapes, settings (:mod:`._settings`: ``depth=3``, a flag, a scale its forward may pick
    its work from)."""
    shapes = [_shape(p) for p in module._parameters.values() if p is not None]
    return f"{type(module).__name__}({module.extra_repr()}){shapes}{settings(module)}"


def _shape(p: Any) -> tuple[Any, ...]:
    """A parameter's shape; ``("lazy",)`` for one a lazy module has not made yet
    (``nn.LazyLinear`` before its first call, whose shape cannot be read)."""
    return ("lazy",) if is_lazy(p) else tuple(p.shape)


def layers(root: nn.Module, walked: list[tuple[str, nn.Module]] | None = None) -> str:
    """A digest of ``root``'s layers: each module's path, :func:`layer` and parameter dtypes
    (each module's text kept beside it, :func:`_piece`); ``walked``: a list given gets
    ``root.named_modules()`` (the one walk of a copy's tree: :func:`adopt` takes its modules
    and its guard from it)."""
    named = list(root.named_modules())
    if walked is not None:
        walked += named
    held = _settings_held()
    text = ";".join(f"{name}:{_piece(m, held)}" for name, m in named)
    return f"{type(root).__qualname__}#" + hashlib.sha1(text.encode()).hexdigest()


class _Text:
    """A module's text in :func:`layers` and what it was made from: the values of its public
    attributes (the objects themselves), its held settings, its parameters' shapes and
    dtypes and, for a class whose ``extra_repr`` may read more (:func:`_plain_repr`), that
    (its class and attribute names are its key in :data:`_texts`)."""

    __slots__ = ("extra", "held", "params", "public", "take", "text")

    def __init__(
        self, module: nn.Module, names: tuple[str, ...], held: frozenset[str], params: Any, extra: str | None
    ) -> None:
        places = [i for i, k in enumerate(names) if k[0] != "_"]
        # (a tuple also for one place: it twice)
        self.take: Any = itemgetter(*places, places[0]) if places else _nothing
        self.held, self.params, self.extra = held, params, extra
        self.public = self.take(tuple(module.__dict__.values()))
        self.text = f"{layer(module)}{[p.dtype for p in module._parameters.values() if p is not None]}"


def _nothing(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return ()


#: (a module's class, the names in its ``__dict__``) -> the :class:`_Text` of the last
#: modules of that class and those names whose texts were made, the latest first (a copy's
#: modules find their source's: a replica's share its values, a deep copy keeps ints,
#: floats, strings and their tuples as they are)
_texts: dict[tuple[type, tuple[str, ...]], list[_Text]] = {}
#: module layouts kept (all dropped beyond: a stream of new classes), texts per layout
_MAX_TEXTS: Final = 1024
_PER_LAYOUT: Final = 16
_SHAPE_DTYPE: Final = attrgetter("shape", "dtype")
_PRESENT: Final = partial(is_not, None)
_NONE: Final[frozenset[str]] = frozenset()


def _piece(module: nn.Module, any_held: bool = True) -> str:
    """``module``'s part of :func:`layers` (:func:`layer` and its parameters' dtypes): the
    text made for a module of its class and attribute names is reused while this one's
    public attributes are the same objects, its held settings, its parameters' shapes and
    dtypes and (where its class's ``extra_repr`` may read more than those,
    :func:`_plain_repr`) its ``extra_repr`` the same: a copy's digest costs C-level
    compares, about half of making its text (a list or an object among its public
    attributes, copied, makes it again).  ``any_held``: False where no module has a held
    setting (:func:`._settings.any_held`, asked once per digest)."""
    state = module.__dict__
    kind = type(module)
    key = (kind, tuple(state))
    held = held_of(module) if any_held and _settings_held() else _NONE
    try:
        params = tuple(map(_SHAPE_DTYPE, filter(_PRESENT, module._parameters.values())))
    except RuntimeError:  # a lazy module's parameters not made yet (their shape cannot be read)
        params = tuple((_shape(p), p.dtype) for p in module._parameters.values() if p is not None)
    plain = _plain.get(kind)
    if plain is None:
        plain = _plain[kind] = _plain_repr(kind)
    extra = None if plain else module.extra_repr()
    values = None
    for found in _texts.get(key, ()):  # (a layout's few variants: Linear(128, 512), Linear(512, 128))
        if found.held == held and found.params == params and found.extra == extra:
            if values is None:
                values = tuple(state.values())
            if all(map(is_, found.take(values), found.public)):
                return found.text
    if len(_texts) >= _MAX_TEXTS:
        _texts.clear()
    made = _Text(module, key[1], held, params, extra)
    texts = _texts.setdefault(key, [])
    texts.insert(0, made)
    del texts[_PER_LAYOUT:]
    return made.text


def _plain_repr(kind: type) -> bool:
    """Whether ``kind``'s ``extra_repr`` says only what its public attributes and its
    parameters' shapes say: ``nn.Module``'s own (nothing), or one of ``torch.nn``'s layers
    (not its containers of parameters, which print their devices; not a TorchScript module,
    which prints its compiled type's name)."""
    own = getattr(kind, "extra_repr", None)
    if own is nn.Module.extra_repr:
        return True
    where = getattr(own, "__module__", "") or ""
    return where.startswith("torch.nn.modules.") and where != "torch.nn.modules.container"


#: class -> :func:`_plain_repr`
_plain: dict[type, bool] = {}


def keep(root: nn.Module, sig: tuple[Any, ...], program: Program) -> None:
    """Keep ``program``, ``root``'s for calls of ``sig``, for copies of ``root`` (replacing
    the one kept for its layers and ``sig``: a program checked since it was recorded)."""
    if program.stale[0] or any(program.stale is k.stale and program.checked <= k.checked for k, _ in _kept.values()):
        return  # (a copy's adopted program, as kept: a check since is kept)
    names = {id(m): name for name, m in root.named_modules()}
    named = _paths(program, names)
    if named is None:
        return  # a module gone, or not the root's own (a layer held elsewhere): not portable
    recheck = program.recheck  # a provisional verdict's countdown: each copy gets its own (adopt)
    if recheck is not None:
        recorded = _paths(recheck.program, names)
        if recorded is None:
            return
        named["recheck"] = _Pending(recheck.program._replace(**recorded, **_UNGUARDED), recheck.key)
    waiting = program.plan.added if id(program.stale) in program.plan.waiting else None
    stale = portable_cell(program.stale)  # the copies' countdown where its classes are provisional (._heal)
    portable = program._replace(**named, **_UNGUARDED, stale=stale)
    key = (layers(root), sig, id(program.plan))
    _kept[key] = (portable, waiting)
    _kept.move_to_end(key)
    while len(_kept) > _MAX_KEPT:
        _kept.popitem(last=False)


def adopt(root: nn.Module, sig: tuple[Any, ...], plan: AutoPlan) -> Program | None:
    """The program kept for a root with ``root``'s layers and calls of ``sig`` under
    ``plan``, made for ``root``'s own modules; None where none is kept."""
    from ._store import _programs

    taken, _digest.last = getattr(_digest, "last", None), None  # call_kwargs's, this call's only
    if not _kept or not _replanned(_programs.get(root, {}).get(sig, None), plan):  # its own, gone stale: it
        return None  # records again (one the plan's new decisions alone made invalid: a copy's program made since)
    if taken is not None and taken[0]() is root and taken[2] == sig:
        digest, named = taken[1], taken[3]
    else:
        named = []
        digest = layers(root, named)
    key = (digest, sig, id(plan))
    found = _kept.get(key)
    if found is None:
        return None
    portable, waiting = found
    if waiting is not None and isinstance(portable.stale, Stale):  # it ran undecided calls: records
        plan.wait(portable.stale, waiting)  # again once the plan gains a class
    if portable.stale[0] and (calm := quiet(portable)) is not portable:  # nothing left to measure here (._heal)
        portable = calm
        _kept[key] = (portable, waiting)
    if portable.stale[0] or portable.plan is not plan or portable.changes != plan.changes:
        del _kept[key]  # a guard of a copy met a class to measure, or the plan changed: a copy records
        return None
    modules = dict(named)  # (the walk of its digest, in this call: one walk a copy)
    listed = list(modules.values())
    own = _mapped(portable, modules)
    planned: list[nn.Module] = [r() for r in (*own["planned"], *own["unseen"])]
    tree, values, weights, plain = snapshot(root, planned, listed)
    watched = watch_now(listed)  # its own settings (._settings)
    if watched is not None:  # (before: none, a copy's setting changed later ran the source's verdict on)
        plain = (*plain, (None, "", *watched))
    guards: dict[str, Any] = {"tree": tree, "tree_values": values, "weights": weights, "plain": plain}
    program = portable._replace(**own, **guards)
    pending = portable.recheck
    if isinstance(pending, _Pending):  # its own countdown, on its own modules and guards (before: the
        # source's recorded program, shared, whose re-check gave each copy the source's modules to run)
        from ._again import Recheck

        recheck = Recheck(pending.program._replace(**_mapped(pending.program, modules), **guards), pending.key)
        recheck.cell = program.stale
        program = program._replace(recheck=recheck)
    return program


def _replanned(own: Any, plan: AutoPlan) -> bool:
    """Whether a root may adopt a kept program for a signature it has ``own`` for: none, or
    one made invalid by ``plan``'s changed decisions alone (a class measured again decided
    otherwise: the roots of one class adopt the first one's program made since, instead of
    each recording again; before, an ensemble of 20 models recorded 20 times).  Not a count
    of recordings that gave none (a setting re-baselined, classes undecided: it records)."""
    return own is None or (
        isinstance(own, Program) and own.plan is plan and own.changes != plan.changes and not _set_for(own.stale)
    )


def _set_for(stale: list[bool]) -> bool:
    """Whether ``stale`` was set (a module collected, a class added): its value, not a
    :class:`._heal.Heal` countdown's reading (a class due, or nothing left to measure)."""
    return list.__getitem__(stale, 0)


class _Pending(NamedTuple):
    """A kept program's provisional verdict: the recorded program its check compared (with
    module paths) and the check's key; each copy makes its own countdown of it (:func:`adopt`)."""

    program: Program
    key: str


#: a kept program's guards: each copy snapshots its own
_UNGUARDED: Final[dict[str, Any]] = {"tree": (), "tree_values": [], "weights": (), "plain": ()}


def _paths(program: Program, names: dict[int, str]) -> dict[str, Any] | None:
    """``program``'s modules as their paths in the root (``names``: id -> path), the fields
    :func:`_mapped` maps back; None where one is gone or not the root's own."""
    named: dict[str, Any] = {}
    for field in ("switched", "planned", "unseen"):
        paths = tuple(names.get(id(m)) for r in getattr(program, field) if (m := r()) is not None)
        if len(paths) != len(getattr(program, field)) or None in paths:
            return None
        named[field] = paths
    steps: Any = tuple((names.get(id(m)), calls) for r, calls in program.steps if (m := r()) is not None)
    if len(steps) != len(program.steps) or any(name is None for name, _ in steps):
        return None
    named["steps"] = steps
    named["inner_ids"] = frozenset(names[i] for i in program.inner_ids if i in names)
    return named


def _mapped(portable: Any, modules: dict[str, nn.Module]) -> dict[str, Any]:
    """The fields of ``portable`` (module paths: :func:`_paths`) for a copy's ``modules`` by path."""

    def refs(paths: tuple[Any, ...]) -> tuple[weakref.ref[nn.Module], ...]:
        return tuple(weakref.ref(modules[p]) for p in paths)

    return {
        "switched": refs(portable.switched),
        "planned": refs(portable.planned),
        "unseen": refs(portable.unseen),
        "steps": tuple((weakref.ref(modules[p]), calls) for p, calls in portable.steps),
        "inner_ids": frozenset(id(modules[p]) for p in portable.inner_ids),
    }


def call_kwargs(module: nn.Module, args: tuple[Any, ...], plan: AutoPlan) -> dict[str, Any] | None:
    """The keyword arguments of ``module``'s call whose global pre-hook is running, where a
    program is kept for its layers and the call's signature: the call can then run it
    (None: record it)."""
    if not _kept:
        return None
    kwargs = torch_kwargs(sys._getframe(3))  # torch's closure <- the sentinel <- new_root <- here
    if kwargs is None:
        return None
    sig = signature(args, kwargs, module)
    if sig is None:
        return None
    named: list[tuple[str, nn.Module]] = []
    digest = layers(module, named)
    if (digest, sig, id(plan)) not in _kept:
        return None
    _digest.last = (weakref.ref(module), digest, sig, named)  # for adopt() in this call
    return kwargs


def drop_walk() -> None:
    """Forget the walk :func:`call_kwargs` left for :func:`adopt` (its call took another way:
    a copy's modules are not held past its call)."""
    _digest.last = None


def torch_kwargs(frame: Any) -> dict[str, Any] | None:
    """The keyword arguments of the module call whose pre-hooks run, read from torch's
    ``Module._call_impl`` closure (``inner``) at ``frame`` or up to three frames above it
    (a wrapper of ours between them); None where that frame is not torch's (another torch
    version's module call: the caller falls back to what it did before)."""
    for _ in range(4):
        if frame is None or frame.f_code.co_name == "inner":
            break
        frame = frame.f_back
    if frame is None or frame.f_code.co_name != "inner" or frame.f_back is None or frame.f_back.f_code is not _CALL:
        return None
    kwargs = frame.f_locals.get("kwargs")
    return kwargs if isinstance(kwargs, dict) else None


def forget() -> None:
    """Drop every kept program (``ampcore plan clear``, tests)."""
    _kept.clear()
    _texts.clear()
    _plain.clear()
