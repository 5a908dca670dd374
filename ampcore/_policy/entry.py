"""Entering an ``ampcore.autocast`` region the long way, and the plan that makes the next
entry short (issue 26 item 3).

The first entries of a region go through :func:`enter`: merge the enclosing region's custom
lists, take the route of the policy's device type and register the kernels it needs,
install the checkpoint hooks, enter torch's autocast state through a ``torch.autocast``
object until torch accepted the flags, check that autocast came on.  None of that depends
on the enclosing state beyond the enclosing region's custom lists, and all of it only ever
grows (routes, kernels, tables and torch's acceptance are kept for the process).  So once an
entry set torch's flags directly (:class:`~ampcore._policy.torch_state.DirectAutocast`, or
the compiled executor's one call: :class:`~ampcore._policy.torch_state.CompiledRegion`),
what it did is kept as an :class:`EntryPlan` in the region's :class:`Plans`, per enclosing
custom lists; ``autocast.__enter__`` carries out a plan inline.  What a plan cannot know is
checked on every entry: the thread's stack and the asyncio task, a torch-function mode
(``torch.export``), torch.compile in use (graphs per policy), the policy in force before.

A region's :class:`Plans` is shared by the regions made with the same arguments (the
construction memo of :mod:`ampcore._policy.signature` copies it).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import torch

from .._backends.backend import Backend
from .._backends.registry import on_backend_available
from .._errors import AmpcoreError
from .._forklock import LOCK
from .compile import compile_in_use, guard_mode
from .executor import executor_chosen
from .lists import compute_oplists, merge_custom
from .recompute import install as install_recompute
from .registration import OpPolicy, has_native_autocast, policy_for, region_entry, route
from .thread_state import ActiveRegion, RegionSpec, ThreadState, current_region
from .torch_state import CompiledRegion, DirectAutocast, accepted, compiled_call, enter_region_state, restore, switch_on

if TYPE_CHECKING:
    import contextvars

    from .autocast import autocast

__all__ = ["EntryPlan", "Plans", "abandon", "enter", "not_innermost", "other_context", "provider"]

_EMPTY: frozenset[str] = frozenset()
#: Plans kept per region for distinct enclosing custom lists (then forgotten, and made again).
_MAX_NESTED: Final = 64


class EntryPlan(NamedTuple):
    """How a region enters when nothing it depends on changed: see the module docstring."""

    spec: RegionSpec  # the region's spec, the enclosing custom lists merged
    enter: Callable[[int], int] | None  # the extension's enter, or None: DirectAutocast
    entry: int  # the extension's id of this region's entry
    leave: Callable[[int, int], None] | None  # the extension's leave
    shadow: str | None  # the shadow key to switch on (the Python kernels)
    slotless: bool  # an entry that leaves the compiled kernels' tables alone: only where no policy is in force


class Plans:
    """A region's entry plans: ``alone`` where no enclosing region of its device type has
    custom lists, ``nested`` per (white, black) custom lists of the enclosing region."""

    __slots__ = ("__weakref__", "alone", "nested")

    def __init__(self) -> None:
        self.alone: EntryPlan | None = None
        self.nested: dict[tuple[frozenset[str], frozenset[str]], EntryPlan] = {}

    def forget(self) -> None:
        """Drop the plans (the next entry goes the long way and makes them again)."""
        self.alone = None
        self.nested = {}


#: Plans of regions without a policy made before the executor was chosen: they set torch's
#: flags from Python; once the compiled executor is loaded, their next entry plans again
#: (one call of the extension each way).
_BEFORE_EXECUTOR: weakref.WeakSet[Plans] = weakref.WeakSet()


def _replan_after_choice() -> None:
    """Forget the plans made before the executor was chosen, once it is."""
    if _BEFORE_EXECUTOR and executor_chosen():
        with LOCK:  # fork-safe; the long way only (a set iterated while another thread adds)
            for plans in list(_BEFORE_EXECUTOR):
                plans.forget()
            _BEFORE_EXECUTOR.clear()


def not_innermost(region: object) -> AmpcoreError:
    return AmpcoreError(
        f"{region!r}.__exit__: this region is not the innermost active region of this thread "
        "(exited twice, exited in another thread or asyncio task, or an inner region was "
        "never exited); nothing was changed"
    )


def other_context(region: object, entering: bool) -> AmpcoreError:
    if entering:
        return AmpcoreError(
            f"{region!r}: another ampcore.autocast region of this thread is active in a different "
            "asyncio task or context. Regions are thread-local, like torch.autocast's flags: "
            "enter them inside one task (or use one thread per concurrent region)."
        )
    return AmpcoreError(
        f"{region!r}.__exit__: the region was entered in another asyncio task or context; exit it where it was entered"
    )


def _spec_within(region: autocast, outer: RegionSpec | None) -> RegionSpec:
    """``region``'s spec with the custom lists of the enclosing region ``outer`` merged."""
    spec: RegionSpec = region._spec
    if outer is None or not (outer.custom_white or outer.custom_black):
        return spec
    white, black = merge_custom((outer.custom_white, outer.custom_black), spec.custom_white, spec.custom_black)
    return spec._replace(custom_white=white, custom_black=black, policy=region._policy_of(white, black))


