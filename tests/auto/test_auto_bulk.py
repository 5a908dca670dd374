"""Issue 27 (eleventh stop): a mixed program hooks its switched and guarded modules in C steps.

At every root call a program that switches modules puts its two hooks on each of them and
takes them off at the end (:class:`ampcore._auto._program.Running`): that work is done by
:mod:`ampcore._auto._bulk` (``map`` over the modules' hook dicts), so the Python bytecodes of
a root call's start and stop do not grow with the switched modules (before: about 35 per
module to hook it and 30 to unhook it).  A module whose dicts refuse our key is hooked
through torch's public registration, as before.  Counted in bytecodes, never timed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
import torch
from _auto_testing import auto_state, bytecodes  # noqa: F401 (fixture)
from test_auto_programs import Net, _plan, _programs, _step

from ampcore._auto import _hooks, _program

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py

#: bytecodes a settled root call switching 16 modules may run in the program's start and
#: stop beyond one switching 4 (before the eleventh stop: about 65 a module, 780)
PER_MORE_SWITCHED = 4
_COUNTED = frozenset({"start", "stop", "_hook", "_hook_all", "put", "drop", "live"})


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


def test_a_mixed_programs_start_and_stop_do_not_grow_with_its_switched_modules() -> None:
    counts = {}
    for switched in (1, 4, 8, 16):
        net, x, y = _settled_mixed(switched)
        counts[switched] = bytecodes(lambda: _step(net, x, y), _COUNTED)  # noqa: B023
        assert net.seen["big.0"] == torch.bfloat16 and net.small_dtypes() == {torch.float32}
        _no_hooks_left(net)
    assert counts[16] - counts[4] <= PER_MORE_SWITCHED, counts  # (before: about 65 a module)
    assert counts[4] < 4 * counts[1], counts


class _Refusing(OrderedDict[Any, Any]):
    """A hook dict that takes torch's handle ids only."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(key, int):
            raise TypeError("hook ids only")
        super().__setitem__(key, value)


def test_a_module_whose_hook_dict_refuses_our_key_is_hooked_publicly_and_nothing_is_left() -> None:
    net, x, y = _settled_mixed(3)
    net.small[1]._forward_hooks = _Refusing()  # type: ignore[assignment]
    for _ in range(3):
        out = _step(net, x, y)
        assert net.seen["big.0"] == torch.bfloat16 and net.small_dtypes() == {torch.float32}
        _no_hooks_left(net)
        assert not net.small[1]._forward_hooks and not net.small[0]._forward_pre_hooks
    assert out[1].dtype == torch.float32
