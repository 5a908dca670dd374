"""ampcore: automatic mixed precision for PyTorch on every accelerator.

Example::

    >>> import torch, ampcore
    >>> with ampcore.autocast(device="cpu", dtype=torch.bfloat16):
    ...     torch.mm(torch.randn(4, 4), torch.randn(4, 4)).dtype
    torch.bfloat16
"""

from ._cli.launch import quiet_torch_numpy_warning as _quiet

_quiet()  # before torch is imported: the command line needs no NumPy
# ruff: noqa: E402  (the imports below must follow that call)

from . import debugging, hookspec, toolkit
from ._auto import AutoPlan, auto_plan, load_plan
from ._backends.backend import Backend
from ._backends.capability import CapabilityIssue
from ._backends.plugins import PluginInfo, PluginManager
from ._backends.registry import get_backend, list_backends, list_plugins, register_plugin, unregister_plugin
from ._backends.support import is_bfloat16_supported, is_float16_supported
from ._errors import AmpcoreError, AmpcoreWarning, BackendUnavailableError, PluginError, PluginWarning
from ._o2.decorate import decorate
from ._o2.fp32_modules import register_fp32_module, unregister_fp32_module
from ._o2.master_kernel import TritonKernelUnusedWarning, get_master_update_kernel, set_master_update_kernel
from ._o2.no_optimizer import NoMasterWeightsWarning
from ._policy.autocast import auto_cast, autocast
from ._policy.custom_fwd import custom_bwd, custom_fwd
from ._policy.fused import FusedKernelWarning
from ._policy.levels import LEVELS, Level
from ._policy.lists import OpLists, oplists
from ._policy.region import RegionInfo, active_region
from ._scaler.grad_scaler import GradScaler, LossScaleAtMinimumError
from ._scaler.watch import LossScaleCollapseWarning
from ._version import __version__
from .hookspec import BackendSpec, hookimpl

__all__ = [
    "LEVELS",
    "AmpcoreError",
    "AmpcoreWarning",
    "AutoPlan",
    "Backend",
    "BackendSpec",
    "BackendUnavailableError",
    "CapabilityIssue",
    "FusedKernelWarning",
    "GradScaler",
    "Level",
    "LossScaleAtMinimumError",
    "LossScaleCollapseWarning",
    "NoMasterWeightsWarning",
    "OpLists",
    "PluginError",
    "PluginInfo",
    "PluginManager",
    "PluginWarning",
    "RegionInfo",
    "TritonKernelUnusedWarning",
    "__version__",
    "active_region",
    "auto_cast",
    "auto_plan",
    "autocast",
    "custom_bwd",
    "custom_fwd",
    "debugging",
    "decorate",
    "get_backend",
    "get_master_update_kernel",
    "hookimpl",
    "hookspec",
    "is_bfloat16_supported",
    "is_float16_supported",
    "list_backends",
    "list_plugins",
    "load_plan",
    "oplists",
    "register_fp32_module",
    "register_plugin",
    "set_master_update_kernel",
    "toolkit",
    "unregister_fp32_module",
    "unregister_plugin",
]
