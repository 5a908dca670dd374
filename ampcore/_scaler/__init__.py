"""The dynamic loss scaler: ``ampcore.GradScaler``.

* ``grad_scaler``: the public class (torch.amp's API plus Paddle's options).
* ``base``: the scale tensors and the settings' getters and setters.
* ``options``: validation of the constructor's options; ``paddle``: the methods of Paddle's
  scaler that torch's lacks.
* ``state``: state dicts (a superset of torch's format).
* ``kernels``: the device's fused unscale/update kernels, or a portable update.
* ``watch``: the warning when the scale collapses.
"""

__all__: list[str] = []
