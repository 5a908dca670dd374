"""ampcore-example: a TEMPLATE backend plugin for ampcore, not a real device.

It drives the **CPU** under its own backend name ``example`` (bfloat16 only, its own
op-list choice, priority -10 so it never wins ``device=None``).  Copy it to start an
``ampcore-<vendor>`` distribution: see ``README.md`` and :mod:`ampcore_example.plugin`.
"""

__version__ = "0.1.0"
