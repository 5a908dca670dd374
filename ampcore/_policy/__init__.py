"""The op policy engine: what dtype every op of an ``ampcore.autocast`` region runs in.

Read in this order:

* ``levels``: the AMP levels (O0, OD, O1, O2, auto).
* ``torch_tables``: torch's own autocast lists, as data, per device type.
* ``op_names``: op names users write (ATen, Paddle aliases) and the castable overloads.
* ``lists``: :class:`OpLists`, the lists of one region (a level, the backend's lists, the
  custom lists), and the per-overload *actions* they give.
* ``autocast``: the ``ampcore.autocast`` context manager; ``region``: ``active_region``.
* ``thread_state``: the per-thread region stack and policies.
* ``kernels``: the Python policy kernels; ``registration``: where in the dispatcher they are
  registered (once per process, never removed) and the runtime :class:`Policy`.
* ``fused``, ``compile``, ``recompute``, ``custom_fwd``: fused kernels that swallow listed
  ops, torch.compile, activation checkpointing, custom autograd functions.
"""

__all__: list[str] = []
