"""The lock around ampcore's work that holds torch's registry mutexes, taken around ``fork()``.

Registering kernels, looking operators up and reading ATen's schemas hold mutexes inside
torch (the dispatcher's, the JIT operator registry's).  A process forked while another
thread holds one inherits it locked, and the child hangs at its next lookup.  ampcore does
all such one-time work under :data:`LOCK`, and ``os.register_at_fork`` takes the lock
around every ``fork()``, so a child is never forked in the middle of it (a fork waits for
the work to finish: ~0.1 s at most, once per process).
"""

from __future__ import annotations

import os
import threading
from typing import Final

__all__ = ["LOCK"]

#: Re-entrant: registration reads the op tables it may be the first to build.
LOCK: Final = threading.RLock()

if hasattr(os, "register_at_fork"):  # the forking thread owns it, in the child too
    os.register_at_fork(before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=LOCK.release)
