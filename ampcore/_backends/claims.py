"""Which plugin a backend name resolves to when several plugins claim it (pure).

The precedence, documented in docs/plugins.md ("Two plugins, one backend name"):

1. one claim: it wins;
2. a plugin from another distribution (or registered in process) claiming the name of a
   first-party adapter (distribution ``ampcore``) *replaces* it: the first-party plugin
   stays loaded but unused (status ``replaced``) and comes back if the replacement is
   unregistered;
3. two or more plugins that are not first-party claiming one name are a *conflict*: the
   name resolves to nothing until the user blocks all but one (``AMPCORE_BLOCK_PLUGINS``
   takes entry-point names, distribution names and ``distribution:entry-point``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Generic, Literal, Protocol, TypeVar

from .backend import origin

__all__ = [
    "FIRST_PARTY",
    "Resolution",
    "block_name",
    "claim_status",
    "conflict_message",
    "replacement_message",
    "resolve_claims",
]

#: The distribution whose adapters a vendor's plugin of the same backend name replaces.
FIRST_PARTY: Final = "ampcore"


class _Claim(Protocol):
    @property
    def distribution(self) -> str | None: ...

    @property
    def plugin_name(self) -> str: ...


ClaimT = TypeVar("ClaimT", bound=_Claim)


@dataclass(frozen=True)
class Resolution(Generic[ClaimT]):
    """How one backend name resolves: the ``winner`` (``None`` in a conflict), the
    first-party claims it ``replaced`` and the claims in ``conflict``."""

    winner: ClaimT | None
    replaced: tuple[ClaimT, ...] = ()
    conflict: tuple[ClaimT, ...] = ()


def resolve_claims(claims: Sequence[ClaimT]) -> Resolution[ClaimT]:
    """Apply the precedence of the module docstring to the plugins claiming one name.

    Example::

        >>> from types import SimpleNamespace as Claim
        >>> ours = Claim(plugin_name="ampcore:npu", distribution="ampcore")
        >>> vendor = Claim(plugin_name="ampcore-npu:npu", distribution="ampcore-npu")
        >>> r = resolve_claims([ours, vendor])
        >>> r.winner is vendor, r.replaced == (ours,), r.conflict
        (True, True, ())
        >>> resolve_claims([vendor, Claim(plugin_name="x", distribution="other")]).winner is None
        True
    """
    if len(claims) == 1:
        return Resolution(claims[0])
    first_party = tuple(c for c in claims if c.distribution == FIRST_PARTY)
    others = tuple(c for c in claims if c.distribution != FIRST_PARTY)
    if len(others) == 1:
        return Resolution(others[0], replaced=first_party)
    if not others:  # two first-party adapters of one name: nothing to prefer
        return Resolution(None, conflict=first_party)
    return Resolution(None, replaced=first_party, conflict=others)


def block_name(plugin_name: str, distribution: str | None) -> str:
    """What to put in ``AMPCORE_BLOCK_PLUGINS`` to block exactly one plugin.

    Example::

        >>> block_name("npu", "ampcore-npu"), block_name("ampcore:npu", "ampcore"), block_name("demo", None)
        ('ampcore-npu:npu', 'ampcore:npu', 'demo')
    """
    return plugin_name if distribution is None else f"{distribution}:{plugin_name.rsplit(':', 1)[-1]}"


def claim_status(
    name: str, claim: ClaimT, resolution: Resolution[ClaimT]
) -> tuple[Literal["loaded", "conflict", "replaced"], str | None]:
    """The ``(status, error)`` a plugin claiming backend ``name`` shows in ``ampcore info``."""
    if claim in resolution.conflict:
        others = ", ".join(f'"{c.plugin_name}"' for c in resolution.conflict if c is not claim)
        return "conflict", f'plugin(s) {others} also claim backend "{name}"'
    if claim in resolution.replaced:
        winner = resolution.winner
        by = (
            f'plugin "{winner.plugin_name}" ({origin(winner.distribution)})'
            if winner is not None
            else "plugins " + ", ".join(f'"{c.plugin_name}"' for c in resolution.conflict)
        )
        return "replaced", f'backend "{name}" is provided by {by}'
    return "loaded", None


def replacement_message(name: str, winner: _Claim, replaced: _Claim, env_block: str) -> str:
    """The one message saying that ``winner`` replaces the first-party ``replaced``."""
    return (
        f'backend "{name}": plugin "{winner.plugin_name}" ({origin(winner.distribution)}) replaces the '
        f'first-party adapter "{replaced.plugin_name}" ({origin(replaced.distribution)}); to use ampcore\'s own, '
        f"set {env_block}={block_name(winner.plugin_name, winner.distribution)}"
    )


def conflict_message(name: str, conflict: Sequence[_Claim], env_block: str) -> str:
    """Why backend ``name`` resolves to nothing, naming every distribution and how to keep one."""
    who = ", ".join(f'plugin "{b.plugin_name}" ({origin(b.distribution)})' for b in conflict)
    keep, rest = conflict[0], conflict[1:]
    others = ",".join(block_name(b.plugin_name, b.distribution) for b in rest)
    return (
        f'backend "{name}" is claimed by more than one plugin: {who}. Choose one: uninstall the others, or '
        f'block them with {env_block} (to keep plugin "{keep.plugin_name}": {env_block}={others}; an entry-point '
        'name, a distribution name (all of its plugins) or "distribution:entry-point" (exactly one))'
    )
