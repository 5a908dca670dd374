"""The op policy engine: what dtype every op of an ``ampcore.autocast`` region runs in.

Read in this order:

* ``levels``: the AMP levels (O0, OD, O1, O2, auto).
* ``torch_tables``: torch's own autocast lists, as data, per device type.
* ``ampcore._op_names`` (shared with the backends' list adjustments, one layer down): op
  names users write (ATen, Paddle aliases) and the castable overloads.
* ``lists``: :class:`OpLists`, the lists of one region (a level, the backend's lists, the
  custom lists), and the per-overload *actions* they give.
* ``autocast``: the ``ampcore.autocast`` context manager; ``region``: ``active_region``;
  ``signature``: its arguments; ``entry``: entering a region the long way, and the plan
  that makes later entries short; ``torch_state``: torch's autocast flags a region enters.
* ``thread_state``: the per-thread region stack and policies.
* ``decisions``: the action table's entries (:func:`decisions.decide`, once per policy);
  ``kernels``: the Python executor of it; ``compiled`` + ``policy_kernel.cpp``: the C++
  executor of the same table;
  ``executor``: which one runs (``AMPCORE_POLICY_KERNEL``) and building the C++ one;
  ``registration``: where in the dispatcher the kernels are registered (per overload, when
  a policy first needs one; never removed) and the runtime :class:`OpPolicy`;
  ``device_kernels``: what a device's own autocast key holds; ``promotion``: the ops that
  reconcile mixed inputs themselves.
* ``key_tables``: a kernel key's device types and each call's route on it.
* ``casting``: how a kernel casts the arguments of one call.
* ``fused``, ``compile``, ``recompute``, ``custom_fwd``: fused kernels that swallow listed
  ops, torch.compile, activation checkpointing, custom autograd functions.

Three words that sound alike: a *cast policy* is torch's rule for one op in its own tables
(``lower_precision_fp``, ``fp32``...; :data:`torch_tables.CastPolicy`); an *action* is what
ampcore does with one op call (:class:`lists.Action`); an :class:`registration.OpPolicy` is
the runtime form of one region's lists, which the kernels read.  (Level O2's choice of which
modules stay in float32 is the *model plan*, in ``ampcore._o2``.)
"""

__all__: list[str] = []
