"""The whole-call check of a root's program (:mod:`._checks` says why and the rule).

Once per root, input signature and program (and per fingerprint: the verdict is cached on
disk with the plan), before the program first runs: the root's call is timed under the
program, under the O1 lists alone (``low``: as torch.autocast) and in float32, forward
and backward, with the adapter's clock (device events where the device has them: no host
synchronisation inside a timed run).  Each candidate runs once untimed (one-time set-up),
then the three are timed in rounds whose orders (:mod:`._orders`) make each follow each
other equally often, across the rounds' boundaries too (a run pays for what the run before
it left behind: caches, the allocator's free lists; every permutation in turn balanced the
rounds' insides only).  At least :data:`~._measure.MIN_RUNS`
rounds, at most :data:`~._measure.MAX_RUNS`, within :data:`PER_ROOT_MS` of the process's
budget; a check too noisy to decide (:func:`_doubtful`: a wide spread, or a win far beyond
what the program's float32 modules save by their own figures) is measured once more, its
rounds added to the first ones.  The root's
parameters, gradients, buffers (running statistics) and the RNG state are left as they
were; the autocast weight cache is on in each run, cleared before it, as a step's region
starts without cast weights (a weight used twice in one call is cast once, as in a
torch.autocast step), and after the last, except where it may hold casts of a call before
the check in the same region: then it is kept as it was and the runs cast without it
(:mod:`._castcache`).  Each run gets copies of
the call's lists and dicts and of the objects among its arguments (a KV cache the forward
grows: its tensors cloned, before the run is timed), so the real call that follows sees
its arguments as they were.

A *uniform* program (every planned call low: torch.autocast's; or every one float32) is
exactly one fixed choice: it is timed, the same way, against the other one alone (two
candidates, in alternation), so a wrong per-class figure, or whole-call work no
class's figures hold (the casts between layers, launches), cannot pin the root to the
slower choice for good.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
from torch import nn

from .._errors import AmpcoreWarning, warn_user
from ._again import again as _measure_again
from ._again import pending
from ._castcache import kept_cache
from ._checks import RootCheck, recheck, unsettled
from ._costs import MARGIN, SPREAD_BOUND
from ._hostclock import exposure, lost
from ._kept import Inputs, muted_hooks
from ._measure import MAX_ROUNDS, MAX_RUNS, MIN_RUNS, Clock, Label, _fork_rng, kept_buffers
from ._orders import orders
from ._plan import AutoPlan
from ._program import Program, Running
from ._program import local as _prog
from ._store import store
from ._twins import layer as _layer

__all__ = ["PER_ROOT_MS", "root_key", "settle"]

#: The share of the process's measuring budget one whole-call check may use (ms); a check
#: always times :data:`~._measure.MIN_RUNS` rounds.
PER_ROOT_MS: Final = 1500.0
_CANDIDATES: Final = ("plan", "low", "fp32")
#: forwards that raise in the whole-call check before the check is given up for the root's
#: signature (a forward that cannot run again); fewer: checked again at the next call
CHECK_TRIES: Final = 3
_LABELS: Final[dict[str, Label]] = {"plan": "root-plan", "low": "root-low", "fp32": "root-fp32"}


def root_key(root: nn.Module, sig: tuple[Any, ...], program: Program) -> str:
    """The key of a whole-call check: the root's class, its input signature, the program
    (its default and which modules, by name, are switched) and the root's layers (each
    module's name, class, ``extra_repr``, parameter shapes and settings: two
    ``nn.Sequential`` of other layers on the same inputs, or of convolutions with other
    strides, are two checks, not one; so are two instances of a class whose forward picks
    its work from an attribute, ``self.depth``, that differs: :mod:`._settings`).

    Example::

        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> p = Program(None, 0, False, (), (), False)  # type: ignore[arg-type]
        >>> root_key(net, (True, (torch.Size([4, 2]), torch.float32, torch.device("cpu"))), p)
        'Sequential in=[4x2] grad program=low+0 #6ee5f23e'
    """
    shapes = []
    for entry in sig[1:]:
        if type(entry) is tuple and len(entry) == 4 and entry[0] == "held":  # an object's tensor, by shape class
            shapes.append("~" + "x".join(map(str, entry[3])))
            continue
        if not isinstance(entry, tuple) or not isinstance(entry[-2], torch.dtype):
            continue  # not a tensor's (a flag's value, a container's mark: see signature)
        shape, dtype = entry[-3], entry[-2]
        text = "x".join(map(str, shape)) + ("" if dtype == torch.float32 else f":{str(dtype).removeprefix('torch.')}")
        shapes.append(f"{entry[0]}={text}" if len(entry) == 4 else text)
    names = {id(m): name for name, m in root.named_modules()}
    switched = sorted(names.get(id(m), "?") for r in program.switched if (m := r()) is not None)
    steps = "".join(
        sorted(
            f"|{names.get(id(m), '?')}:{''.join(map(str, map(int, calls)))}" for r, calls in program.steps if (m := r())
        )
    )
    layers = ";".join(f"{name}:{_layer(m)}" for name, m in root.named_modules())
    digest = hashlib.sha1(f"{program.default_fp32}|{','.join(switched)}{steps}|{layers}".encode()).hexdigest()[:8]
    default = "fp32" if program.default_fp32 else "low"
    grad = ("grad" if sig[0] else "no-grad") + (" eval" if sig[-1] == "eval" else "")
    return f"{type(root).__name__} in=[{', '.join(shapes)}] {grad} program={default}+{len(switched)} #{digest}"


def settle(
    root: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    program: Program,
    region: Any,
    plan: AutoPlan,
    sig: tuple[Any, ...],
    clock: Clock | None,
) -> Program:
    """What ``root`` runs for ``sig``: ``program`` when it wins its whole-call check, else
    the better fixed choice (:meth:`Program.fixed`); a uniform program (every planned call
    one way, :meth:`Program.uniform`) is checked against the other fixed choice alone and
    runs as recorded unless that choice beats it beyond the noise; checked once
    (``clock`` None: nothing can be measured, the program runs as recorded), cached in
    ``plan`` and stored as the root's program.  A check whose forward raised returns the
    program unchecked (checked again at the next call) until it has failed
    :data:`CHECK_TRIES` times: then the program runs as recorded, unchecked.  A provisional check read from the cache
    (measured busy or noisy by an earlier process) is measured again once in this process
    (:func:`~._checks.recheck`); a provisional verdict is measured again later in the process
    too, when its program has run settled for a while (:mod:`._again`)."""
    if program.recheck is not None:  # a provisional verdict's program: measured again when due (._again)
        from . import _hooks

        measure = None if clock is None else lambda rec: _check(root, args, kwargs, rec, region, clock, rec.uniform())
        load = _hooks.load_of(region) if measure is not None and program.recheck.due else None
        chosen = _measure_again(program, plan, measure, load)
        if chosen is not program:
            store(root, sig, chosen)
        return chosen
    own = program.uniform()
    planned_root = any(r() is root for r in program.planned)  # its own hooks decide
    alone = own == "low" and not fp32_exact(program)  # float32 is no choice: nothing to compare
    if (own is None and not program.mixed()) or planned_root or alone:
        chosen = program.fixed("plan")
    else:
        key = root_key(root, sig, program)
        check = plan.roots.get(key)
        again = check is not None and check.provisional and check.source == "cache"  # by an earlier process
        if (check is None or again) and clock is not None and not plan.frozen:
            try:
                found = _check(root, args, kwargs, program, region, clock, own)
            except Exception as exc:  # a forward that raised: the real call follows
                if program.check_tries + 1 < CHECK_TRIES:  # (its own error, a bad batch: the real call raises too)
                    retry = program._replace(check_tries=program.check_tries + 1)
                    store(root, sig, retry)  # unchecked: checked at the next call
                    return retry
                _unrepeatable(root, exc)  # a forward that cannot run again
                store(root, sig, program.fixed("plan"))
                return program.fixed("plan")
            check = found if check is None else recheck(check, found)
            plan.set_root(key, check)
            from ._cache import write_cache

            write_cache(plan)
        verdict = "plan" if check is None or check.verdict == own else check.verdict
        chosen = program.fixed("low" if verdict == "fp32" and not fp32_exact(program) else verdict)
        if clock is not None:  # a provisional verdict: measured again later in this process too
            chosen = pending(chosen, program, key, check, plan)
    store(root, sig, chosen)
    return chosen


def fp32_exact(program: Program) -> bool:
    """Whether the ``fp32`` choice of ``program`` is the float32 step: not where planned
    calls ran inside ``torch.utils.checkpoint`` (they follow the autocast state of its
    entry, in the recompute too: no hook of ours runs there) unless autocast can be off for
    the whole root (its inputs and weights float32, :meth:`Program.fixed`); bfloat16
    inputs or a layer of bfloat16 weights leave them low.  Float32 is then no candidate."""
    return not program.checkpointed or program.fp32_root


def _unrepeatable(root: nn.Module, exc: Exception) -> None:
    warn_user(
        f"ampcore.autocast(level='auto'): the whole-call check of {type(root).__name__} failed when it "
        f"ran the forward again ({type(exc).__name__}: {exc}); its mixed program runs as recorded, "
        "unchecked (AMPCORE_AUTO_BUDGET=0 or ampcore.load_plan(..., freeze=True) skip the check)",
        AmpcoreWarning,
    )


def _check(
    root: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    program: Program,
    region: Any,
    clock: Clock,
    own: str | None = None,
) -> RootCheck:
    """The whole-call check of ``program``: against both fixed choices, or, for a uniform
    program (``own``: the fixed choice it is), against the other one alone, its own side's
    figures being the program's runs (:func:`_uniform_times`)."""
    from . import _hooks

    device_type: str = region.spec.backend.device_type
    grad = torch.is_grad_enabled()
    params = [p for p in root.parameters() if p.requires_grad] if grad else []
    inputs = Inputs(args, kwargs, root)  # one copy of the call's tensors for all candidates (each run puts them back)
    runs: dict[str, Callable[[], None]] = {
        name: _Run(root, args, kwargs, program.fixed(name), region, params, device_type, inputs)
        for name in _CANDIDATES
        if name != own and (name != "fp32" or fp32_exact(program))
    }
    loads, exposed = [_hooks.load_of(region)], exposure(clock)
    start = time.perf_counter()
    _prog.measuring = True
    try:
        with _fork_rng(device_type), kept_buffers(root), kept_cache(root, device_type), muted_hooks(params):
            budget_ms = min(PER_ROOT_MS, (_hooks.budget_s() - _hooks._process.spent_s) * 1e3)
            times = _rounds(clock, runs, budget_ms, _more(own, {}))
            left_ms = (_hooks.budget_s() - _hooks._process.spent_s - (time.perf_counter() - start)) * 1e3
            if left_ms > 0 and _doubtful(RootCheck.of(_uniform_times(times, own)), program.saving_ms):
                again = _rounds(clock, runs, min(PER_ROOT_MS, left_ms), _more(own, times))  # once more, rounds added
                times = {name: times[name] + again[name] for name in times}
        loads.append(_hooks.load_of(region))
    finally:
        _prog.measuring = False
        inputs.written.restore()  # the root's tensors its forward wrote, as they were
        with _hooks._process.lock:
            _hooks._process.spent_s += time.perf_counter() - start
    known = [load for load in loads if load is not None]
    shielded = exposed is not None and exposure(clock) == exposed  # no run other work could lengthen
    return RootCheck.of(_uniform_times(times, own), max(known) if known else None, shielded=shielded)


