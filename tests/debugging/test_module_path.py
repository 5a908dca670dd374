"""ModuleTracker: module paths from global hooks, per thread, removed on exit."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

from ampcore.debugging._module_path import ModuleTracker


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.lin(x))  # one submodule called twice


def _run(model: nn.Module, root_label: str | None = None) -> list[str]:
    ends: list[str] = []
    with ModuleTracker(root_label, on_forward_end=lambda path, module, output: ends.append(path)):
        model(torch.ones(1, 2))
    return ends


def test_paths_are_the_root_class_then_qualified_names() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), Shared()))
    assert _run(model) == [
        "Sequential.0",
        "Sequential.1.0",
        "Sequential.1.1.lin",
        "Sequential.1.1.lin",
        "Sequential.1.1",
        "Sequential.1",
        "Sequential",
    ]
    assert _run(model, root_label="Net")[-1] == "Net"


def test_path_is_the_innermost_running_module() -> None:
    seen: list[tuple[str, str | None]] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append((tracker.path, tracker.module_type))
            return x

    tracker = ModuleTracker()
    with tracker:
        nn.Sequential(Probe())(torch.ones(1))
        seen.append((tracker.path, tracker.module_type))
    assert seen == [("Sequential.0", "Probe"), ("", None)]


def test_other_threads_are_ignored() -> None:
    ends: list[str] = []
    worker = threading.Thread(target=lambda: nn.ReLU()(torch.ones(1)))
    with ModuleTracker(on_forward_end=lambda path, module, output: ends.append(path)):
        worker.start()
        worker.join()
    assert ends == []


def test_hooks_are_removed_after_an_exception_and_the_stack_unwinds() -> None:
    class Fails(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    before = (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks))
    tracker = ModuleTracker()
    with pytest.raises(ValueError, match="boom"), tracker:
        try:
            nn.Sequential(Fails())(torch.ones(1))
        finally:
            assert tracker.path == ""  # the always-called hooks popped both modules
    assert (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks)) == before
