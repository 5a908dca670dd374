"""The one exception base and the one warning base of ampcore.

The errors ampcore reports about its callers' arguments, plugins and state derive from
:class:`AmpcoreError` (a :class:`RuntimeError`); every warning derives from
:class:`AmpcoreWarning`.  Messages name the call or plugin, say what is wrong and list the
valid choices.

Not every exception that leaves ampcore is an :class:`AmpcoreError`:

* torch's own errors pass through unchanged (an op failing inside a region, a bad tensor);
* where ampcore runs a step or an op in torch's place it raises what torch raises, with
  torch's message: the fused master-weight Adam step (``RuntimeError`` for sparse gradients,
  a tensor ``lr`` with ``foreach``) and an op autocast bans (``RuntimeError``);
* the plugin manager's lookup of an unknown backend name raises ``KeyError`` (the public
  entry points turn it into an :class:`AmpcoreError`), and ``CapabilityIssue`` refuses an
  invalid severity with ``ValueError`` (a programming error in an adapter).
"""

from __future__ import annotations

import difflib
import sys
import warnings
from collections.abc import Iterable

__all__ = [
    "AmpcoreError",
    "AmpcoreWarning",
    "BackendUnavailableError",
    "PluginError",
    "PluginWarning",
    "closest",
    "shown",
    "user_stacklevel",
    "warn_at",
    "warn_user",
]

#: Packages whose frames a warning never points at: ampcore, its first-party adapters, and
#: the layers between them and the caller (pluggy's hook calls, torch's module calls and
#: dispatcher, contextlib's ``with`` helpers).
_PASS_THROUGH = frozenset({"ampcore", "ampcore_backends", "pluggy", "torch", "contextlib"})


#: The longest message an :class:`AmpcoreError` shows whole.
MESSAGE_LIMIT = 2000


class AmpcoreError(RuntimeError):
    """Base class of the errors ampcore reports itself (see the module docstring for the
    exceptions that keep torch's types).

    It derives from :class:`RuntimeError` so that code catching torch's AMP errors keeps
    working when it switches to ampcore.  A message longer than :data:`MESSAGE_LIMIT`
    characters keeps its beginning and end (what was wrong, the valid choices) and elides
    the middle: no argument echoed in it can flood a terminal.
    """

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str) and len(args[0]) > MESSAGE_LIMIT:
            text = args[0]
            head, tail = MESSAGE_LIMIT * 2 // 3, MESSAGE_LIMIT // 4
            args = (f"{text[:head]} [... {len(text) - head - tail} characters left out ...] {text[-tail:]}",)
        super().__init__(*args)


class BackendUnavailableError(AmpcoreError):
    """A known backend was asked for, but it cannot run here (its adapter said why)."""


class PluginError(AmpcoreError):
    """A plugin failed to load or broke the adapter contract.

    Args:
        plugin: the plugin's name (its entry-point name or the name it was registered as).
        message: what went wrong.
        distribution: the distribution that provided it, when known.
    """

    def __init__(self, plugin: str, message: str, distribution: str | None = None) -> None:
        where = f' (distribution "{distribution}")' if distribution else ""
        super().__init__(f'Plugin "{plugin}"{where}: {message}')
        self.plugin = plugin
        self.distribution = distribution


class AmpcoreWarning(UserWarning):
    """Base class of every warning issued by ampcore."""


class PluginWarning(AmpcoreWarning):
    """A plugin was skipped or misbehaved; ampcore goes on without it."""


def closest(name: str, choices: Iterable[str], n: int = 3, *, same_first_word: bool = False) -> list[str]:
    """The names among ``choices`` closest to ``name`` (for "did you mean" hints).

    Case is ignored when comparing (``"ADD"`` finds ``"add"``); an exact match in another
    case comes first.  ``same_first_word``: for snake_case parameter names, prefer choices
    that start with the same word (``decr_every_n_steps`` finds ``decr_every_n_nan_or_inf``,
    not the closer-spelled ``incr_every_n_steps``), if any is close enough.

    Example::

        >>> closest("ADD", ["add", "addmm", "mm"])
        ['add', 'addmm']
        >>> closest("decr_every_n_steps", ["incr_every_n_steps", "decr_every_n_nan_or_inf"], n=1, same_first_word=True)
        ['decr_every_n_nan_or_inf']
    """
    if same_first_word:
        first = str(name).lower().split("_")[0]
        pool = sorted(set(choices))
        alike = [c for c in pool if c.lower().split("_")[0] == first]
        found = difflib.get_close_matches(str(name).lower(), alike, n=n, cutoff=0.4) if alike else []
        return found or closest(name, pool, n)
    by_lower: dict[str, str] = {}
    for choice in sorted(set(choices)):
        by_lower.setdefault(choice.lower(), choice)
    key = str(name).lower()
    found = difflib.get_close_matches(key, list(by_lower), n=n, cutoff=0.6)
    if key in by_lower and key in found:
        found.remove(key)
        found.insert(0, key)
    return [by_lower[match] for match in found]


#: The longest echo of a caller's value in a message (longer reprs are cut).
SHOWN_LIMIT = 80


def shown(value: object, limit: int = SHOWN_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters (a long repr
    ends in ``...`` and says what it was), so an object passed by mistake cannot flood it.

    Example::

        >>> shown("cpu")
        "'cpu'"
        >>> shown(list(range(100)), limit=20)
        '[0, 1, 2, 3, 4, 5, 6... (list: 100 items, 390 characters)'
    """
    try:
        text = repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits() cannot even be printed
        return f"<an int of {value.bit_length()} bits>" if isinstance(value, int) else f"<a {type(value).__name__}>"
    if len(text) <= limit:
        return text
    try:
        count = "" if isinstance(value, str) else f"{len(value)} items, "  # type: ignore[arg-type]
    except TypeError:
        count = ""
    return f"{text[:limit]}... ({type(value).__name__}: {count}{len(text)} characters)"


def warn_at(
    message: str,
    category: type[Warning],
    filename: str | None,
    lineno: int = 1,
    stacklevel: int | None = None,
) -> None:
    """Warn pointing at ``filename`` (e.g. a plugin's own file) when it is known.

    Falls back to a normal warning attributed to the caller ``stacklevel`` frames up (``None``:
    the first frame outside ampcore, as :func:`warn_user`).
    """
    if filename:
        warnings.warn_explicit(message, category, filename, lineno)
    else:
        warnings.warn(message, category, stacklevel=user_stacklevel() if stacklevel is None else stacklevel)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called by the caller of this function,
    point at the first frame outside ampcore (and the layers in :data:`_PASS_THROUGH`): the
    user's line, however deep inside ampcore the warning starts."""
    frame = sys._getframe(1)  # the function that calls warnings.warn
    level = 1
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).partition(".")[0] in _PASS_THROUGH:
        frame = frame.f_back
        level += 1
    return level


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointing at the user's line (see :func:`user_stacklevel`), never at
    ampcore's own: the one way ampcore's public entry points warn.

    Example::

        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_user("careful", AmpcoreWarning)
        >>> caught[0].filename.endswith("_errors.py")
        False
    """
    warnings.warn(message, category, stacklevel=user_stacklevel())
