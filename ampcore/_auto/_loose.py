"""Numbers and strings in a root's signature: held by value, or by type once they change
between calls that give the same program (a step counter, a temperature, a tag, the file
names of a batch), and the sizes a planned call may take from the root's arguments
(:func:`explained`, :func:`follows`).

:func:`~._guard.signature` holds every ``int``, ``float`` and ``str`` argument by value: a
flag, a size or a name picks a path.  When two recordings of a root differ only in such
values and give the same program, :func:`loosen` records the pattern on the root and later
signatures hold those values by type.  (Strings since the eleventh sweep of issue 27: file
names in a batch dict made every call a new signature, recorded every call.)
"""

from __future__ import annotations

import sys
import types
from pathlib import PurePath
from typing import Any, Final

import torch
from torch import nn

__all__ = ["explained", "follows", "loosen", "plain_key", "plain_value"]

#: the attribute of a root module holding its loose patterns: len(signature) -> [(the
#: positions held by type, the loose signatures confirmed by two equal recordings)]
_LOOSE: Final = "_ampcore_auto_loose"


class _Any:
    """A loose value's place in a signature (no argument's value equals it)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "*"


_ANY: Final = _Any()
#: the kinds of value a signature may hold by type (never ``bool``: a flag picks a path)
_LOOSE_KINDS: Final = (int, float, str)


def _number(entry: Any) -> bool:
    """Whether a signature entry is a value :func:`loosen` may hold by type."""
    return type(entry) is tuple and len(entry) == 3 and entry[0] == "=" and entry[1] in _LOOSE_KINDS


def _loosened(sig: tuple[Any, ...], loose: dict[int, list[tuple[tuple[int, ...], set[Any]]]]) -> tuple[Any, ...]:
    """``sig`` with the numbers of a confirmed pattern held by type (else ``sig``)."""
    for positions, confirmed in loose.get(len(sig), ()):
        if all(_number(sig[i]) for i in positions):
            candidate = list(sig)
            for i in positions:
                candidate[i] = ("=", sig[i][1], _ANY)
            found = tuple(candidate)
            if found in confirmed:
                return found
    return sig


def loosen(root: nn.Module, sig: tuple[Any, ...], others: dict[tuple[Any, ...], Any], same: Any) -> Any:
    """The loose signature of ``sig`` when an earlier recording of ``root`` (``others``: its
    signatures and programs) differs from it only in the values of numbers and strings
    (``int``, ``float`` and ``str`` arguments, not ``bool``) and ``same(its program)`` holds:
    from then on :func:`signature` holds those values by type.  None: nothing to loosen.

    Example::

        >>> import torch
        >>> from ampcore._auto._guard import signature
        >>> net = torch.nn.Linear(2, 2)
        >>> a, b = signature((1,), {"t": 0.5}, net), signature((2,), {"t": 0.5}, net)
        >>> loose = loosen(net, b, {a: "P"}, lambda p: p == "P")
        >>> signature((7,), {"t": 0.5}, net) == loose, signature((7,), {"t": 0.9}, net) == loose
        (True, False)
    """
    numbers = [i for i, e in enumerate(sig) if _number(e)]
    if not numbers:
        return None
    for other_sig, other in list(others.items()):
        if len(other_sig) != len(sig) or other_sig == sig:
            continue
        differ = tuple(i for i, (a, b) in enumerate(zip(sig, other_sig, strict=True)) if a != b)
        if all(_number(sig[i]) and _number(other_sig[i]) and sig[i][1] is other_sig[i][1] for i in differ):
            if not same(other):
                continue
            loose = root.__dict__.setdefault(_LOOSE, {})
            patterns = loose.setdefault(len(sig), [])
            found = next((p for p in patterns if p[0] == differ), None)
            if found is None:
                found = (differ, set[Any]())
                patterns.append(found)
            if len(found[1]) > 64:  # bounded, as the programs are
                found[1].clear()
            key = list(sig)
            for i in differ:
                key[i] = ("=", sig[i][1], _ANY)
            found[1].add(tuple(key))
            return tuple(key)
    return None


#: the Python values a numpy scalar may give (``item()``) that a signature holds
_ITEMS: Final = (bool, int, float, complex, str, bytes)
#: immutable values without a ``__dict__`` a signature holds by value (a slice's ends: below)
_BY_VALUE: Final = (range, frozenset, PurePath, type(Ellipsis))
#: the values a set argument or a dict key may hold for the signature to hold it by value
_KEY_PARTS: Final = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device)
#: functions a signature holds by identity (a module's own: the same object every call)
_FUNCTIONS: Final = (types.FunctionType, types.BuiltinFunctionType)


def plain_key(key: Any) -> bool:
    """Whether a dict key (or a set's item) is a scalar or a tuple of scalars: held by value.

    Example::

        >>> plain_key("enc"), plain_key(("enc", 0)), plain_key((("a",),)), plain_key(torch.zeros(1))
        (True, True, False, False)
    """
    if isinstance(key, _KEY_PARTS):
        return True
    return type(key) is tuple and all(isinstance(k, _KEY_PARTS) for k in key)


def plain_value(value: Any, sig: list[Any]) -> bool | None:
    """Append the guard of a plain-data argument that has no ``__dict__`` to ``sig``: a numpy
    array by its shape and dtype, as a tensor (its values are data); a numpy scalar by its
    type and, as the Python number or string it holds, its value (held by type once it
    changes every call, as one: a ``numpy.float32`` temperature); a ``torch.Generator`` by
    its device (its state is data, as a tensor's values); a ``range``, ``frozenset``, path,
    ``...`` or ``slice`` of numbers by value, a ``set`` of scalars (or tuples of them) by
    value, a function defined at a module's level (``F.gelu``, not a lambda or closure, new
    every call) or a builtin by identity (twelfth sweep: each of these left the call call by
    call).  False: an array of objects, a numpy scalar of another kind (``datetime64``), a
    slice or set of other things: no guard.  None: none of these.

    Before issue 27's eleventh sweep such an argument could not be guarded: every call
    given one applied the plan call by call (1.24-1.28 x float32 where a settled call took
    1.07).

    Example::

        >>> import numpy as np
        >>> sig = []
        >>> plain_value(np.zeros((2, 3), np.float32), sig), plain_value(np.float32(0.5), sig), sig
        (True, True, [('ndarray', (2, 3), '<f4'), ('numpy', <class 'numpy.float32'>), ('=', <class 'float'>, 0.5)])
        >>> plain_value(np.array([object()]), []), plain_value(0.5, []), plain_value(slice(0, 4), sig)
        (False, None, True)
    """
    if isinstance(value, torch.Generator):
        sig.append(("generator", value.device))
        return True
    if isinstance(value, _BY_VALUE):
        sig.append(("=", type(value), value))
        return True
    if type(value) is set:  # (a set of layer names to skip: by value, as the frozenset it equals)
        if len(value) > 256 or not all(map(plain_key, value)):
            return False
        sig.append(("=", set, frozenset(value)))
        return True
    if isinstance(value, _FUNCTIONS) and "<" not in getattr(value, "__qualname__", "<"):  # not a lambda, a
        sig.append(("=", type(value), value))  # closure: F.gelu, a module's function, by identity
        return True
    if isinstance(value, slice):  # (hashable from Python 3.12 only)
        ends = (value.start, value.stop, value.step)
        if not all(e is None or type(e) is int for e in ends):
            return False
        sig.append(("slice", *ends))
        return True
    np = sys.modules.get("numpy")
    if np is None:
        return None
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return False
        sig.append(("ndarray", value.shape, value.dtype.str))
        return True
    if isinstance(value, np.generic):
        item = value.item()
        if type(item) not in _ITEMS:
            return False
        sig.append(("numpy", type(value)))
        sig.append(("=", type(item), item))
        return True
    return None


def explained(sig: tuple[Any, ...]) -> set[int]:
    """The sizes a planned call's input may have and still *follow* the root's arguments
    (``sig``): the tensors' dimensions, the products of two of them (``B * T``), each
    halved any number of times (strided convolutions, pooling), and 1; not the value of an
    ``int`` argument (a size given as a number may change while the signature holds it
    by type).

    Example::

        >>> import torch
        >>> from ampcore._auto._guard import signature
        >>> sorted(explained(signature((torch.zeros(8, 3), 4), None)))
        [1, 2, 3, 6, 8, 9, 12, 16, 24, 32, 64]
    """
    tensors = [e[-3] for e in sig[1:] if type(e) is tuple and e and isinstance(e[-2], torch.dtype)]
    dims = {d for shape in tensors for d in shape if type(d) is int}  # (a jagged size is none)
    dims.update([a * b for a in list(dims) for b in dims])
    halves = {d >> k for d in dims for k in range(1, max(d, 1).bit_length())}
    numbers = {e[2] for e in sig[1:] if _number(e) and e[1] is int}
    return (dims | halves) - numbers | {1}  # 1 always (a number 1, logits_to_keep=1, must not remove it)


def follows(module: nn.Module, dims: set[int], sizes: set[int]) -> bool:
    """Whether every dimension ``dims`` of ``module``'s tensor inputs is among ``sizes``
    (:func:`explained`) or a dimension of its own parameters (``in_features``, channels).
    False: the shape comes from elsewhere (data-dependent routing, a module attribute, a
    number argument), so the call's shape class may change while the root's signature
    does not: the program guards it per call.

    Example::

        >>> import torch
        >>> from ampcore._auto._guard import signature
        >>> sizes = explained(signature((torch.zeros(64, 16),), None))
        >>> follows(torch.nn.Linear(16, 4), {64, 16}, sizes), follows(torch.nn.Linear(16, 4), {37, 16}, sizes)
        (True, False)
    """
    own = {d for p in module.parameters(recurse=False) for d in p.shape}
    return dims <= sizes | own