def _more(own: str | None, before: dict[str, list[float]]) -> Callable[[dict[str, list[float]]], bool]:
    """Whether rounds timed so far (``before`` and those given) leave the verdict within the
    noise though beyond the margin (:func:`~._checks.unsettled`: more rounds would say)."""

    def more(found: dict[str, list[float]]) -> bool:
        return unsettled(RootCheck.of(_uniform_times({k: before.get(k, []) + v for k, v in found.items()}, own)))

    return more


def _uniform_times(times: dict[str, list[float]], own: str | None) -> dict[str, list[float]]:
    """``times`` with a uniform program's own fixed choice (``own``) given the program's
    runs: it is that choice (the same dtypes everywhere), so its ratio to it is 1 round by
    round and :func:`~._checks.choose` compares the program with the other choice alone (a
    verdict of ``own`` or, on a tie, ``"low"``: torch.autocast's choice).

    Example::

        >>> _uniform_times({"plan": [2.0], "fp32": [1.0]}, "low")
        {'plan': [2.0], 'fp32': [1.0], 'low': [2.0]}
    """
    found = times if own is None else {**times, own: times["plan"]}
    # float32 no choice (:func:`fp32_exact`): the O1 lists stand in for it (a tie: never chosen)
    return found if "fp32" in found else {**found, "fp32": found["low"]}


