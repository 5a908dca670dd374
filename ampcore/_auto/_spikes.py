"""Rounds hit by other work: which paired rounds of a measurement decide.

On a busy machine other work takes the device (a core) from a timed run now and then: the
run takes longer by a *spike* (a scheduler's time slice, 4-6 ms on a Linux CPU at load 4-8
on 2 cores) that says nothing about the candidate, while its side's other runs stay close
together.  In paired rounds a spike on one side moves that round's ratio by the spike, so
a few spikes widen the spread of the ratios until every difference is a tie, and a tie goes
to torch.autocast's choice, whichever side is faster (issue 27, eleventh stop).

A run is *hit* when it is over its side's fastest run by more than :data:`SPIKE` (other
work only ever adds time, so the fastest run is the side's best guess of its quiet time);
:func:`clean` leaves out every round with a hit run on any side, so each kept ratio compares
two unhit runs.  A side whose slow runs are more than :data:`MOST_HIT` of its runs has no
spikes (it varies by itself, or other work held the device through the whole measurement):
its slow rounds are kept, and the spread says how noisy it was.  A side is thereby judged
by its fast runs only where its slow runs are a small minority, which its median ignores
too; the rounds the other sides' spikes leave out take runs of all speeds alike.  Fewer
than :data:`MIN_KEPT` clean rounds: every round is kept.

:func:`ambiguous` says when more rounds pay: the side a tie does not go to looks better by
more than the margin, yet by less than the noise (more rounds narrow the noise, within the
same budget; a true tie stays a tie).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

__all__ = ["MIN_KEPT", "MOST_HIT", "SPIKE", "ambiguous", "clean", "kept"]

#: a run over its side's fastest run by more than this share is hit by other work (quiet
#: CPUs spread 0.03-0.07; a time slice on a run of a few milliseconds: 0.5 and more)
SPIKE: Final = 0.25
#: the largest share of a side's runs that may be hit (more: they are the side's own)
MOST_HIT: Final = 1 / 3
#: the fewest rounds left where some are left out (fewer: every round is kept)
MIN_KEPT: Final = 3


def clean(times: Mapping[str, Sequence[float]]) -> list[int]:
    """The indices of the rounds of ``times`` (one run per side and round) that decide:
    those where no side's run is hit, a side's slow runs counting as hits only where they
    are at most :data:`MOST_HIT` of its runs; every round where fewer than
    :data:`MIN_KEPT` would be left.

    Example::

        >>> clean({"fp32": [10.0, 10.1, 16.0, 10.0, 9.9, 10.0], "low": [8.0, 8.1, 8.0, 8.0, 8.1, 13.0]})
        [0, 1, 3, 4]
        >>> clean({"fp32": [10.0, 14.0, 10.0, 14.0], "low": [8.0, 8.0, 8.0, 8.0]})  # half slow: no spikes
        [0, 1, 2, 3]
    """
    rounds = min((len(runs) for runs in times.values()), default=0)
    hit: set[int] = set()
    for runs in times.values():
        fastest = min(runs[:rounds], default=0.0)
        slow = {i for i in range(rounds) if runs[i] > fastest * (1.0 + SPIKE)}
        if len(slow) <= MOST_HIT * rounds:
            hit |= slow
    if rounds - len(hit) < MIN_KEPT:
        return list(range(rounds))
    return [i for i in range(rounds) if i not in hit]


def kept(times: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """``times`` with only the rounds :func:`clean` keeps.

    Example::

        >>> kept({"a": [1.0, 1.0, 1.0, 9.0], "b": [2.0, 2.0, 2.0, 2.0]})
        {'a': [1.0, 1.0, 1.0], 'b': [2.0, 2.0, 2.0]}
    """
    rounds = clean(times)
    return {name: [runs[i] for i in rounds] for name, runs in times.items()}


def ambiguous(gain: float, noise: float, margin: float) -> bool:
    """Whether a comparison needs more rounds: the side a tie does not go to looks better by
    ``gain`` (relative: ``low / fp32 - 1`` for float32 against the O1 lists, ``1 - plan /
    fixed`` for a program), more than ``margin`` (no true tie) but not more than ``noise``
    (not decided yet).

    Example::

        >>> ambiguous(0.10, 0.15, 0.03), ambiguous(0.01, 0.15, 0.03), ambiguous(0.20, 0.15, 0.03)
        (True, False, False)
        >>> ambiguous(-0.10, 0.15, 0.03)  # the side a tie goes to is better: decided
        False
    """
    return margin < gain <= noise
