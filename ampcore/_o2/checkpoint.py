"""Faithful checkpoints of an O2-decorated model.

``model.state_dict()`` gives, for every parameter that has an fp32 master, the master
itself (an alias, as torch's state dicts alias live parameters), and every other entry that
decorate converted in its original dtype, so the checkpoint looks like the undecorated
model's.  ``save_dtype`` casts every floating entry instead.  ``model.load_state_dict()``
copies the loaded values into the masters as well, so a resume continues from the exact
fp32 weights (apex#180 is what happens otherwise).  The optimizer's own state dict carries
the masters too (see ``_master.py``); loaded after the model, it wins.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import torch
from torch import nn

from .._errors import AmpcoreError
from .master import MasterPair, MasterWeights

__all__ = ["STATE_KEY", "DecoratedModel", "ModuleCheckpointHooks", "OptimizerCheckpointHooks", "decorated_model_of"]

_ATTR = "_ampcore_decorated"
#: The optimizer state-dict key holding the fp32 weights (Paddle's name).
STATE_KEY = "master_weights"


@dataclass(eq=False)
class DecoratedModel:
    """What ``ampcore.decorate`` did to one model; stored on it (marks it decorated)."""

    dtype: torch.dtype
    save_dtype: torch.dtype | None
    master_grad: bool
    #: low-precision model parameter -> its master (only parameters some optimizer updates)
    pairs: dict[nn.Parameter, MasterPair] = field(default_factory=dict)
    master_weights: list[MasterWeights] = field(default_factory=list)

    def attach(self, model: nn.Module) -> None:
        model.__dict__[_ATTR] = self


def decorated_model_of(model: object) -> DecoratedModel | None:
    """The record decorate left on ``model`` (a module), or None."""
    found = getattr(model, "__dict__", {}).get(_ATTR)
    return found if isinstance(found, DecoratedModel) else None


def _entries(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's own state-dict entries: parameters and persistent buffers."""
    for name, param in module._parameters.items():
        if param is not None:
            yield name, param
    for name, buf in module._buffers.items():
        if buf is not None and name not in module._non_persistent_buffers_set:
            yield name, buf


def _adopt_if_changed(pair: MasterPair) -> None:
    """Copy into the master a model parameter changed in place outside ampcore since
    ampcore last wrote it (``fill_``, ``nn.init``, DDP's broadcast), as the next optimizer
    step would: a state dict taken before that step must not hold the stale master."""
    if pair.model._version != pair.version:
        with torch.no_grad():
            pair.master.copy_(pair.model)
        pair.version = pair.model._version


