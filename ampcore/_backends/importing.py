"""Importing a plugin's module, and asking its availability probe, with a bounded wait
(``AMPCORE_PLUGIN_IMPORT_TIMEOUT``).

A plugin whose import or ``ampcore_unavailable_reason()`` never returns (a vendor runtime
waiting for a device that never answers) must not hang every program that uses ampcore.
Both run in a daemon thread and ampcore waits at most the timeout for them; then the plugin
is reported as failed (its backend unavailable), naming the time waited, and every other
plugin still loads.  The other hooks are not bounded: they run after the probe said the
device answers, several of them once per optimizer step.

What is and is not safe (documented in docs/plugins.md):

* Python's import lock is per module: the hung import blocks only imports of the modules it
  is importing at that moment (its own and any it is stuck inside); every other import,
  ampcore's and the user's, goes on.  A later import of the hung module in another thread
  waits for it.
* The thread cannot be stopped: it runs on in the background (a daemon thread, so it never
  keeps the process alive at exit).  Should the import finish later, ampcore ignores its
  result; the plugin stays failed for the life of the process.
* A plugin that must import in the main thread (one that installs signal handlers at
  import) cannot be loaded this way: set the variable to ``off`` to import in the calling
  thread, without a bound.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

from .._errors import PluginWarning, warn_at

__all__ = ["DEFAULT_IMPORT_TIMEOUT_S", "ENV_IMPORT_TIMEOUT", "ImportTimeout", "call_bounded", "import_timeout"]

ENV_IMPORT_TIMEOUT: Final = "AMPCORE_PLUGIN_IMPORT_TIMEOUT"
#: Seconds ampcore waits for one plugin's import (vendor extensions belong in the lazy
#: availability hook, so an adapter module itself imports in well under a second).
DEFAULT_IMPORT_TIMEOUT_S: Final = 30.0
_OFF: Final = frozenset({"off", "none"})

T = TypeVar("T")


class ImportTimeout(Exception):
    """The import or the probe did not finish within the bound (its message says how long
    ampcore waited)."""


def import_timeout(environ: Mapping[str, str]) -> float | None:
    """The bound in seconds from ``AMPCORE_PLUGIN_IMPORT_TIMEOUT`` (``None``: ``off``, no
    bound).  A value that is not a positive finite number of seconds (``abc``, ``30s``,
    ``nan``, ``-1``, ``0``) warns, naming the variable and the value, and the default is used.

    Example::

        >>> import_timeout({}), import_timeout({"AMPCORE_PLUGIN_IMPORT_TIMEOUT": "2.5"})
        (30.0, 2.5)
        >>> import_timeout({"AMPCORE_PLUGIN_IMPORT_TIMEOUT": "off"}) is None
        True
    """
    raw = environ.get(ENV_IMPORT_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_IMPORT_TIMEOUT_S
    if raw.lower() in _OFF:
        return None
    try:
        value = float(raw) if raw.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        warn_at(
            f"{ENV_IMPORT_TIMEOUT}={raw!r}: expected a positive number of seconds such as 30, or 'off' for "
            f"no bound; using the default of {DEFAULT_IMPORT_TIMEOUT_S:g} s",
            PluginWarning,
            None,
        )
        return DEFAULT_IMPORT_TIMEOUT_S
    return value


def call_bounded(function: Callable[[], T], timeout_s: float | None, what: str, doing: str = "importing it") -> T:
    """``function()``, run in a daemon thread that is waited for at most ``timeout_s``
    seconds (``None``: called here, without a bound).  Its exception (``SystemExit``
    included) is raised here; :class:`ImportTimeout` when it did not finish in time.
    """
    if timeout_s is None:
        return function()
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(function())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"ampcore {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ImportTimeout(
            f"{doing} did not finish within {timeout_s:g} s ({ENV_IMPORT_TIMEOUT}); it is left "
            "running in a background thread and the plugin is skipped for this process"
        )
    if failure:
        raise failure[0]
    return outcome[0]
