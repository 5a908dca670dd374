"""Issue 27 (eleventh stop): a program's hooks leave nothing behind in a module's hook dicts.

At every root call a program that switches modules puts its two hooks on each of them as
entries of the modules' own hook dicts (:class:`ampcore._auto._program.Running`), and takes
them off at the end; a module whose dicts refuse that key is hooked through torch's public
registration instead.  Before, a module whose *forward*-hook dict refused the key kept the
program's pre-hook entry (put in first) after every root call, on top of the public hooks.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
import torch
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_programs import Net, _plan, _programs, _step

from ampcore._auto import _hooks, _program

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


def _no_hooks_left(net: torch.nn.Module) -> None:
    assert not _hooks.installed() and _program.local.run is None
    for m in net.modules():
        for hooks in (m._forward_pre_hooks, m._forward_hooks, m._forward_hooks_always_called):
            assert all(type(k) is int for k in hooks), (m, list(hooks))


def _settled_mixed(switched: int) -> tuple[Net, torch.Tensor, torch.Tensor]:
    net, x, y = Net(big=switched + 1, small=switched), torch.randn(4, 32), torch.randn(4, 8)
    _plan(net, x, y, big="low", small="fp32")
    for _ in range(3):
        _step(net, x, y)
    (program,) = _programs(net)
    assert not program.default_fp32 and len(program.switched) == switched
    return net, x, y


class _Refusing(OrderedDict[Any, Any]):
    """A hook dict that takes torch's handle ids only."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(key, int):
            raise TypeError("hook ids only")
        super().__setitem__(key, value)


@pytest.mark.parametrize("refusing", ["_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called"])
def test_a_module_whose_hook_dict_refuses_our_key_is_hooked_publicly_and_nothing_is_left(refusing: str) -> None:
    net, x, y = _settled_mixed(3)
    setattr(net.small[1], refusing, _Refusing())
    for _ in range(3):
        out = _step(net, x, y)
        assert net.seen["big.0"] == torch.bfloat16 and net.small_dtypes() == {torch.float32}
        _no_hooks_left(net)
        small = net.small[1]
        assert not small._forward_pre_hooks and not small._forward_hooks and not small._forward_hooks_always_called
    assert out[1].dtype == torch.float32
