"""The guard of a root's program (:mod:`._program`): what a later call must share with the
recorded one to run its program, and what makes a program stale.

* :func:`signature`: grad mode, eval mode, every tensor's shape, dtype and device among the
  arguments (also in lists, tuples, dicts, dataclasses), the other arguments' values; an object
  of plain data (a KV cache) by type and state, its tensors by shape class; ``None`` for an
  argument it cannot see (a nested tensor: the plan then applies call by call);
* :func:`unseen_modules`: the root's planned modules the recording did not see called
  (another path of its control flow): the program guards them;
* :func:`snapshot` / :func:`unchanged`: the root's module tree (also layers kept in plain
  lists, tuples and dicts of its modules) and its planned layers' weight dtypes when
  recorded, compared on every root call with C calls only;
* :func:`loosen`: a number or string argument whose value changes every call (a step
  counter, a file name) but whose recordings give the same program is held by type then;
* :func:`follows` / :func:`in_checkpoint`: at recording, a planned call whose input shapes
  do not follow from the root's arguments (guarded per call), and a call inside
  ``torch.utils.checkpoint`` (it follows the autocast state, as its recompute does).
"""

from __future__ import annotations

import dataclasses
import operator
import sys
from typing import Any, Final

import torch
from torch import nn

from ._containers import CONTAINERS, candidates
from ._loose import _LOOSE, _loosened, plain_key, plain_value
from ._settings import Settings
from ._shapes import bucket, float32_weights, planned_ops

__all__ = [
    "Weight",
    "holds_objects",
    "in_checkpoint",
    "in_transform",
    "low_held",
    "signature",
    "snapshot",
    "unchanged",
    "unseen_modules",
]

_F32: Final = torch.float32
#: torch.func's interpreter stack (vmap, grad, jacrev, functionalize): None where no transform runs
_interpreters: Final = torch._C._functorch.peek_interpreter_stack
_grad_enabled: Final = torch.is_grad_enabled
_Tensor: Final = torch.Tensor
#: the signature's mark of a call inside a torch.func transform (an entry of a scalar's form)
_IN_TRANSFORM: Final = ("=", str, "torch.func")
_IN_CHECKPOINT: Final = ("=", str, "torch.utils.checkpoint")  # (its planned calls follow the autocast state)
_saved_hooks: Final = torch._C._autograd._top_saved_tensors_default_hooks  # (checkpoint's pack hook on top)


def signature(
    args: tuple[Any, ...], kwargs: dict[str, Any] | None, root: nn.Module | None = None
) -> tuple[Any, ...] | None:
    """The guard of a root's program: grad mode, whether a ``torch.func`` transform or
    ``torch.utils.checkpoint`` runs, then (shape, dtype, device) of every tensor among the
    call's positional and keyword arguments, also inside lists, tuples, dicts and dataclasses,
    and the other arguments' values (``None``, numbers, strings, dtypes, devices: a flag that
    picks a path or a size is part of the guard), and ``"eval"`` when ``root`` is not training.
    An object that holds plain data (:func:`_state`: a ``transformers`` ``DynamicCache``, lists
    of layers holding key and value tensors) is held by its type, its attributes' names and
    values, and its tensors' dtypes, devices and shape classes (every dimension rounded up to a
    power of two, as the plan's shape classes: a cache that grows one token a step keeps its
    signature within a bucket).  ``None``: an argument of another kind (a callable, an object
    without a ``__dict__`` or holding more than :data:`_HELD_MAX` entries), or a ``root`` whose
    last forward pre-hook is the user's (it runs after the signature is taken): the call cannot
    have a program and the plan applies call by call.

    Example::

        >>> import torch
        >>> sig = signature((torch.zeros(2, 3), None), {"flag": True})
        >>> sig[1], sig[2][2], sig[3:]
        ((torch.Size([2, 3]), torch.float32, device(type='cpu')), None, (('kw', 'flag'), ('=', <class 'bool'>, True)))
        >>> signature((object(),), None) is None
        True
        >>> class Cache:
        ...     def __init__(self, n): self.keys = [torch.zeros(1, 2, n, 4)]
        >>> signature((Cache(9),), None) == signature((Cache(16),), None) != signature((Cache(17),), None)
        True
    """
    sig: list[Any] = [_grad_enabled()]
    if _interpreters() is not None:  # inside vmap / grad: programs of their own (see in_transform)
        sig.append(_IN_TRANSFORM)
    if (top := _saved_hooks(False)) is not None and getattr(top[0], "__module__", None) == _CHECKPOINT:
        sig.append(_IN_CHECKPOINT)  # (non-reentrant; no Python call) its program is not one for outside, nor reverse
    for a in args:
        if isinstance(a, _Tensor) and not a.is_nested:  # (a nested one: _describe refuses it)
            sig.append((a.shape, a.dtype, a.device))
        elif not _describe(a, sig):
            return None
    for k, v in kwargs.items() if kwargs else ():
        if isinstance(v, _Tensor) and not v.is_nested:
            sig.append((k, v.shape, v.dtype, v.device))
        else:
            sig.append(("kw", k))
            if not _describe(v, sig):
                return None
    if root is not None:
        if root._forward_pre_hooks and _user_pre_hooks(root):
            return None  # it may change the arguments after the sentinel took them: call by call
        if not root.training:
            sig.append("eval")
        loose = root.__dict__.get(_LOOSE)  # numbers held by type (see loosen)
        if loose is not None:
            return _loosened(tuple(sig), loose)
    return tuple(sig)


