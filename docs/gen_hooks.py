#!/usr/bin/env python3
"""Generate the hook reference of docs/writing-a-backend.md from ``ampcore/hookspec.py``.

    python docs/gen_hooks.py           # rewrite the generated section in place
    python docs/gen_hooks.py --check   # exit 1 when the section is out of date

The section lies between the two ``GENERATED HOOK REFERENCE`` markers; the prose around
it is written by hand.  ``tests/conformance/test_hook_docs.py`` fails when it is stale.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

DOC: Final = Path(__file__).resolve().parent / "writing-a-backend.md"
BEGIN: Final = "<!-- BEGIN GENERATED HOOK REFERENCE (python docs/gen_hooks.py; do not edit by hand) -->"
END: Final = "<!-- END GENERATED HOOK REFERENCE -->"
_ROLE: Final = re.compile(r":(?:func|class|meth|data|attr|mod):`~?([^`]+)`")
_BANNER: Final = re.compile(r"^# ([A-Z].*)$")
_FIELD: Final = re.compile(r"^    (\w+): (.*)$")


def _hooks() -> list[tuple[str, Callable[..., Any]]]:
    from ampcore import hookspec

    found = [(n, f) for n, f in vars(hookspec).items() if n.startswith("ampcore_") and inspect.isfunction(f)]
    return sorted(found, key=lambda item: inspect.getsourcelines(item[1])[1])


def _groups(hooks: list[tuple[str, Callable[..., Any]]]) -> list[tuple[str, list[tuple[str, Callable[..., Any]]]]]:
    """Hooks under the comment banners of the hookspec module, in source order."""
    from ampcore import hookspec

    lines = inspect.getsource(hookspec).splitlines()
    banners = [(i + 1, m.group(1)) for i, line in enumerate(lines) if (m := _BANNER.match(line))]
    groups: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
    for name, function in hooks:
        line = inspect.getsourcelines(function)[1]
        title = next((t for n, t in reversed(banners) if n < line), "Hooks")
        groups.setdefault(title, []).append((name, function))
    return list(groups.items())


def _field(line: str) -> str | None:
    """A line of an ``Attributes:`` section as markdown: a field opens a list item
    (``- `name`: ...``), its indented continuation stays in it; None: the section ended."""
    if line.startswith("        "):
        return "  " + line.strip()
    found = _FIELD.match(line)
    return None if found is None else f"- `{found.group(1)}`: {found.group(2)}"


def _markdown(docstring: str) -> str:
    """The docstring with reST roles, literals, ``::`` blocks and ``Attributes:`` sections
    turned into markdown."""
    out: list[str] = []
    code = fields = False
    for line in docstring.splitlines():
        if code and line.strip() and not line.startswith("    "):
            out.append("```")
            code = False
        if code:
            out.append(line[4:])
            continue
        if fields:
            item = _field(line)
            fields = item is not None
            line = line if item is None else item
        if line.strip() == "Attributes:":
            out += [line, ""]
            fields = True
            continue
        line = _ROLE.sub(lambda m: f"`{m.group(1)}()`" if m.group(0).startswith(":func:") else f"`{m.group(1)}`", line)
        line = line.replace("``", "`")
        if line.rstrip().endswith("::"):
            out += [line.rstrip()[:-1], "", "```python"]
            code = True
            continue
        out.append(line)
    if code:
        out.append("```")
    return "\n".join(out).replace("```python\n\n", "```python\n").strip()


def _signature(name: str, function: Callable[..., Any]) -> str:
    signature = inspect.signature(function)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in signature.parameters.values())
    return f"def {name}({params}) -> {signature.return_annotation}: ..."


def _returned_class(function: Callable[..., Any]) -> tuple[str, type] | None:
    """The class of the hookspec module a hook returns (``BackendSpec``), to document with it."""
    from ampcore import hookspec

    name = str(inspect.signature(function).return_annotation)
    value = getattr(hookspec, name, None)
    return (name, value) if inspect.isclass(value) else None


def render() -> str:
    """The generated section, markers included."""
    from ampcore import hookspec

    hooks = _hooks()
    required = set(hookspec.REQUIRED_HOOKS)
    lines = [BEGIN, "", "## Hook reference", "", "| hook | required | summary |", "|---|---|---|"]
    for name, function in hooks:
        summary = _markdown((inspect.getdoc(function) or "").split("\n\n")[0]).replace("\n", " ")
        lines.append(f"| [`{name}`](#{name}) | {'**yes**' if name in required else 'no'} | {summary} |")
    for title, members in _groups(hooks):
        lines += ["", f"### {title}"]
        for name, function in members:
            lines += ["", f"#### `{name}`", "", "```python", _signature(name, function), "```", ""]
            lines.append(_markdown(inspect.getdoc(function) or "(undocumented)"))
            returned = _returned_class(function)
            if returned is not None:
                lines += ["", f"#### `{returned[0]}`", "", _markdown(inspect.getdoc(returned[1]) or "(undocumented)")]
    lines += ["", END]
    return "\n".join(lines)


def current(text: str) -> str | None:
    """The generated section as it stands in ``text`` (None when the markers are missing)."""
    start, end = text.find(BEGIN), text.find(END)
    return None if start < 0 or end < 0 else text[start : end + len(END)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the doc is out of date")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    found, wanted = current(text), render()
    if found is None:
        print(f"{DOC}: the markers {BEGIN!r} and {END!r} are missing", file=sys.stderr)
        return 1
    if found == wanted:
        return 0
    if args.check:
        print(f"{DOC} is out of date with ampcore/hookspec.py: run python docs/gen_hooks.py", file=sys.stderr)
        return 1
    DOC.write_text(text.replace(found, wanted), encoding="utf-8")
    print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
