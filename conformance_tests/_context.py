"""The session of one conformance run: which backend, which dtypes, and why it cannot run.

Built once from the pytest options by the plugin and kept in ``config.stash``.  A backend
that is unknown or has no device does not stop collection: :attr:`SuiteContext.problem`
says why, and the plugin turns it into an explicit failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

import ampcore
from ampcore import toolkit
from ampcore_conformance._lists import effective_lists
from ampcore_conformance._manifest import Manifest, Tolerances

__all__ = [
    "CALL",
    "OPTION",
    "SuiteContext",
    "UsageProblem",
    "build_context",
    "check_dtypes",
    "dtype_name",
    "parse_dtype",
]

#: How dtype errors name the call and the option (``ampcore conformance`` passes ``--dtype``).
CALL: Final = "ampcore conformance"
OPTION: Final = "--ampcore-dtype"


class UsageProblem(ValueError):
    """The options themselves are wrong (an unknown dtype name, an undeclared dtype)."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(text: str, option: str = OPTION) -> torch.dtype:
    """``"bf16"``, ``"bfloat16"`` or ``"torch.bfloat16"`` -> ``torch.bfloat16`` (ampcore's parser)."""
    try:
        return toolkit.parse_dtype(text, CALL, option)
    except ampcore.AmpcoreError as exc:
        raise UsageProblem(str(exc)) from None


def check_dtypes(backend: ampcore.Backend, names: Sequence[str], option: str = OPTION) -> tuple[torch.dtype, ...]:
    """The dtypes ``names`` selects among those ``backend`` declares and its device 0 runs
    (:func:`ampcore.toolkit.device_dtypes`; all of them for none).

    Raises :class:`UsageProblem` naming ``option`` (what the user typed: ``--dtype`` for
    ``ampcore conformance``) and listing only the declared dtypes, or naming the device
    that refuses a chosen one.  An unavailable backend keeps the declared dtypes (the run
    fails on the missing device).
    """
    owner = f"backend {backend.name!r}"
    try:
        chosen = [toolkit.parse_declared_dtype(n, backend.supported_dtypes, owner, CALL, option) for n in names]
    except ampcore.AmpcoreError as exc:
        raise UsageProblem(str(exc)) from None
    if not backend.is_available:
        return tuple(dict.fromkeys(chosen)) or tuple(backend.supported_dtypes)
    runs = toolkit.device_dtypes(backend, 0)
    for dtype in dict.fromkeys(chosen):
        if dtype not in runs:
            found = "; ".join(i.message for i in backend.capability_issues(dtype, 0) if i.severity == "error")
            raise UsageProblem(
                f"{CALL} {option} {dtype_name(dtype)}: backend {backend.name!r} declares it, but its capability "
                f"check refuses it on {backend.device_type}:0 ({found}); dtypes this device runs: "
                f"{', '.join(dtype_name(d) for d in runs) or 'none'}"
            )
    return tuple(dict.fromkeys(chosen)) or runs


@dataclass
class SuiteContext:
    """Everything the checks share in one run."""

    backend_name: str
    backend: ampcore.Backend | None
    dtypes: tuple[torch.dtype, ...]
    manifest: Manifest
    report_dir: Path | None = None
    problem: str | None = None
    #: Timings filled by the speed check: ``{dtype name: {...}}``.
    speed: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lists: dict[tuple[torch.dtype, str], ampcore.OpLists | Exception] = field(default_factory=dict)

    @property
    def tolerances(self) -> Tolerances:
        return self.manifest.tolerances

    @property
    def usable(self) -> bool:
        """Whether the backend is known and available (so that checks can run)."""
        return self.problem is None and self.backend is not None

    def require_backend(self) -> ampcore.Backend:
        """The backend; fails the calling test with the session's problem otherwise."""
        if self.backend is None or self.problem is not None:
            raise RuntimeError(self.problem or f"backend {self.backend_name!r} is not usable")
        return self.backend

    @property
    def device(self) -> torch.device:
        """The torch device tensors of the run live on."""
        return torch.device(self.require_backend().device_type)

    def lists(self, dtype: torch.dtype, level: str = "O1") -> ampcore.OpLists:
        """The backend's effective op lists (cached; re-raises the error that building them gave)."""
        key = (dtype, level)
        if key not in self._lists:
            try:
                self._lists[key] = effective_lists(self.require_backend(), dtype, level)
            except Exception as exc:  # a broken adapter: remembered, failed by the list checks
                self._lists[key] = exc
        found = self._lists[key]
        if isinstance(found, Exception):
            raise found
        return found

    def device_name(self) -> str | None:
        """The adapter's name for device 0, or None when it cannot say."""
        if not self.usable:
            return None
        try:
            return self.require_backend().device_name(0)
        except Exception as exc:  # reported, never fatal
            return f"<device_name() raised {type(exc).__name__}: {exc}>"


def build_context(
    backend_name: str, dtype_names: list[str], manifest: Manifest, report_dir: Path | None
) -> SuiteContext:
    """Resolve the backend and dtypes; an unknown or unavailable backend becomes ``problem``.

    Raises :class:`UsageProblem` for dtypes that are no dtype or that the backend does not
    declare.
    """
    try:
        backend = ampcore.get_backend(backend_name)
    except ampcore.AmpcoreError as exc:
        requested = tuple(dict.fromkeys(parse_dtype(name) for name in dtype_names))
        context = SuiteContext(backend_name, None, requested, manifest, report_dir)
        context.problem = f"no device found for backend {backend_name!r}: the backend is not installed ({exc})"
        return context
    context = SuiteContext(backend_name, backend, check_dtypes(backend, dtype_names), manifest, report_dir)
    reason = backend.unavailable_reason
    if reason is not None:
        context.problem = f"no device found for backend {backend_name!r}: {reason}"
    return context
