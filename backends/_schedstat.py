"""The run delay of this process's threads (Linux): how long they were runnable but waited
for a core, for ``level="auto"`` to tell a timed run that other work pre-empted (the CPU
adapter's ``ampcore_auto_waited``, docs/auto.md).

Each thread's ``/proc/self/task/<tid>/schedstat`` holds three numbers: nanoseconds on a
core, nanoseconds *runnable but waiting for a core* (the run delay), time slices.  The
kernel adds a wait to the run delay when the thread gets its core back, so a run that
waited for one of its threads has the wait counted by the time it ends.  Reading all of a
process's threads costs a few microseconds: the files are opened once per thread and read
again with ``pread`` (the directory is listed at each read: torch's workers come and go).

Where the files are missing or unreadable (not Linux, a kernel without
``CONFIG_SCHED_INFO``, a container that hides them) :func:`run_delay_reader` gives None
and ``level="auto"`` times each run once, as before (docs/auto.md says so).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

__all__ = ["RunDelay", "run_delay_reader"]

TASKS = "/proc/self/task"


class RunDelay:
    """``reader() -> seconds``: the run delay summed over the threads of this process that
    are alive now (a thread that ended takes its share with it: the sum may fall; the core
    only compares readings around one run, and a fall reads as no wait).

    Example::

        >>> reader = run_delay_reader()
        >>> reader is None or reader() >= 0.0
        True
    """

    def __init__(self, tasks: str = TASKS) -> None:
        self._tasks = tasks
        self._files: dict[str, int] = {}  # tid -> open file
        self._lock = threading.Lock()  # two threads measuring share one reader

    def __call__(self) -> float:
        with self._lock:
            tids = os.listdir(self._tasks)
            total = 0
            for tid in tids:
                total += self._delay(tid)
            for gone in self._files.keys() - set(tids):
                os.close(self._files.pop(gone))
        return total / 1e9

    def _delay(self, tid: str) -> int:
        """One thread's run delay in nanoseconds (0 where it ended meanwhile)."""
        for _ in range(2):  # an open file of a thread whose id was used again: opened again
            fd = self._files.get(tid)
            try:
                if fd is None:
                    fd = self._files[tid] = os.open(f"{self._tasks}/{tid}/schedstat", os.O_RDONLY)
                return int(os.pread(fd, 128, 0).split()[1])
            except (OSError, ValueError, IndexError):
                if fd is not None:
                    os.close(self._files.pop(tid))
        return 0


_reader: RunDelay | None = None
_checked: bool = False


def run_delay_reader(tasks: str = TASKS) -> Callable[[], float] | None:
    """The process's :class:`RunDelay` reader, or None where this machine gives no run delay
    (checked once: the calling thread's file must read as three numbers)."""
    global _reader, _checked
    if tasks != TASKS:
        return RunDelay(tasks) if _readable(tasks) else None
    if not _checked:
        _reader, _checked = (RunDelay() if _readable(tasks) else None), True
    return _reader


def _readable(tasks: str) -> bool:
    try:
        with open(f"{tasks}/{threading.get_native_id()}/schedstat", "rb") as stat:
            fields = stat.read().split()
        return len(fields) >= 2 and all(f.isdigit() for f in fields)
    except (OSError, AttributeError):
        return False
