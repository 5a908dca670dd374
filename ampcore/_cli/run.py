"""``ampcore run``: run a script or module unchanged inside one ``ampcore.autocast`` region
(PAI's zero-code switch).

    python -m ampcore run --level O1 train.py --epochs 3
    AMPCORE_AUTOCAST=cpu:bf16:O1 python -m ampcore run train.py
    python -m ampcore run --device cuda --black-list softmax -m my_pkg.train

The settings come from the options, else from ``AMPCORE_AUTOCAST`` (``DEVICE[:DTYPE[:LEVEL]]``,
empty fields take the defaults), else from ``ampcore.autocast``'s defaults.  The script runs
as ``__main__`` with its own ``sys.argv``, as ``python train.py`` would.  Only the op side
changes: O2's ``decorate`` (parameters, master weights) and float16's ``GradScaler`` need
the model and optimizer, that is code (see docs/getting-started.md).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import warnings
from typing import Any, Final

from .._errors import AmpcoreError, AmpcoreWarning, shown

__all__ = ["ENV_VAR", "add_parser", "parse_env", "region_settings"]

ENV_VAR: Final = "AMPCORE_AUTOCAST"
_FIELDS: Final = ("device", "dtype", "level")
_FORMAT: Final = f"{ENV_VAR}=DEVICE[:DTYPE[:LEVEL]], e.g. cpu:bf16:O1, cuda:float16, cuda::OD (empty: the default)"


def parse_env(value: str) -> dict[str, str]:
    """The autocast settings ``AMPCORE_AUTOCAST`` holds (only the fields given).

    Example::

        >>> parse_env("cpu:bf16:O1"), parse_env("cuda::OD")
        ({'device': 'cpu', 'dtype': 'bf16', 'level': 'O1'}, {'device': 'cuda', 'level': 'OD'})
    """
    fields = [field.strip() for field in value.split(":")]
    if not value.strip() or len(fields) > len(_FIELDS):
        raise AmpcoreError(f"{ENV_VAR}={shown(value)}: expected {_FORMAT}")
    return {name: field for name, field in zip(_FIELDS, fields, strict=False) if field}


def region_settings(options: argparse.Namespace, environ: os._Environ[str] | dict[str, str]) -> dict[str, Any]:
    """The keyword arguments of the ``ampcore.autocast`` region: options over the environment."""
    settings: dict[str, Any] = {}
    env = environ.get(ENV_VAR)
    if env is not None:
        settings.update(parse_env(env))
    for name in _FIELDS:
        if getattr(options, name) is not None:
            settings[name] = getattr(options, name)
    for name in ("custom_white_list", "custom_black_list"):
        value = getattr(options, name)
        if value:
            settings[name] = {op.strip() for part in value for op in part.split(",") if op.strip()}
    return settings


def _caveats(region: Any) -> None:
    """Warn about what a region alone cannot do (O2's parameters, float16's loss scaling)."""
    import torch

    if region.level == "O2":
        warnings.warn(
            "ampcore run --level O2: only the op side runs in low precision; the parameters stay float32 "
            "(no fp32 master weights are needed or kept). Paddle's O2 (low-precision parameters) needs "
            "`model, opt = ampcore.decorate(model, opt, level='O2')` in the script.",
            AmpcoreWarning,
            stacklevel=2,
        )
    if region.enabled and region.dtype == torch.float16 and region.backend.needs_loss_scaling(region.dtype):
        warnings.warn(
            "ampcore run with float16: the loss is not scaled, so small gradients may underflow to zero. "
            "Loss scaling needs the optimizer step: add `scaler = ampcore.GradScaler()` and "
            "`scaler.scale(loss).backward(); scaler.step(opt); scaler.update()` to the script, or use bfloat16.",
            AmpcoreWarning,
            stacklevel=2,
        )


def _run(options: argparse.Namespace) -> int:
    from .._policy.autocast import autocast

    if not options.module and not options.target:
        raise AmpcoreError("ampcore run: name a script (ampcore run train.py ARGS) or a module (-m pkg.train ARGS)")
    settings = region_settings(options, os.environ)
    try:
        region = autocast(**settings)  # invalid settings raise here, before the script starts
    except AmpcoreError as exc:
        env = os.environ.get(ENV_VAR)
        if not env:
            raise
        raise AmpcoreError(f"{exc} (settings {settings} from {ENV_VAR}={env!r} and the options)") from None
    _caveats(region)
    target, *rest = options.module or options.target
    print(f"ampcore run: {target} under {region!r}", file=sys.stderr)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    try:
        with region:
            if options.module:
                sys.argv = [target, *rest]
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                if not os.path.isfile(target):
                    raise AmpcoreError(f"ampcore run: no such script {target!r}")
                sys.argv = [target, *rest]
                sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
                runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] != saved_path0:
            sys.path.pop(0)
    return 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a script unchanged inside ampcore.autocast (zero-code switch)",
        description=(
            "Run a Python script or module inside one ampcore.autocast region, without editing it. "
            f"Settings: the options below, else {_FORMAT}, else autocast's defaults. Only the op side "
            "changes: O2 parameters (ampcore.decorate) and float16 loss scaling (ampcore.GradScaler) need code."
        ),
    )
    parser.add_argument("--device", default=None, help="backend (cpu, cuda...); default: the best available")
    parser.add_argument("--dtype", default=None, help="bf16 / fp16 / a dtype name; default: the backend's")
    parser.add_argument("--level", default=None, help="O0, OD, O1 (default), O2, auto")
    parser.add_argument(
        "--white-list", dest="custom_white_list", action="append", metavar="OPS", help="ops to run low (a,b)"
    )
    parser.add_argument(
        "--black-list", dest="custom_black_list", action="append", metavar="OPS", help="ops to keep float32"
    )
    parser.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE",
        help="run a module and its arguments (python -m)",
    )
    parser.add_argument("target", nargs=argparse.REMAINDER, help="the script and its arguments")
    parser.set_defaults(func=_run)
