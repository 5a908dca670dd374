"""Issue 27, sixteenth stop: config containers and fields the fifteenth stop left unwatched.

The settings of :mod:`ampcore._auto._settings` were read from ``__dict__``s only, and at
most 64 a config object: a config class with ``__slots__`` (``dataclass(slots=True)``, an
``attrs``-like class, a ``NamedTuple`` replaced with ``_replace``) was not watched, nor a
field past a wide config's 64th (a ``transformers`` config holds about a hundred, private
ones included).  Each case here settles on a float32 verdict (small), changes the field
(low), then changes it back and forth: each value's program, no recording
(:func:`test_auto_settings2.changed_and_back`).

Timings are injected (fake clocks, :class:`test_auto_leftovers._Clock`): the tests count
recordings and measurements and check numerics, never the wall clock.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from _auto_testing import auto_state  # noqa: F401 (fixture)
from test_auto_leftovers import recordings as recordings  # noqa: F401, PLC0414 (fixture)
from test_auto_settings2 import _Depthed, changed_and_back
from torch import nn

pytestmark = pytest.mark.usefixtures("auto_state")  # tests/auto/_auto_testing.py


@dataclasses.dataclass(slots=True)
class _SlotsCfg:
    heads: int = 1
    dropout: float = 0.0


@dataclasses.dataclass(slots=True, frozen=True)
class _FrozenSlotsCfg:
    heads: int = 1
    name: str = "f"


@dataclasses.dataclass(frozen=True)
class _FrozenCfg:
    heads: int = 1
    name: str = "f"


class _Tuple(NamedTuple):
    heads: int = 1
    dropout: float = 0.0


class _AttrsBase:
    """An ``attrs``-like class (``@attrs.define``: slots, a ``__weakref__`` slot), its
    fields in a base and a subclass."""

    __slots__ = ("__weakref__", "dropout")

    def __init__(self) -> None:
        self.dropout = 0.0


class _AttrsCfg(_AttrsBase):
    __slots__ = ("heads",)

    def __init__(self) -> None:
        super().__init__()
        self.heads = 1


class _Held(_Depthed):
    """``self.cfg.heads`` of a config object ``cfg`` (made by ``make``) changed by ``change``."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg

    def configure(self, large: bool) -> None:
        self.cfg.heads = 6 if large else 1

    def depth(self) -> int:
        return self.cfg.heads  # type: ignore[no-any-return]


class _Replaced(_Held):
    """The config object replaced (immutable: ``dataclasses.replace``, ``_replace``)."""

    def configure(self, large: bool) -> None:
        cfg = self.cfg
        heads = 6 if large else 1
        self.cfg = cfg._replace(heads=heads) if isinstance(cfg, tuple) else dataclasses.replace(cfg, heads=heads)


class _SlotsOuter(_Depthed):
    """``self.cfg.attn.heads``: a ``SimpleNamespace`` held by a slotted config, replaced."""

    class Cfg:
        __slots__ = ("attn", "name")

        def __init__(self) -> None:
            self.attn, self.name = SimpleNamespace(heads=1), "outer"

    def __init__(self) -> None:
        super().__init__()
        self.cfg = self.Cfg()

    def configure(self, large: bool) -> None:
        self.cfg.attn = SimpleNamespace(heads=6 if large else 1)

    def depth(self) -> int:
        return self.cfg.attn.heads  # type: ignore[no-any-return]


class _WideDict(_Depthed):
    """A dict of 100 options; the forward reads the 90th (``opts["k90"]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.opts = {f"k{i:02d}": 0 for i in range(100)}
        self.opts["k90"] = 1

    def configure(self, large: bool) -> None:
        self.opts["k90"] = 6 if large else 1

    def depth(self) -> int:
        return self.opts["k90"]


def _read_heads(module: nn.Module) -> int:
    """A helper of the module's file (as ``transformers``' ``eager_attention_forward``)."""
    return module.cfg.num_heads_last  # type: ignore[no-any-return, union-attr]


class _WideHelper(_Depthed):
    """A ``transformers``-like config of 120 fields (private ones among them); a helper
    function, not the forward, reads the last one."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(**{f"option_{i}": i for i in range(60)}, **{f"_private_{i}": i for i in range(59)})
        self.cfg.num_heads_last = 1

    def configure(self, large: bool) -> None:
        self.cfg.num_heads_last = 6 if large else 1

    def depth(self) -> int:
        return _read_heads(self)


class _WideProperty(_Depthed):
    """A wide config whose field is a property over a private field past the 64th."""

    class Cfg:
        def __init__(self) -> None:
            for i in range(80):
                setattr(self, f"f{i:02d}", i)
            self._heads_value = 1

        @property
        def heads(self) -> int:
            return self._heads_value

    def __init__(self) -> None:
        super().__init__()
        self.cfg = self.Cfg()

    def configure(self, large: bool) -> None:
        self.cfg._heads_value = 6 if large else 1

    def depth(self) -> int:
        return self.cfg.heads


class _AfterWide(_Depthed):
    """The module's own setting (``self.layers``) after a config of 70 fields: the fields
    counted against the module's attributes left it out."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(**{f"option_{i}": i for i in range(70)})
        self.layers = 1

    def configure(self, large: bool) -> None:
        self.layers = 6 if large else 1

    def depth(self) -> int:
        return self.layers


_CASES: dict[str, Any] = {
    "dataclass-slots": lambda: _Held(_SlotsCfg()),
    "dataclass-slots-frozen-replaced": lambda: _Replaced(_FrozenSlotsCfg()),
    "dataclass-frozen-replaced": lambda: _Replaced(_FrozenCfg()),
    "namedtuple-replaced": lambda: _Replaced(_Tuple()),
    "attrs-like-slots-in-base-and-subclass": lambda: _Held(_AttrsCfg()),
    "namespace-in-a-slotted-config-replaced": _SlotsOuter,
    "wide-dict-of-options": _WideDict,
    "wide-config-read-by-a-helper": _WideHelper,
    "wide-config-property-over-a-private-field": _WideProperty,
    "module-setting-after-a-wide-config": _AfterWide,
}


@pytest.mark.parametrize("kind", list(_CASES))
def test_a_config_container_or_wide_config_field_is_checked_and_changed_back(
    kind: str, monkeypatch: pytest.MonkeyPatch, recordings: list[Any]
) -> None:
    """As test_auto_settings2's config cases (settled float32, the field changed: checked
    for it, low; changed back and forth: each value's program, no recording)."""
    changed_and_back(_CASES[kind], monkeypatch, recordings)


def test_a_namedtuple_setting_is_not_a_tuple_of_values() -> None:
    """A ``NamedTuple`` config is read field by field (a plain tuple is one setting)."""
    from ampcore._auto._settings import settings

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cfg, self.sizes = _Tuple(heads=3), (1, 2)

    assert settings(Holder()) == [("cfg.heads", 3), ("cfg.dropout", 0.0), ("sizes", (1, 2))]
