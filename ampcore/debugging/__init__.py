"""``ampcore.debugging``: find the op and the module where mixed precision goes wrong.

* :func:`collect_operator_stats` (and :func:`enable_operator_stats_collection` /
  :func:`disable_operator_stats_collection`): per-op call counts by output dtype.
* :class:`check_numerics`: stop at the first op whose output holds inf or nan, naming the
  op, the module and the inputs' dtypes and ranges.
* :func:`compare_accuracy`: run a batch in float32 and under AMP, rank the modules by
  relative error.
* :func:`auto_plan_table`: the costs and decisions of ``level="auto"`` per shape class.

All three see the ATen ops inside composite modules and work with any backend.  See
docs/debugging.md.

Example::

    >>> import torch, ampcore.debugging
    >>> with ampcore.debugging.collect_operator_stats() as stats:
    ...     _ = torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    >>> stats.counts["mm"]["fp32"]
    1
"""

from ._auto_table import auto_plan_table
from ._compare import AccuracyReport, AccuracyRow, compare_accuracy
from ._numerics import NumericsError, NumericsFinding, NumericsWarning, check_numerics
from ._op_stats import (
    OperatorStats,
    collect_operator_stats,
    disable_operator_stats_collection,
    enable_operator_stats_collection,
)
from ._summary import TensorSummary

__all__ = [
    "AccuracyReport",
    "AccuracyRow",
    "NumericsError",
    "NumericsFinding",
    "NumericsWarning",
    "OperatorStats",
    "TensorSummary",
    "auto_plan_table",
    "check_numerics",
    "collect_operator_stats",
    "compare_accuracy",
    "disable_operator_stats_collection",
    "enable_operator_stats_collection",
]
