"""Set-up for the ``ampcore`` command line that must happen before torch is imported.

torch warns ``UserWarning: Failed to initialize NumPy`` at import when NumPy is missing.
ampcore's commands never use NumPy, so when this process *is* the command line (the
``ampcore`` console script or ``python -m ampcore``) that one message is noise before every
command.  Only then, and only that message from torch's modules, is filtered; a program that
imports ampcore as a library still gets torch's warning.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import PurePath, PureWindowsPath
from typing import Final

__all__ = ["NUMPY_MESSAGE", "launched_as_cli", "quiet_torch_numpy_warning"]

#: The start of torch's message (a regex for :func:`warnings.filterwarnings`).
NUMPY_MESSAGE: Final = "Failed to initialize NumPy"
_CLI_NAME: Final = "ampcore"
#: interpreter options whose value is the next argument
_OPTIONS_WITH_VALUE: Final = ("-X", "-W", "--check-hash-based-pycs")


def _stem(path: str) -> str:
    name = PureWindowsPath(path).name if "\\" in path else PurePath(path).name
    return name.removesuffix(".exe").removesuffix("-script.py")


def launched_as_cli(argv: Sequence[str], orig_argv: Sequence[str]) -> bool:
    """Whether the process runs the ampcore command line.

    ``argv``/``orig_argv`` are ``sys.argv``/``sys.orig_argv`` (during ``python -m``,
    ``sys.argv[0]`` is ``"-m"`` while the package is imported).

    Example::

        >>> launched_as_cli(["-m"], ["python", "-m", "ampcore", "info"])
        True
        >>> launched_as_cli(["train.py"], ["python", "train.py"])
        False
    """
    if argv and _stem(argv[0]) == _CLI_NAME:
        return True
    args = list(orig_argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "-m":
            return args[:1] == [_CLI_NAME]
        if arg in _OPTIONS_WITH_VALUE:
            args = args[1:]
        elif arg == "-c" or not arg.startswith("-"):  # code or a script: no module runs
            return False
    return False


def quiet_torch_numpy_warning(force: bool = False) -> None:
    """Ignore torch's NumPy warning when this process is the command line (or ``force``)."""
    if force or launched_as_cli(sys.argv, getattr(sys, "orig_argv", sys.argv)):
        warnings.filterwarnings("ignore", message=NUMPY_MESSAGE, category=UserWarning, module=r"torch(\.|$)")
