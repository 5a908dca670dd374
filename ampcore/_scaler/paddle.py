"""The methods of ``paddle.amp.GradScaler`` that torch's GradScaler lacks, on ampcore's scaler.

Paddle's getters and setters use Paddle's parameter names (``incr_ratio`` is ampcore's
``growth_factor``, and so on: :data:`ampcore._scaler.options.PADDLE_OPTION_NAMES`); each one
reads or writes the same setting as its torch-style twin, with the same validation.
``minimize`` is Paddle's ``step()`` + ``update()``.  :meth:`PaddleScalerMethods.paddle`
builds a scaler with Paddle's defaults (:data:`PADDLE_SCALER_DEFAULTS`, per Paddle version).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

import torch

from .._errors import AmpcoreError
from .options import PADDLE_OPTION_NAMES
from .settings_api import ScalerSettingsMethods
from .store import CALL

__all__ = ["CLOSURE_RULE", "PADDLE_SCALER_DEFAULTS", "PaddleScalerMethods", "check_no_closure", "paddle_defaults"]

Scaler = TypeVar("Scaler", bound="PaddleScalerMethods")

#: ``paddle.amp.GradScaler``'s defaults where they differ from ``ampcore.GradScaler``'s, by
#: the first Paddle version that has them (Paddle 2.0 to 2.4, the AMP guide's values, and
#: 2.5 or later).  Paddle has no upper bound on the scale (ampcore: ``max_scale=2**24``).
PADDLE_SCALER_DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = {
    "2.0": {"init_scale": 2.0**15, "growth_interval": 1000, "hysteresis": 2, "max_scale": None},
    "2.5": {"init_scale": 2.0**16, "growth_interval": 2000, "hysteresis": 1, "max_scale": None},
}

#: The one rule for closures, in every error that refuses one.
CLOSURE_RULE: Final = (
    "closures are not supported while the scaler is enabled, in any spelling (step(opt, closure=f), "
    "step(opt, f), minimize(opt, f)): the closure would compute new, unscaled gradients after the "
    "scaler checked the scaled ones. Compute the loss and call scaler.scale(loss).backward() before "
    "scaler.step(opt); with enabled=False, step() passes the closure to optimizer.step()"
)


def check_no_closure(call: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Raise :class:`AmpcoreError` if ``args``/``kwargs`` of an enabled scaler's ``call`` hold a closure."""
    if "closure" in kwargs or any(callable(arg) and not isinstance(arg, torch.Tensor) for arg in args):
        spelling = "closure=..." if "closure" in kwargs else "a callable argument"
        raise AmpcoreError(
            f"{CALL}.{call}(optimizer, {spelling}): Closure use is not currently supported if GradScaler "
            f"is enabled: {CLOSURE_RULE}"
        )


def paddle_defaults(version: str = "2.2") -> dict[str, Any]:
    """``paddle.amp.GradScaler``'s defaults (ampcore's names) in Paddle ``version``.

    Example::

        >>> from ampcore._scaler.paddle import paddle_defaults
        >>> paddle_defaults("2.2")["init_scale"], paddle_defaults("3.0")["growth_interval"]
        (32768.0, 2000)
    """
    parts = str(version).split(".") if isinstance(version, str) else []
    try:
        key = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    except (ValueError, IndexError):
        key = (0, 0)
    if key < (2, 0):
        raise AmpcoreError(
            f"{CALL}.paddle(version={version!r}): expected a Paddle version string from '2.0' on, such as "
            "'2.2' (the AMP guide's defaults: 32768, 1000, 2) or '2.5' and later (65536, 2000, 1)"
        )
    return dict(PADDLE_SCALER_DEFAULTS["2.0" if key < (2, 5) else "2.5"])