def enter(region: autocast, state: ThreadState, innermost: contextvars.ContextVar[ActiveRegion | None]) -> autocast:
    """Enter ``region`` the long way (its first entries, and where no plan applies)."""
    stack = state.stack
    if stack and innermost.get() is not stack[-1]:
        raise other_context(region, entering=True)
    device_type = region.device_type
    outer = current_region(device_type) if stack else None
    spec = _spec_within(region, outer)
    policy = spec.policy
    found = None
    if policy is not None:
        found = route(device_type, provider(region.backend), policy)
    if region.enabled:
        install_recompute()  # activation checkpointing keeps the policy and casts (once per process)
    # Every change below is undone if a later step fails or is interrupted.
    previous = state.policies.get(device_type)
    torch_region = enter_region_state(device_type, region.dtype, region.enabled, region.cache_enabled, policy, found)
    direct = type(torch_region) in (CompiledRegion, DirectAutocast)  # torch accepted these flags
    mode = shadow = None
    try:
        if not direct:
            _check_enabled(region, device_type)
            accepted(device_type, region.dtype, region.enabled)  # later entries set its flags directly
        if found is not None and not found.resident and type(torch_region) is not CompiledRegion:
            shadow = switch_on(found.key)
        if policy is not None and compile_in_use():
            mode = guard_mode(policy)  # graphs per policy
            mode.__enter__()
        if type(torch_region) is CompiledRegion:
            state.policies[device_type] = policy  # the compiled kernels' table is set already
        elif policy is not None or previous is not None:
            state.set_policy(device_type, policy)
        entered = ActiveRegion(region, spec, torch_region, previous, mode, shadow, innermost.get())
        stack.append(entered)
        innermost.set(entered)
        if direct:
            _keep_plan(region, outer, spec, found, torch_region)
        if policy is not None:
            _replan_after_choice()
        if region._level_hooks is not None:  # level auto: its plan's module hooks, while it is active
            region._level_hooks.region_entered()
    except BaseException:
        abandon(state, innermost, device_type, policy, previous, mode, shadow, torch_region)
        raise
    return region


def _check_enabled(region: autocast, device_type: str) -> None:
    if region.enabled and not (
        torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == region.dtype
    ):
        raise AmpcoreError(
            f"{region!r}: torch did not enable autocast for device type {device_type!r} with "
            f"{region.dtype}; refusing to run in float32 silently. Check the {region.backend.name!r} "
            f"adapter ({region.backend.distribution}) and `ampcore info`."
        )


def abandon(
    state: ThreadState,
    innermost: contextvars.ContextVar[ActiveRegion | None],
    device_type: str,
    policy: OpPolicy | None,
    previous: OpPolicy | None,
    mode: Any,
    shadow: tuple[torch._C.DispatchKey, bool, bool] | None,
    torch_region: Any,
) -> None:
    """Undo a region's entry that failed or was interrupted after torch's state was entered."""
    stack = state.stack
    if stack and stack[-1].torch_region is torch_region:
        innermost.set(stack.pop().context_outer)
    restore(state, device_type, policy, previous, mode, shadow, torch_region, None)


def _keep_plan(region: autocast, outer: RegionSpec | None, spec: RegionSpec, found: Any, torch_region: Any) -> None:
    """Keep how ``region`` entered (torch's flags set directly) for its next entries."""
    policy = spec.policy
    entry = None  # without a policy: the extension's one call where it is loaded already
    if type(torch_region) is CompiledRegion or policy is None:
        entry = region_entry(region.device_type, policy, region.dtype)
    call = None if entry is None else compiled_call(entry, region.enabled, region.cache_enabled)
    if call is not None:
        plan = EntryPlan(spec, call[0], call[1], call[2], None, entry[1][2] < 0)  # type: ignore[index]
    elif type(torch_region) is CompiledRegion:
        return
    else:
        plan = EntryPlan(spec, None, -1, None, None if found is None or found.resident else found.key, False)
    plans: Plans = region._plans
    if policy is None and call is None and not executor_chosen():
        with LOCK:
            _BEFORE_EXECUTOR.add(plans)
    if spec is region._spec:
        plans.alone = plan
    elif outer is not None:
        if len(plans.nested) >= _MAX_NESTED:
            plans.nested.clear()
        plans.nested[(outer.custom_white, outer.custom_black)] = plan


@functools.cache
def provider(backend: Backend) -> Callable[[torch.dtype], OpPolicy | None]:
    """The policies of ``backend``'s O1 lists per dtype, for kernels that provide autocast."""
    by_dtype: dict[torch.dtype, OpPolicy | None] = {}

    def provide(dtype: torch.dtype) -> OpPolicy | None:
        try:
            return by_dtype[dtype]
        except KeyError:
            pass
        try:
            policy = policy_for(compute_oplists(backend, dtype, "O1", _EMPTY, _EMPTY), cache=False)
        except AmpcoreError:
            policy = None  # a dtype the backend has no lists for: the op runs as called
        by_dtype[dtype] = policy
        return policy

    return provide


def _provide_autocast(backend: Backend) -> None:
    """Once ampcore knows an available backend whose device type has no autocast kernels
    of its own, ampcore's kernels provide its autocast from then on (for plain
    ``torch.autocast`` too), so results never depend on whether an ampcore region ran."""
    if not has_native_autocast(backend.device_type):
        route(backend.device_type, provider(backend))


on_backend_available(_provide_autocast)