def _doubtful(check: RootCheck, saving_ms: float) -> bool:
    """Whether a check must be timed again before it decides: its ratios spread over
    :data:`~._costs.SPREAD_BOUND`, or the program's win over the O1 lists is more than twice
    what its float32 modules save by their own figures (``saving_ms``), plus 3%: a burst of
    load on the ``low`` runs looks like that.  A program that loses is never doubted: that
    is what the check is for.

    Example::

        >>> check = RootCheck.of({"plan": [5.0] * 3, "low": [9.0] * 3, "fp32": [20.0] * 3})
        >>> _doubtful(check, saving_ms=1.0), _doubtful(check, saving_ms=3.0)
        (True, False)
    """
    win_ms = check.low_ms - check.plan_ms
    return check.spread > SPREAD_BOUND or (saving_ms > 0 and win_ms > 2 * saving_ms + MARGIN * check.low_ms)


def _rounds(
    clock: Clock,
    runs: dict[str, Callable[[], None]],
    budget_ms: float,
    more: Callable[[dict[str, list[float]]], bool] = lambda times: False,
) -> dict[str, list[float]]:
    """Warm each candidate (in the first of :func:`~._orders.orders`), then time them in the
    rounds that continue that cycle (see the module; two candidates, a uniform program's
    check: in alternation): :data:`MAX_RUNS`
    rounds, another block of as many (up to :data:`MAX_ROUNDS`, within ``budget_ms``) while
    ``more(times)`` says the verdict is still within the noise though beyond the margin.
    The tries a host clock timed again count against ``budget_ms`` (:func:`~._hostclock.lost`)."""
    lost_before = lost(clock)
    spent = sum(clock(_ready(run), _LABELS[name]) for name, run in runs.items())  # warm-up: not timed
    times: dict[str, list[float]] = {name: [] for name in runs}
    rows = orders(tuple(runs))
    for order in itertools.islice(itertools.cycle(rows[1:] + rows[:1]), MAX_ROUNDS):
        for name in order:
            times[name].append(clock(_ready(runs[name]), _LABELS[name]))
        last = sum(found[-1] for found in times.values())
        spent += last + lost(clock) - lost_before
        lost_before = lost(clock)
        done = len(times["plan"])
        if done >= MIN_RUNS and spent + last > budget_ms:
            break
        if done % MAX_RUNS == 0 and not more(times):  # looks after 7, 14 rounds (few looks)
            break
    return times


