"""docs/writing-a-backend.md carries the hook reference generated from ampcore/hookspec.py."""

from __future__ import annotations

import inspect
import runpy
from pathlib import Path
from typing import Any

from ampcore import hookspec

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> dict[str, Any]:
    return runpy.run_path(str(ROOT / "docs" / "gen_hooks.py"))


def test_hook_reference_is_in_sync_with_the_hookspec() -> None:
    gen = _generator()
    text = (ROOT / "docs" / "writing-a-backend.md").read_text(encoding="utf-8")
    assert gen["current"](text) == gen["render"](), (
        "docs/writing-a-backend.md is out of date with ampcore/hookspec.py: run python docs/gen_hooks.py"
    )


def test_reference_documents_every_hook_with_its_docstring() -> None:
    rendered = _generator()["render"]()
    hooks = [name for name in vars(hookspec) if name.startswith("ampcore_")]
    assert hooks and all(f"#### `{name}`" in rendered for name in hooks)
    assert "firstresult" not in rendered  # hooks are never broadcast: no hook is firstresult
    assert "`ampcore_backend`](#ampcore_backend) | **yes**" in rendered
    first_line = inspect.getdoc(hookspec.ampcore_op_list_adjustments) or ""
    assert first_line.splitlines()[0].replace("``", "`") in rendered
