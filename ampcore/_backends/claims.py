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
from typing import Final, Generic, Protocol, TypeVar

__all__ = ["FIRST_PARTY", "Resolution", "block_name", "resolve_claims"]

#: The distribution whose adapters a vendor's plugin of the same backend name replaces.
FIRST_PARTY: Final = "ampcore"


class _Claim(Protocol):
    @property
    def distribution(self) -> str | None: ...


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
        >>> ours, vendor = Claim(distribution="ampcore"), Claim(distribution="ampcore-npu")
        >>> r = resolve_claims([ours, vendor])
        >>> r.winner is vendor, r.replaced == (ours,), r.conflict
        (True, True, ())
        >>> resolve_claims([vendor, Claim(distribution="other")]).winner is None
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
