"""The names of ampcore's C++ builds: one per torch version and per source with its headers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ampcore._cpp_build import extension_name
from ampcore._o2 import onepass, onepass_loop


def test_the_name_carries_the_torch_version_and_the_source(tmp_path: Path) -> None:
    source = tmp_path / "kernel.cpp"
    source.write_text("int f() { return 1; }\n")
    name = extension_name("stem", source)
    assert name.startswith("stem_") and re.sub(r"[^0-9A-Za-z]+", "_", torch.__version__) in name
    assert extension_name("stem", source) == name
    source.write_text("int f() { return 2; }\n")
    assert extension_name("stem", source) != name


def test_a_changed_header_makes_another_build(tmp_path: Path) -> None:
    source, header = tmp_path / "kernel.cpp", tmp_path / "kernel.h"
    source.write_text('#include "kernel.h"\n')
    header.write_text("inline int f() { return 1; }\n")
    before = extension_name("stem", source, header)
    assert before != extension_name("stem", source)
    header.write_text("inline int f() { return 2; }\n")
    assert extension_name("stem", source, header) != before


@pytest.mark.parametrize("module", [onepass, onepass_loop], ids=["fused", "loop"])
def test_every_ampcore_header_a_kernel_includes_is_in_its_name(module: object) -> None:
    source: Path = module.SOURCE  # type: ignore[attr-defined]
    headers: tuple[Path, ...] = module.HEADERS  # type: ignore[attr-defined]
    included = set(re.findall(r'^#include "([^"]+)"', source.read_text(), flags=re.MULTILINE))
    for header in headers:  # and what those headers include in turn
        included |= set(re.findall(r'^#include "([^"]+)"', header.read_text(), flags=re.MULTILINE))
    assert included == {header.name for header in headers}
    assert all(header.is_file() for header in headers)
