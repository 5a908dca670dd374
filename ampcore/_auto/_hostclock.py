"""The host's clock for ``level="auto"``: a timed run on a device without timing events,
between the adapter's synchronisations, by the adapter's timer (``ampcore_auto_timer``) or
the wall clock, with runs *pre-empted* by other work timed again where the adapter can
tell (``ampcore_auto_waited``).

A run's wall clock on a busy machine holds the time slices other processes take from the
run's threads (issue 27).  The adapter's timer can leave them out where one thread does
all of a run's work (the CPU adapter: that thread's CPU time); where several threads share
it (torch's intra-op threads), no thread's clock is the run's, and the process's CPU time
counts the spinning of idle workers.  Its waiting can be read instead: the adapter's
``ampcore_auto_waited`` gives a function returning the seconds this process's threads have
so far been ready to run while other work held the device's units (on Linux the threads'
run delay).  A run while which that count grew by more than :data:`WAIT_SHARE` of the
run's time (and more than :data:`WAIT_FLOOR_S`: waking a thread takes a few microseconds on
a quiet machine) was pre-empted, and is timed again, up to :data:`TRIES` times; where every
try was pre-empted the fastest try counts (other work only ever adds time) and the spike
rule (:mod:`._spikes`) judges it with the other rounds.  The count is read outside the
timed interval (a read of ``/proc`` costs microseconds) and nothing here synchronises more
than the clock did before (device clocks with events never use it).

The time of the tries left out is what the clock *lost* (:attr:`HostClock.lost_ms`): the
rounds count it against a measurement's share (:func:`lost`; a class's once its first
three rounds are timed), so a busy machine stretches a measurement past its share by the
retries of those rounds at most.

The clock also counts the runs it counted that other work could have lengthened
(:attr:`HostClock.exposed`, :func:`exposure`: on the wall clock with no count of waits, or
pre-empted at every try); a class measured while that count stayed put was shielded from
the load, and a busy device alone does not make it provisional (:mod:`._heal`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

__all__ = ["TRIES", "WAIT_FLOOR_S", "WAIT_SHARE", "HostClock", "exposure", "lost", "preempted", "shields"]

#: tries of a run at most where each was pre-empted
TRIES: Final = 4
#: a run whose threads waited for the device more than this share of its time was pre-empted
WAIT_SHARE: Final = 0.05
#: ... and more than this (seconds): a thread's wake-up on a quiet machine waits a few us
WAIT_FLOOR_S: Final = 50e-6

Timer = Callable[[], float]


class HostClock:
    """Times ``run`` between two calls of ``sync``: ``clock(run, label) -> milliseconds``.

    ``timer()`` and ``waited()`` are asked at each run (the answers may depend on the
    thread count): the timer to time with (None: the wall clock) and the function that
    reads the seconds waited so far (None: runs are not timed again); ``read(reader)`` reads
    it (the core's raises where a reading is no count of seconds: the adapter broke the
    contract).

    Example::

        >>> ticks = iter([0.0, 0.010, 1.0, 1.004])  # a pre-empted try, then a clean one
        >>> waits = iter([0.0, 0.006, 0.006, 0.006])
        >>> clock = HostClock(lambda: None, lambda: lambda: next(ticks), lambda: lambda: next(waits))
        >>> round(clock(lambda: None, "fp32"), 6), round(clock.lost_ms, 6)
        (4.0, 10.0)
    """

    def __init__(
        self,
        sync: Callable[[], None],
        timer: Callable[[], Timer | None] = lambda: None,
        waited: Callable[[], Timer | None] = lambda: None,
        read: Callable[[Timer], float] = lambda reader: float(reader()),
    ) -> None:
        self._sync = sync
        self._timer = timer
        self._waited = waited
        self._read = read
        #: milliseconds of the tries timed again (pre-empted) since this clock was made
        self.lost_ms = 0.0
        #: runs counted that other work may have lengthened (:func:`exposure`): timed on the
        #: wall clock with no count of waits, or pre-empted at every try
        self.exposed = 0

    def shields(self) -> bool:
        """Whether runs timed now leave other work's time out whatever the load: the
        adapter's timer (the CPU adapter's, one thread: its CPU time) times them."""
        return self._timer() is not None

    def __call__(self, run: Callable[[], None], label: str) -> float:
        now = self._timer() or time.perf_counter
        reader = self._waited()
        if reader is None:
            if now is time.perf_counter:  # the wall clock, with no count of waits
                self.exposed += 1
            self._sync()
            start = now()
            run()
            self._sync()
            return (now() - start) * 1e3
        tries: list[float] = []
        for _ in range(TRIES):
            self._sync()
            before = self._read(reader)  # read outside the timed interval
            start = now()
            run()
            self._sync()
            took = now() - start
            grew = self._read(reader) - before
            tries.append(took * 1e3)
            if not preempted(grew, took):
                counted = tries[-1]
                break
        else:
            counted = min(tries)  # every try pre-empted: the fastest (other work only adds time)
            self.exposed += 1
        self.lost_ms += math.fsum(tries) - counted
        return counted


def preempted(waited_s: float, took_s: float) -> bool:
    """Whether a run of ``took_s`` seconds while which the process's threads waited
    ``waited_s`` seconds for the device was pre-empted by other work.

    Example::

        >>> preempted(0.004, 0.010), preempted(0.0001, 0.010), preempted(0.00004, 0.0002)
        (True, False, False)
    """
    return waited_s > max(WAIT_SHARE * took_s, WAIT_FLOOR_S)


def shields(clock: object) -> bool:
    """Whether ``clock`` times runs now without other work's time (:meth:`HostClock.shields`;
    False for clocks that cannot tell)."""
    found = getattr(clock, "shields", None)
    return bool(found()) if callable(found) else False


def exposure(clock: object) -> int | None:
    """The runs ``clock`` has counted so far that other work may have lengthened
    (:attr:`HostClock.exposed`; None for clocks that cannot tell: event clocks, the tests'
    fake clocks).  A measurement during which it did not grow was shielded from the load.

    Example::

        >>> ticks = iter([0.0, 0.004])
        >>> clock = HostClock(lambda: None, lambda: lambda: next(ticks))  # a thread's CPU time
        >>> _ = clock(lambda: None, "fp32")
        >>> exposure(clock), clock.shields(), exposure(lambda run, label: 1.0)
        (0, True, None)
    """
    value = getattr(clock, "exposed", None)
    return value if isinstance(value, int) else None


def lost(clock: object) -> float:
    """The milliseconds ``clock`` has lost to tries timed again (0 for clocks that never
    time a run again, such as the tests' fake clocks)."""
    value = getattr(clock, "lost_ms", 0.0)
    return float(value) if isinstance(value, (int, float)) else 0.0
