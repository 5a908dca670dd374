"""Vendor manifests: tests to skip or expect to fail (each with a reason), and tolerances.

A manifest is a TOML or JSON file::

    [skip]
    "test_white_ops_run_low[float16-conv3d]" = "no fp16 3-D convolution on this chip"

    [xfail]
    "test_scaler_*[float16]" = "fp16 unscale kernel pending (vendor bug 123)"

    [tolerances]
    convergence_rtol = 0.2

A key names tests by their name (``test_x[bfloat16-mm]``), their name without parameters
(``test_x``) or ``module.py::name``; ``*`` and ``?`` are wildcards (``[`` and ``]`` are
literal).  Every value is the reason, which is mandatory.  Entries that match no collected
test are reported with a warning: they are stale.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final, Literal

import tomllib

import ampcore
from ampcore import toolkit

__all__ = ["Manifest", "ManifestEntry", "ManifestError", "Tolerances", "load_manifest"]

Action = Literal["skip", "xfail"]
_SECTIONS: Final = ("skip", "xfail", "tolerances")


class ManifestError(ValueError):
    """A manifest file that cannot be read or breaks the format (the message says where)."""


@dataclass(frozen=True)
class Tolerances:
    """Numeric tolerances a vendor may widen in the manifest's ``[tolerances]`` table."""

    #: Final low-precision training loss may exceed the float32 one by this fraction.
    convergence_rtol: float = 0.15
    #: White-list ops must match float32 within this many ``finfo(dtype).eps`` (relative).
    op_eps: float = 8.0
    #: Gradients of a mixed-precision backward must match float32 within this (relative).
    grad_rtol: float = 0.05


@dataclass(frozen=True)
class ManifestEntry:
    """One ``pattern = "reason"`` line of the ``skip`` or ``xfail`` table."""

    action: Action
    pattern: str
    reason: str

    def matches(self, names: Iterable[str]) -> bool:
        """Whether any of ``names`` (the ways to name one test) matches the pattern."""
        regex = _compile(self.pattern)
        return any(regex.fullmatch(name) for name in names)


@dataclass(frozen=True)
class Manifest:
    """A loaded manifest (an empty one when no file was given)."""

    path: str | None = None
    entries: tuple[ManifestEntry, ...] = ()
    tolerances: Tolerances = field(default_factory=Tolerances)

    def find(self, names: Iterable[str]) -> ManifestEntry | None:
        """The first entry matching a test (``skip`` entries win over ``xfail``)."""
        names = tuple(names)
        ordered = sorted(self.entries, key=lambda e: e.action != "skip")
        return next((entry for entry in ordered if entry.matches(names)), None)


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern))


def _read(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc}") from exc
    except UnicodeDecodeError as exc:  # e.g. a UTF-16 file (bytes \xff\xfe...)
        raise ManifestError(f"manifest {path} is not UTF-8 text: {exc}; save it as UTF-8") from exc
    kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
    try:
        data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # the decode errors, and nesting too deep to parse
        raise ManifestError(f"manifest {path} is not valid {kind}: {exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"manifest {path}: expected a table/object at the top level")
    return data


def load_manifest(path: str | Path | None) -> Manifest:
    """Read and validate a manifest; ``None`` gives an empty one.

    Raises :class:`ManifestError` naming the file and the offending entry.

    Example::

        >>> load_manifest(None).entries
        ()
    """
    if path is None:
        return Manifest()
    where = Path(path)
    data = _read(where)
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise ManifestError(f"manifest {where}: unknown section(s) {unknown}; valid sections: {', '.join(_SECTIONS)}")
    entries: list[ManifestEntry] = []
    for action in ("skip", "xfail"):
        table = data.get(action, {})
        if not isinstance(table, dict):
            raise ManifestError(f"manifest {where}: [{action}] must map test patterns to reasons")
        for pattern, reason in table.items():
            if not isinstance(reason, str) or not reason.strip():
                raise ManifestError(
                    f'manifest {where}: [{action}] "{pattern}" needs a reason (a non-empty string), got {reason!r}'
                )
            entries.append(ManifestEntry(action, pattern, reason.strip()))  # type: ignore[arg-type]
    return Manifest(str(where), tuple(entries), _tolerances(where, data.get("tolerances", {})))


def _tolerances(where: Path, table: object) -> Tolerances:
    valid = {f.name for f in fields(Tolerances)}
    if not isinstance(table, dict):
        raise ManifestError(f"manifest {where}: [tolerances] must be a table")
    unknown = sorted(set(table) - valid)
    if unknown:
        raise ManifestError(f"manifest {where}: unknown tolerance(s) {unknown}; valid: {', '.join(sorted(valid))}")
    checked = {}
    for key, value in table.items():
        try:  # JSON reads NaN and Infinity; TOML nan and inf
            checked[key] = toolkit.check_real(
                f"manifest {where} [tolerances]", key, value, low=0.0, low_open=True, entry=True
            )
        except ampcore.AmpcoreError as exc:
            raise ManifestError(str(exc)) from None
    return replace(Tolerances(), **checked)