class PaddleScalerMethods(ScalerSettingsMethods):
    """Paddle's spelling of the scaler API (mixed into :class:`ampcore.GradScaler`).

    Example::

        >>> import torch, ampcore
        >>> scaler = ampcore.GradScaler("cpu", dtype="float16", init_loss_scaling=1024, incr_ratio=4.0)
        >>> scaler.is_enable(), scaler.is_use_dynamic_loss_scaling(), scaler.get_incr_ratio()
        (True, True, 4.0)
        >>> scaler.set_decr_every_n_nan_or_inf(2)
        >>> scaler.get_hysteresis()
        2
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> scaled = scaler.scale(model(torch.randn(8, 4)).pow(2).mean())
        >>> scaled.backward()
        >>> scaler.minimize(opt, scaled)  # step() + update(), as in Paddle
        >>> scaler.get_scale()
        1024.0
    """

    if TYPE_CHECKING:  # provided by GradScaler

        def __init__(self, device: Any = None, **options: Any) -> None: ...

        def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any: ...

        def update(self, new_scale: float | torch.Tensor | None = None) -> None: ...

    @classmethod
    def paddle(cls: type[Scaler], device: Any = None, *, version: str = "2.2", **options: Any) -> Scaler:
        """A scaler with ``paddle.amp.GradScaler``'s defaults of Paddle ``version``: the one
        switch for Paddle users (options given, under either name, win).

        ``"2.2"`` (default, Paddle 2.0 to 2.4 and the AMP guide): ``init_loss_scaling=2**15``,
        ``incr_every_n_steps=1000``, ``decr_every_n_nan_or_inf=2``; ``"2.5"`` or later:
        ``2**16``, ``2000``, ``1`` (ampcore's own defaults).  Both: no upper bound on the scale
        (``max_scale=None``; ampcore's default is ``2**24``).

        Example::

            >>> import ampcore
            >>> s = ampcore.GradScaler.paddle("cpu", dtype="float16", incr_ratio=4.0)
            >>> s.get_init_loss_scaling(), s.get_incr_every_n_steps(), s.get_decr_every_n_nan_or_inf()
            (32768.0, 1000, 2)
            >>> ampcore.GradScaler.paddle("cpu", dtype="float16", version="2.6").get_init_loss_scaling()
            65536.0
        """
        given = {PADDLE_OPTION_NAMES.get(name, name) for name in options}
        defaults = {name: value for name, value in paddle_defaults(version).items() if name not in given}
        return cls(device, **defaults, **options)

    def minimize(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        """Paddle's ``minimize``: :meth:`step` then :meth:`update`.

        Paddle passes the scaled loss on to its optimizer's ``minimize``; the gradients are
        already there after ``backward()``, so loss tensors given here are accepted and not
        needed.  A closure follows :meth:`step`'s rule (:data:`CLOSURE_RULE`): refused while
        the scaler is enabled, passed to ``optimizer.step`` when it is not.  Anything else raises.
        """
        closures = [arg for arg in args if callable(arg) and not isinstance(arg, torch.Tensor)]
        others = [type(arg).__name__ for arg in args if not isinstance(arg, torch.Tensor) and not callable(arg)]
        unknown = sorted(set(kwargs) - {"closure"})
        if others or unknown or len(closures) + ("closure" in kwargs) > 1:
            raise AmpcoreError(
                f"{CALL}.minimize(optimizer, *args): args may only be the (scaled) loss tensors Paddle passes "
                f"and at most one closure, got {', '.join(others + [f'{k}=' for k in unknown]) or 'two closures'}"
            )
        closure = closures[0] if closures else kwargs.get("closure")
        if closure is None:
            self.step(optimizer)
        else:
            if self._store.active:
                check_no_closure("minimize", (closure,), {})
            self.step(optimizer, closure=closure)
        self.update()

    def is_enable(self) -> bool:
        """Paddle's name of :meth:`is_enabled`: whether the loss is scaled."""
        return self.is_enabled()

    def get_enable(self) -> bool:
        """Paddle 2.2's name of :meth:`is_enabled`."""
        return self.is_enabled()

    def is_use_dynamic_loss_scaling(self) -> bool:
        """Whether the scale changes with overflows (``dynamic``, Paddle's ``use_dynamic_loss_scaling``)."""
        return self._store.options.dynamic

    def get_use_dynamic_loss_scaling(self) -> bool:
        """Paddle 2.2's name of :meth:`is_use_dynamic_loss_scaling`."""
        return self._store.options.dynamic

    def get_init_loss_scaling(self) -> float:
        """The initial scale (``init_scale``)."""
        return self._store.options.init_scale

    def set_init_loss_scaling(self, new_init_loss_scaling: float) -> None:
        """Set the initial scale and, as Paddle does, the current scale to it (a scaler that
        does not scale keeps scale 1).  Must lie within ``[min_scale, max_scale]``."""
        store = self._store
        store.reset_scale(store.options.with_values(f"{CALL}.set_init_loss_scaling", init_scale=new_init_loss_scaling))

    def get_incr_ratio(self) -> float:
        """Paddle's name of :meth:`get_growth_factor`."""
        return self.get_growth_factor()

    def set_incr_ratio(self, new_incr_ratio: float) -> None:
        """Paddle's name of :meth:`set_growth_factor` (> 1)."""
        self.set_growth_factor(new_incr_ratio)

    def get_decr_ratio(self) -> float:
        """Paddle's name of :meth:`get_backoff_factor`."""
        return self.get_backoff_factor()

    def set_decr_ratio(self, new_decr_ratio: float) -> None:
        """Paddle's name of :meth:`set_backoff_factor` (in (0, 1))."""
        self.set_backoff_factor(new_decr_ratio)

    def get_incr_every_n_steps(self) -> int:
        """Paddle's name of :meth:`get_growth_interval`."""
        return self.get_growth_interval()

    def set_incr_every_n_steps(self, new_incr_every_n_steps: int) -> None:
        """Paddle's name of :meth:`set_growth_interval` (>= 1)."""
        self.set_growth_interval(new_incr_every_n_steps)

    def get_decr_every_n_nan_or_inf(self) -> int:
        """Paddle's name of :meth:`get_hysteresis`."""
        return self.get_hysteresis()

    def set_decr_every_n_nan_or_inf(self, new_decr_every_n_nan_or_inf: int) -> None:
        """Paddle's name of :meth:`set_hysteresis` (>= 1)."""
        self.set_hysteresis(new_decr_every_n_nan_or_inf)
