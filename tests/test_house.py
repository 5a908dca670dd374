"""House rules that hold the layout together (issue 29): every import arrow between ampcore's
subpackages points one way, and lint gives the same answer on any machine."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ampcore"


def _runtime_imports(tree: ast.Module) -> Iterator[ast.ImportFrom | ast.Import]:
    """Imports that run (those under ``if TYPE_CHECKING:`` only feed the type checker)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for child in node.body for inner in ast.walk(child))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
            yield node


def _unit(parts: list[str]) -> str:
    """The layer a module belongs to: its subpackage (``_policy``) or top-level module."""
    return parts[0] if parts else "__init__"


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, set[str]]]:
    """unit -> unit it imports at run time -> the files that do (``__init__`` left out)."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = list(path.relative_to(package).with_suffix("").parts)
        home = rel[:-1]  # the package the module is in
        source = _unit(rel[:-1] if rel[-1] == "__init__" else rel)
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "ampcore"]
            elif node.level:
                base = home[: len(home) - node.level + 1]
                targets = [base + node.module.split(".")] if node.module else [base + [a.name] for a in node.names]
            elif node.module and node.module.split(".")[0] == "ampcore":
                targets = [node.module.split(".")[1:]]
            else:
                continue
            for target in targets:
                unit = _unit(target)
                if source != "__init__" and unit not in (source, "__init__"):
                    graph.setdefault(source, {}).setdefault(unit, set()).add(str(path.relative_to(package.parent)))
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        for other in graph.get(unit, {}):
            if other not in index:
                visit(other)
                low[unit] = min(low[unit], low[other])
            elif other in stack:
                low[unit] = min(low[unit], index[other])
        if low[unit] == index[unit]:
            component: list[str] = []
            while not component or component[-1] != unit:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def test_subpackages_import_one_way() -> None:
    graph = import_graph()
    found = cycles(graph)
    detail = [
        f"{a} -> {b} ({', '.join(sorted(graph[a][b]))})"
        for comp in found
        for a in comp
        for b in comp
        if b in graph.get(a, {})
    ]
    assert not found, "import cycles between ampcore's subpackages:\n" + "\n".join(detail)


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    """The check can fail: a lower layer importing an upper one is a cycle."""
    for name, body in {
        "_low/__init__.py": "from .._high import x\n",
        "_high/__init__.py": "from .._low import y\n",
    }.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(body)
    (tmp_path / "_typed").mkdir()
    (tmp_path / "_typed" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .._low import y\n"
    )
    (tmp_path / "_low" / "more.py").write_text("from .._typed import z\n")
    assert cycles(import_graph(tmp_path)) == [["_high", "_low"]]


def test_optional_frameworks_are_never_analysed_by_mypy() -> None:
    """Every third-party module ampcore imports beyond its dependencies (torch, pluggy) and
    the test tools (pytest) has `follow_imports = "skip"`, so `mypy --strict ampcore` gives
    the same answer whether or not lightning, accelerate, transformers or matplotlib are
    installed."""
    imported: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    optional = imported - set(sys.stdlib_module_names) - {"ampcore", "torch", "pluggy", "pytest"}
    assert optional >= {"lightning", "accelerate", "transformers"}
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    skipped = {
        module
        for override in config["tool"]["mypy"].get("overrides", [])
        if override.get("follow_imports") == "skip"
        for module in override["module"]
    }
    missing = sorted(name for name in optional if not {name, f"{name}.*"} <= skipped)
    assert not missing, f"add {missing} (and their '.*') to the follow_imports='skip' override in pyproject.toml"