def _user_pre_hooks(root: nn.Module) -> bool:
    """Whether ``root``'s last forward pre-hook is the user's, not the sentinel of
    :mod:`._roots` (which a root with pre-hooks of its own has as its last one): torch runs
    a module's own pre-hooks after the global ones and in order, so such a hook runs after
    the sentinel took the signature, and it may change the arguments on some steps by state
    of its own (cast them, change the batch): a program for the arguments before it then
    ran stale (a float32 default given bfloat16 inputs raised ``mat1 and mat2 must have the
    same dtype``)."""
    pre = root._forward_pre_hooks
    return getattr(pre[next(reversed(pre))], "__module__", None) not in _ROOTS


_ROOTS: Final = ("ampcore._auto._roots", "ampcore._auto._root_hooks")  # (the public pre-hook: _root_hooks)

#: arguments the guard holds by value (hashable, immutable)
_SCALARS: Final = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _describe(value: Any, sig: list[Any], held: list[int] | None = None) -> bool:
    """Append what the guard needs of a non-tensor argument to ``sig`` (False: it cannot be
    guarded); ``held``: inside an object (:func:`_state`), the entries it may still read.
    Entries other than tensors' never hold a dtype second from the end."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:  # jagged sizes are new symbols every call; a strided one has none
            return False
        if held is None:
            sig.append((value.shape, value.dtype, value.device))
        else:  # a cache's tensor: by shape class (a length that grows every call)
            shape = value.shape
            rounded = _ROUNDED.get(shape)
            if rounded is None:
                if len(_ROUNDED) > 4096:  # dynamic shapes: keep the memo bounded
                    _ROUNDED.clear()
                rounded = _ROUNDED[shape] = tuple(bucket(d) for d in shape)
            sig.append((_HELD, value.dtype, value.device, rounded))
    elif isinstance(value, _SCALARS):
        sig.append(("=", type(value), value))
    elif isinstance(value, (list, tuple)):
        if held is not None and _spend(held, len(value)):
            return False
        sig.append(("(", type(value), len(value)))
        return all(_describe(v, sig, held) for v in value)
    elif isinstance(value, dict):
        if held is not None and _spend(held, len(value)):
            return False
        sig.append(("{", type(value), len(value)))
        for k, v in value.items():
            if not plain_key(k):  # (a scalar or a tuple of scalars)
                return False
            sig.append(("key", type(k), k))
            if not _describe(v, sig, held):
                return False
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        sig.append(("dataclass", type(value), len(fields)))
        return all(_describe(getattr(value, f.name), sig, held) for f in fields)
    else:  # (numpy values, a generator, a path, a slice: ._loose.plain_value)
        return _state(value, sig, held) if (found := plain_value(value, sig)) is None else found
    return True


#: the mark of a tensor held by an object argument in a signature: (mark, dtype, device,
#: dimensions rounded up to powers of two); never a dtype second from the end, so
#: :func:`explained` does not count its sizes (they are not exact)
_HELD: Final = "held"
#: shape -> its dimensions rounded up to powers of two (held tensors' shapes recur every step)
_ROUNDED: dict[torch.Size, tuple[int, ...]] = {}
#: entries (attributes, list and dict items) the guard reads of one object argument at most
_HELD_MAX: Final = 256


def _spend(held: list[int], n: int) -> bool:
    """Take ``n`` entries from ``held``; True: the object holds more than the guard reads."""
    held[0] -= n
    return held[0] < 0


def _state(value: Any, sig: list[Any], held: list[int] | None) -> bool:
    """Append an object argument's type, attribute names and attributes (tensors by shape
    class) to ``sig``: a cache object holding lists of tensors (``transformers``'
    ``DynamicCache``: layers of keys and values that grow every decoding step) is guarded
    by what it holds when the call enters (the forward may grow it); a class it holds, by
    identity (``DynamicCache()``'s kind of layer).  False: a callable (a function, a
    module; a class given as an argument itself), an object without a ``__dict__`` (slots, C types) or
    holding another kind of value, or more than :data:`_HELD_MAX` entries in all."""
    if isinstance(value, type) and held is not None:  # a class an object holds (the kind of layer a cache adds)
        sig.append(("=", type, value))
        return True
    if callable(value):
        return False
    try:
        state = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return False
    if type(state) is not dict:
        return False
    if held is None:
        held = [_HELD_MAX]
    if _spend(held, len(state) + 1):
        return False
    sig.append(("object", type(value), tuple(state)))
    for v in state.values():  # the common values inline (a cache's every step: one call less each)
        if isinstance(v, _SCALARS):
            sig.append(("=", type(v), v))
        elif not _describe(v, sig, held):
            return False
    return True


def holds_objects(sig: tuple[Any, ...]) -> bool:
    """Whether a signature holds an object argument's state (:func:`_state`): one taken after
    the call (a new root's first call, whose keyword arguments only its end sees) may show
    what the forward made of it (a cache grown by a token), not what the call was given."""
    return any(type(e) is tuple and len(e) == 3 and e[0] == "object" for e in sig[1:])


def low_held(sig: tuple[Any, ...]) -> bool:
    """Whether a signature holds a low-precision tensor inside an object argument (a cache
    of bfloat16 keys: a float32 root would mix it with its float32 ones)."""
    return any(type(e) is tuple and len(e) == 4 and e[0] == _HELD and e[1] in _LOW for e in sig[1:])


_LOW: Final = (torch.bfloat16, torch.float16)


_CHECKPOINT: Final = "torch.utils.checkpoint"


def in_checkpoint() -> bool:
    """Whether the calling code runs inside ``torch.utils.checkpoint``'s forward: its pack
    hook on top of the saved-tensor hooks (``use_reentrant=False``), or grad mode off with
    ``CheckpointFunction.forward`` among the callers (``use_reentrant=True``).  Its recompute
    in backward runs with the autocast state of the checkpoint's entry and no module hooks,
    so a planned module in there must follow that state (else the recomputed tensors have
    other dtypes than the forward's: ``CheckpointError``, or other gradients)."""
    hooks = _saved_hooks(False)
    if hooks is not None and getattr(hooks[0], "__module__", None) == _CHECKPOINT:
        return True
    if torch.is_grad_enabled():
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "forward" and frame.f_globals.get("__name__") == _CHECKPOINT:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def in_transform() -> bool:
    """Whether the calling code runs inside a ``torch.func`` transform (``vmap``, ``grad``,
    ``jacrev``, ...): its tensors are wrapped (batched, tracked by the transform), so a call
    cannot be timed there (``requires_grad_`` on them raises); its classes wait for a call
    outside one, running with the O1 lists meanwhile.  A root's call inside one has its
    own signature (:func:`signature`): a program recorded there, with classes it could not
    measure, must not serve the same shapes outside (they would never be measured), and
    torch.autocast does not act on ``vmap``'s batched CPU calls."""
    return _interpreters() is not None


def _plain(
    root: nn.Module, known: list[nn.Module] | None = None
) -> tuple[list[nn.Module], list[tuple[dict[str, Any] | None, str, Any, tuple[Any, ...]]]]:
    """The modules of ``root`` (``known``: ``root.modules()``, walked already), also those kept
    in plain lists, tuples and dicts of its modules' attributes (not registered: not in
    ``root.modules()``; :func:`~._containers.candidates`), and those containers: (the owner's
    ``__dict__``, the attribute, the container, its values now)."""
    found: dict[int, nn.Module] = {}
    containers: list[tuple[dict[str, Any] | None, str, Any, tuple[Any, ...]]] = []
    todo: list[Any] = [root.modules() if known is None else known]
    while todo:
        for m in todo.pop():
            if id(m) in found:
                continue
            found[id(m)] = m
            for name, value in candidates(m):
                nested: list[Any] = []
                layers = _layers(value, 3, nested)
                if layers:
                    containers.append((m.__dict__, name, value, _values(value)))
                    containers += [(None, "", c, _values(c)) for c in nested]  # held by the one above
                    todo.extend(layer.modules() for layer in layers)
    return list(found.values()), containers


def _values(container: Any) -> tuple[Any, ...]:
    return tuple(container.values()) if isinstance(container, dict) else tuple(container)


def _layers(container: Any, depth: int, nested: list[Any]) -> list[nn.Module]:
    """The modules in ``container`` and in the containers it holds, ``depth`` levels down
    (those holding modules are added to ``nested``)."""
    found: list[nn.Module] = []
    for value in _values(container):
        if isinstance(value, nn.Module):
            found.append(value)
        elif depth > 1 and isinstance(value, CONTAINERS):
            more = _layers(value, depth - 1, nested)
            if more:
                nested.append(value)
                found += more
    return found


def unseen_modules(root: nn.Module, calls: dict[int, Any]) -> list[nn.Module]:
    """The planned modules of ``root`` (also in plain containers) not in ``calls`` (none
    inside another planned module: ``MultiheadAttention`` runs its ``out_proj`` functionally)."""
    planned = [m for m in _plain(root)[0] if planned_ops(m) is not None]
    inside = {id(c) for m in planned for c in m.modules() if c is not m}
    return [m for m in planned if id(m) not in calls and id(m) not in inside]


_Containers = tuple[tuple[dict[str, Any] | None, str, Any, tuple[Any, ...]], ...]


#: a planned module's first floating-point parameter: the dict that holds it, its name, itself
Weight = tuple[dict[str, Any], str, torch.Tensor]


def _first_weight(module: nn.Module) -> Weight | None:
    for owner in module.modules():  # the order of module.parameters()
        for name, p in owner._parameters.items():
            if p is not None and p.is_floating_point():
                return owner._parameters, name, p
    return None


def snapshot(
    root: nn.Module, planned: list[nn.Module], known: list[nn.Module] | None = None
) -> tuple[tuple[dict[str, Any], ...], list[tuple[Any, ...]], tuple[Weight, ...], _Containers]:
    """The ``_modules`` dicts of ``root``'s modules that have children, their values now, the
    first floating-point parameter of each ``planned`` module whose weights are float32 (with
    the dict that holds it), and the plain containers holding layers (:func:`_plain`;
    ``known``: ``root.modules()``, walked already)."""
    modules, containers = _plain(root, known)
    tree = tuple(d for m in modules if (d := m._modules))
    firsts = (_first_weight(m) for m in planned if float32_weights(m))
    weights = tuple(w for w in firsts if w is not None)  # one a module: a conversion converts them all
    # (each its own ``values``: a ``torch.jit.script``-ed module's is torch's ``OrderedModuleDict``)
    return tree, [tuple(d.values()) for d in tree], weights, tuple(containers)


def unchanged(
    tree: tuple[dict[str, Any], ...],
    values: list[tuple[Any, ...]],
    weights: tuple[Weight, ...],
    containers: _Containers = (),
) -> bool:
    """Whether :func:`snapshot`'s modules are still in place and its weights still float32
    (``module.to()`` converts them; ``load_state_dict(..., assign=True)`` and
    ``torch.func.functional_call`` replace them: :func:`_float32_values`) (it runs on every
    root call: plain loops, which cost less than ``map`` chains for the few dicts and
    weights of a model, and stop at the first change; plain containers only where the root
    has any)."""
    for params, name, weight in weights:
        if params.get(name) is not weight:  # replaced: only a float32 replacement keeps the program
            if not _float32_values(params, name):
                return False
        elif weight.dtype is not _F32:  # dtypes are singletons
            return False
    for modules, was in zip(tree, values, strict=True):
        if tuple(modules.values()) != was:
            return False
    if containers and not all(_same_container(*c) for c in containers):
        return False
    return True


def _float32_values(params: dict[str, Any], name: str) -> bool:
    """Whether the weight ``name`` of a planned layer, replaced since the recording, and the
    other floating-point tensors of its dict are float32: ``torch.func.functional_call``
    swaps tensors in for a call (new ones each step: fast weights), ``load_state_dict(...,
    assign=True)`` in float32; the program holds for them (a replacement in another dtype
    records again).  Before, any other tensor recorded the call again: every step."""
    if not isinstance(params.get(name), torch.Tensor):
        return False
    return all(v is None or not v.is_floating_point() or v.dtype is _F32 for v in params.values())


def _same_container(owner: dict[str, Any] | None, name: str, container: Any, values: tuple[Any, ...]) -> bool:
    if owner is not None and owner.get(name) is not container:
        return False
    if type(container) is Settings:  # the modules' watched settings (._settings), by value
        return container.same(values)
    now = _values(container)
    return len(now) == len(values) and all(map(operator.is_, now, values))