class _Run:
    """One call of ``root`` under ``program`` (forward, then backward outside autocast as in
    training; gradients through :func:`torch.autograd.grad`, the parameters' ``.grad``
    untouched), on copies of the call's arguments made by :meth:`prepare` before it is
    timed (a forward may consume a list or grow a cache: the real call follows)."""

    def __init__(
        self,
        root: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        program: Program,
        region: Any,
        params: Sequence[torch.Tensor],
        device_type: str,
        inputs: Inputs,
    ) -> None:
        self.root, self.args, self.kwargs, self.program, self.region = root, args, kwargs, program, region
        self.params, self.device_type = params, device_type
        self.next: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self.inputs = inputs  # (a forward that changes them in place: put back after each run)

    def prepare(self) -> None:
        self.next = (_fresh(self.args), _fresh(self.kwargs))

    def __call__(self) -> None:
        if self.next is None:
            self.prepare()
        args, kwargs = self.next or ((), {})
        self.next = None
        if torch.is_autocast_cache_enabled():  # (off where the region's cache is kept: _castcache)
            torch.clear_autocast_cache()  # a step's region starts without cast weights
        running = _prog.run = Running(self.program, self.root, self.region)
        try:
            try:
                with self.inputs.written.watching(self):  # (each candidate's first run: copy-on-write)
                    out = self.root.forward(*args, **kwargs)
            finally:
                _prog.run = None
                running.stop()
            outs = [t for t in _tensors(out) if t.requires_grad]
            if outs and self.params:
                with torch.autocast(self.device_type, enabled=False):
                    ones = [torch.ones_like(t) for t in outs]  # (graph kept: as _measure's, for a weight made before)
                    torch.autograd.grad(outs, self.params, ones, allow_unused=True, retain_graph=True)
        finally:  # after the backward: an input changed in place may be saved for it (a layer's input)
            self.inputs.put_back()


def _ready(run: Callable[[], None]) -> Callable[[], None]:
    """``run`` with the copies of its arguments made (outside the timed call)."""
    prepare = getattr(run, "prepare", None)
    if prepare is not None:
        prepare()
    return run


def _fresh(value: Any, held: bool = False) -> Any:
    """``value`` with its lists, dicts and plain tuples copied (tensors and the rest shared)
    and the objects the guard reads (:func:`~._guard.signature`: a KV cache) copied with
    their state, the tensors they hold cloned (a forward may write into a static cache)."""
    if isinstance(value, torch.Tensor):
        return value.clone() if held else value
    if isinstance(value, list):
        return [_fresh(v, held) for v in value]
    if type(value) is tuple:
        return tuple(_fresh(v, held) for v in value)
    if type(value) is dict:
        return {k: _fresh(v, held) for k, v in value.items()}
    state = None if callable(value) else getattr(value, "__dict__", None)
    if type(state) is dict and not isinstance(value, (type, nn.Module)):
        twin = copy.copy(value)  # a new object of its type, with a dict of its own
        if twin is value or getattr(twin, "__dict__", None) is state:
            return value  # a __copy__ that shares its state: nothing to copy it with
        vars(twin).update({k: _fresh(v, True) for k, v in state.items()})
        return twin
    return value


def _tensors(value: Any) -> list[torch.Tensor]:
    """The floating tensors of an output (through tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []
