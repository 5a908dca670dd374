"""The dynamic loss scaler: ``ampcore.GradScaler``.

* ``grad_scaler``: the public class (torch.amp's API plus Paddle's options): the training
  loop ``scale`` / ``unscale_`` / ``step`` / ``update``.
* ``store``: what the scaler keeps between iterations, as one record (settings, scale,
  counters, the scale tensors).
* ``iteration``: the per-optimizer state machine of one iteration; ``unscaling``: how each
  kind of optimizer's gradients are unscaled and checked (plain, O2 deferred, fused).
* ``settings_api``: the getters, setters and state dicts; ``paddle``: the methods of
  Paddle's scaler that torch's lacks.
* ``options``: validation of the constructor's options and Paddle's option names;
  ``state``: state dicts (a superset of torch's format).
* ``kernels``: the device work (adapter hooks chosen at construction; torch's fused kernels
  or portable ones per device); ``new_scale``: ``update(new_scale=...)`` and
  ``raise_at_min_scale``; ``nest``: the walk of ``scale(outputs)``.
* ``watch``: the warning when the scale collapses.
"""

__all__: list[str] = []
