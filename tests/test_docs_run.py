"""Every example a reader may copy runs: the ``>>>`` examples in the docstrings of ampcore's
modules (doctest), and every ```python block of README.md and docs/*.md.

A doc's blocks run in order in one namespace (a page reads top to bottom), in a scratch
directory where ``examples/`` is reachable.  A block written as ``>>>`` lines is checked as
a doctest (output included); any other block must run without error.  The few blocks that
need what this machine may lack start with an explicit marker comment:

    # doc-test: requires cuda          (skipped unless backend "cuda" is available)
    # doc-test: requires no cuda       (skipped where backend "cuda" is available: output
                                       # written for a machine without a GPU)
    # doc-test: requires cpu-only torch  (skipped unless torch is a CPU-only build: output
                                       # that names the build, e.g. why CUDA is unavailable)
    # doc-test: skip <reason>          (never run here; the reason is shown)

A block may start with several marker lines; it runs when every one allows it.
"""

from __future__ import annotations
import __future__

import doctest
import importlib
import importlib.util
import pkgutil
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import ampcore

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("ampcore", "ampcore_backends", "ampcore_conformance", "ampcore_example", "ampcore_acme")
#: modules not imported here: the suite's pytest plugin registers assert rewriting on import
#: (it has no examples; it runs in every conformance run)
_NOT_IMPORTED = {"ampcore_conformance.plugin"}
#: integration modules (and O2's Triton kernel) and the optional package each imports
#: (not installed: not imported)
_NEEDS = {
    "ampcore.integrations.lightning": "lightning",
    "ampcore.integrations.accelerate": "accelerate",
    "ampcore.integrations.transformers": "transformers",
    "ampcore._o2.triton_adam": "triton",
}
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_MARKER = re.compile(r"^(?:>>> )?# doc-test: (requires|skip)\s*(.*)$")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc.name}:{self.line}"


def _blocks(doc: Path) -> list[Block]:
    text = doc.read_text(encoding="utf-8")
    return [Block(doc, text.count("\n", 0, m.start()) + 2, m.group(1)) for m in _BLOCK.finditer(text)]


ALL_BLOCKS = [block for doc in DOCS for block in _blocks(doc)]


def _markers(block: Block) -> list[tuple[str, str]]:
    """The block's leading ``# doc-test:`` markers, as (kind, what) pairs."""
    found: list[tuple[str, str]] = []
    for line in block.code.splitlines():
        match = _MARKER.match(line)
        if match is None:
            break
        found.append((match.group(1), match.group(2).strip()))
    return found


def _available(backend: str) -> bool:
    try:
        return ampcore.get_backend(backend).is_available
    except ampcore.AmpcoreError:
        return False


def _cpu_only_torch() -> bool:
    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


def _skip_reason(block: Block) -> str | None:
    for kind, what in _markers(block):
        if kind == "skip":
            return f"{block.id}: {what}"
        if what == "cpu-only torch":
            if _cpu_only_torch():
                continue
            return f"{block.id}: needs a CPU-only build of torch, this is {torch.__version__}"
        absent = what.startswith("no ")
        backend = what.removeprefix("no ").strip()
        if _available(backend) == absent:
            needs = "no backend" if absent else "backend"
            state = "available" if absent else "not available"
            return f"{block.id}: needs {needs} {backend!r}, {state} here"
    return None


def _run(block: Block, namespace: dict[str, Any]) -> None:
    lines = [line for line in block.code.splitlines(keepends=True) if not _MARKER.match(line)]
    code = "".join(lines)
    if code.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(code, namespace, block.id, str(block.doc), block.line - 1)
        report: list[str] = []
        runner = doctest.DocTestRunner(optionflags=_FLAGS)
        result = runner.run(test, out=report.append, clear_globs=False)
        if result.failed:
            pytest.fail(f"{block.id}: doctest failed\n" + "".join(report), pytrace=False)
        return
    compiled = compile(code, f"{block.doc}:{block.line}", "exec", flags=__future__.annotations.compiler_flag)
    exec(compiled, namespace)  # noqa: S102 - running the documentation is the point


class _Pages:
    """One namespace per doc; earlier blocks are run first when a test is selected alone."""

    def __init__(self) -> None:
        self.namespaces: dict[Path, tuple[dict[str, Any], int]] = {}

    def run_upto(self, block: Block) -> None:
        blocks = _blocks(block.doc)
        index = blocks.index(block)
        namespace, done = self.namespaces.get(block.doc, ({"__name__": "__docs__"}, -1))
        for earlier in blocks[done + 1 : index]:
            if _skip_reason(earlier) is None:
                _run(earlier, namespace)
        self.namespaces[block.doc] = (namespace, index)
        _run(block, namespace)


@pytest.fixture(scope="module")
def pages() -> _Pages:
    return _Pages()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("docs")
    (directory / "examples").symlink_to(ROOT / "examples")
    return directory


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_doc_block_runs(
    block: Block, pages: _Pages, scratch: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = _skip_reason(block)
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.chdir(scratch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ampcore.AmpcoreWarning)  # e.g. "float16 runs emulated" on this CPU
        pages.run_upto(block)


def test_every_doc_page_with_code_is_covered() -> None:
    pages = {block.doc.name for block in ALL_BLOCKS}
    assert {"README.md", "getting-started.md", "o2.md", "op-lists.md", "plugins.md", "scaler.md"} <= pages
    assert len(ALL_BLOCKS) >= 40


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        try:
            module = importlib.import_module(package)
        except ImportError:  # the example plugin is installed by tasks.py, not by pip install ampcore
            continue
        names.append(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")]
    return [
        n
        for n in names
        if n not in _NOT_IMPORTED
        and not n.rsplit(".", 1)[-1].startswith(("test_", "conftest", "__main__"))
        and (n not in _NEEDS or importlib.util.find_spec(_NEEDS[n]) is not None)
    ]


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder().find(module, name)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ampcore.AmpcoreWarning)
        for test in tests:
            runner.run(test, out=report.append)
    if runner.failures:
        pytest.fail(f"{name}: {runner.failures} docstring example(s) failed\n" + "".join(report), pytrace=False)


def test_docstring_examples_are_found() -> None:
    count = sum(
        len(test.examples)
        for name in _modules()
        for test in doctest.DocTestFinder().find(importlib.import_module(name), name)
    )
    assert count >= 138  # the issue counted 138 `>>>` lines never executed
