"""What changed between adapter contract versions (re-exported by :mod:`ampcore.hookspec`).

Kept apart so that the contract module holds the hooks themselves; docs/migrating-contract-1.md
is the long form of these tables.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CONTRACT_CHANGES", "REMOVED_HOOKS"]

#: What changed in each contract version, for the load-time error (docs/plugins.md has more).
CONTRACT_CHANGES: Final = {
    2: "plugins declare AMPCORE_CONTRACT = 2; the five identity hooks (ampcore_backend_name, ...) merged "
    "into ampcore_backend (returning an ampcore.BackendSpec); the four memory hooks merged into "
    "ampcore_memory; ampcore_backend_overrides, ampcore_unscale_grads_ and ampcore_keep_norm_fp32 "
    "removed; no hook is firstresult",
}
#: Hooks of older contracts -> what a plugin does instead (named in the load-time error).
REMOVED_HOOKS: Final = {
    "ampcore_backend_name": "merged into ampcore_backend (BackendSpec.name) in contract 2",
    "ampcore_device_type": "merged into ampcore_backend (BackendSpec.device_type) in contract 2",
    "ampcore_supported_dtypes": "merged into ampcore_backend (BackendSpec.dtypes) in contract 2",
    "ampcore_default_dtype": "merged into ampcore_backend (BackendSpec.default_dtype) in contract 2",
    "ampcore_backend_priority": "merged into ampcore_backend (BackendSpec.priority) in contract 2",
    "ampcore_memory_in_use": "merged into ampcore_memory (its 'in_use' key) in contract 2",
    "ampcore_peak_memory": "merged into ampcore_memory (its 'peak' key) in contract 2",
    "ampcore_reset_peak_memory": "merged into ampcore_memory (called with reset_peak=True) in contract 2",
    "ampcore_device_memory": "merged into ampcore_memory (its 'total' key) in contract 2",
    "ampcore_backend_overrides": (
        "removed in contract 2: a plugin replaces the first-party adapter of its backend name without it; "
        "of two other plugins claiming one name, the user blocks one with AMPCORE_BLOCK_PLUGINS"
    ),
    "ampcore_unscale_grads_": "removed in contract 2: the scaler uses torch's fused kernel or its portable one",
    "ampcore_keep_norm_fp32": (
        "removed in contract 2: O2 keeps norms float32 for float16 only; decorate(keep_norm_fp32=...)"
    ),
}