class ModuleCheckpointHooks:
    """State-dict hooks of one submodule of a decorated model.

    Args:
        record: the decorated model's record.
        original: this module's converted entries (by local name) and their dtype before
            decorate.
    """

    def __init__(self, record: DecoratedModel, original: dict[str, torch.dtype]) -> None:
        self.record = record
        self.original = original

    def register(self, module: nn.Module) -> None:
        # torch tags the post hook with an attribute, which a bound method cannot take
        module.register_state_dict_post_hook(functools.partial(ModuleCheckpointHooks.save, self))
        module.register_load_state_dict_pre_hook(self.load_pre)
        module.register_load_state_dict_post_hook(self.load_post)

    def save(self, module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        save_dtype = self.record.save_dtype
        pairs = self.record.pairs
        for name, tensor in _entries(module):
            key = prefix + name
            value = state_dict.get(key)
            if value is None:
                continue
            live = value is tensor  # state_dict(keep_vars=True)
            pair = pairs.get(tensor) if isinstance(tensor, nn.Parameter) else None
            if pair is not None:
                _adopt_if_changed(pair)
                value = pair.master if live else pair.master.detach()
            target = save_dtype if save_dtype is not None else self.original.get(name)
            if target is not None and not live and value.is_floating_point() and value.dtype != target:
                value = value.to(target)
            state_dict[key] = value

    def load_pre(
        self,
        module: nn.Module,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        if local_metadata.get("assign_to_params_buffers"):
            raise AmpcoreError(
                f"{type(module).__name__}.load_state_dict(assign=True) on a model decorated by "
                "ampcore.decorate(level='O2'): assign would replace the parameters that the fp32 "
                "master weights and the optimizer are tied to; load with assign=False (the default)"
            )
        pairs = self.record.pairs
        with torch.no_grad():
            for name, param in module._parameters.items():
                pair = pairs.get(param) if param is not None else None
                value = state_dict.get(prefix + name)
                # a wrong shape is left to torch, which reports it and copies nothing
                if pair is not None and isinstance(value, torch.Tensor) and value.shape == pair.master.shape:
                    pair.master.copy_(value)

    def load_post(self, module: nn.Module, incompatible_keys: Any) -> None:
        # torch copied the loaded values into the low-precision parameters: that change is
        # ampcore's own, not one to adopt into the masters at the next step.
        pairs = self.record.pairs
        for param in module._parameters.values():
            pair = pairs.get(param) if param is not None else None
            if pair is not None:
                pair.version = pair.model._version


class OptimizerCheckpointHooks:
    """State-dict hooks of a decorated optimizer: ``"master_weights"`` (index -> fp32 tensor,
    indexed like ``state``) for every floating weight it updates, the masters and the
    parameters that stayed float32; loading it restores them and refreshes the model."""

    def __init__(self, weights: MasterWeights) -> None:
        self.weights = weights
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def register(self, optimizer: torch.optim.Optimizer) -> None:
        inner = optimizer.__dict__.get("load_state_dict")
        optimizer.load_state_dict = MethodType(_checked_load(inner), optimizer)  # type: ignore[method-assign]
        optimizer.register_state_dict_post_hook(self.save)
        optimizer.register_load_state_dict_pre_hook(self.load_pre)
        optimizer.register_load_state_dict_post_hook(self.load_post)

    def _indexed(self, packed_groups: Iterable[Mapping[str, Any]]) -> Iterator[tuple[int, torch.Tensor]]:
        """(index in the packed state dict, weight), in group order."""
        groups = self.weights.optimizer.param_groups
        for group, packed in zip(groups, packed_groups, strict=False):
            params: list[torch.Tensor] = dict.__getitem__(group, "params")  # no gradient sync
            for param, index in zip(params, packed["params"], strict=False):
                if param.is_floating_point():
                    yield index, param

    def save(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
        state_dict[STATE_KEY] = {index: weight.detach() for index, weight in self._indexed(state_dict["param_groups"])}

    def load_pre(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
        saved = state_dict.pop(STATE_KEY, None)
        if saved is not None and not isinstance(saved, Mapping):
            raise AmpcoreError(
                f"{type(optimizer).__name__}.load_state_dict(): {STATE_KEY!r} is a {type(saved).__name__} "
                f"({_short(saved)}); expected a dict of parameter index -> fp32 master weight tensor, as "
                "the decorated optimizer's state_dict() saves it; nothing was loaded"
            )
        pending = []
        for index, weight in self._indexed(state_dict.get("param_groups", ()) if saved is not None else ()):
            value = saved.get(index)  # type: ignore[union-attr]
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise AmpcoreError(
                    f"{type(optimizer).__name__}.load_state_dict(): master weight {index} is "
                    f"{_short(value)}; expected a floating tensor of shape {tuple(weight.shape)}; nothing was loaded"
                )
            if value.shape != weight.shape:
                raise AmpcoreError(
                    f"{type(optimizer).__name__}.load_state_dict(): master weight {index} has shape "
                    f"{tuple(value.shape)}, but the parameter it belongs to has shape {tuple(weight.shape)}; "
                    "nothing was loaded"
                )
            pending.append((weight, value))
        self._pending = pending  # applied once torch has accepted the rest of the dict
        return state_dict

    def load_post(self, optimizer: torch.optim.Optimizer) -> None:
        weights = self.weights
        weights.wrap_groups()  # load_state_dict rebuilt the groups as plain dicts
        pending, self._pending = self._pending, []
        if pending:
            with torch.no_grad():
                for weight, value in pending:
                    weight.copy_(value)
            weights.refresh()
        for pair in weights.pairs:
            pair.seen_grad = None
        weights.copies_held = False


def _short(value: object) -> str:
    """A value as an error message shows it: a tensor by dtype and shape, else a short repr."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _checked_load(inner: Callable[..., Any] | None) -> Callable[..., Any]:
    """``load_state_dict`` of a decorated optimizer: the dict's shape is checked first, so
    that a wrong object raises an AmpcoreError (torch's own checks raise KeyError or
    AttributeError) and nothing is loaded."""

    def load_state_dict(optimizer: torch.optim.Optimizer, state_dict: Any) -> None:
        _check_optimizer_state(optimizer, state_dict)
        if inner is not None:
            return inner(state_dict)  # type: ignore[no-any-return]
        return type(optimizer).load_state_dict(optimizer, state_dict)

    return load_state_dict


def _check_optimizer_state(optimizer: torch.optim.Optimizer, state_dict: object) -> None:
    where = f"{type(optimizer).__name__}.load_state_dict()"
    expected = (
        "expected the dict of the optimizer's state_dict() ({'state': ..., 'param_groups': [...]}); nothing was loaded"
    )
    if not isinstance(state_dict, Mapping):
        raise AmpcoreError(f"{where}: got {_short(state_dict)}; {expected}")
    missing = [key for key in ("state", "param_groups") if key not in state_dict]
    if missing:
        raise AmpcoreError(f"{where}: the dict lacks {missing}; {expected}")
    groups = state_dict["param_groups"]
    if not isinstance(state_dict["state"], Mapping) or not isinstance(groups, (list, tuple)):
        raise AmpcoreError(f"{where}: 'state' must be a dict and 'param_groups' a list; {expected}")
    ours = optimizer.param_groups
    sizes = [
        len(g["params"]) if isinstance(g, Mapping) and isinstance(g.get("params"), (list, tuple)) else None
        for g in groups
    ]
    own = [len(dict.__getitem__(g, "params")) for g in ours]
    if sizes != own:
        raise AmpcoreError(
            f"{where}: the saved param groups hold {sizes} parameters, this optimizer's {own}; load a "
            "state dict saved from the same model and optimizer setup; nothing was loaded"
        )
