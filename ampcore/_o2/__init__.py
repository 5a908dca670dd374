"""Level O2: ``ampcore.decorate`` — a low-precision model with fp32 master weights.

* ``decorate``: validate -> plan -> vendor offer -> convert -> install, one small function
  per step; ``decorate_checks``: the validation step; ``convert``: conversion and the
  installation of the master weights.
* ``model_plan``: which modules O2 converts and which stay in float32 (``fp32_modules``).
* ``master``: the fp32 master weights an optimizer steps; ``grad_modes``: how the masters
  get their gradients (a strategy chosen once); ``master_sgd`` and ``master_adam``:
  ampcore's own updates for momentum-free SGD and Adam/AdamW, on whole tensors or in
  chunks; ``update_walk``: which of the two, by the backend and by timing.
* ``checkpoint``: state dicts that resume exactly; ``fsdp``: FSDP2's refusal.
"""

__all__: list[str] = []
