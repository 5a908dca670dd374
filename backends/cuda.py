"""CUDA adapter: float16 (default) and bfloat16 autocast on NVIDIA (and ROCm) GPUs.

fp16 autocast runs everywhere but only speeds up on Tensor Cores (compute capability 7.0
or higher): older GPUs get a warning.  bf16 needs native support (compute capability 8.0
or higher); torch's ``is_bf16_supported()`` says True on older GPUs by emulation, so the
check uses ``including_emulation=False`` and raises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ampcore import BackendSpec, CapabilityIssue, hookimpl

#: The adapter contract this plugin targets (ampcore.hookspec).
AMPCORE_CONTRACT = 2


@dataclass(frozen=True)
class CudaDeviceProperties:
    """What the capability check needs to know about one GPU (recordable, testable).

    ``bf16_native`` is ``torch.cuda.is_bf16_supported(including_emulation=False)`` when it
    was read, else ``None`` (then compute capability >= 8.0 decides).
    """

    name: str
    major: int
    minor: int
    bf16_native: bool | None = None
    is_rocm: bool = False

    @property
    def capability(self) -> str:
        return f"{self.major}.{self.minor}"


def cuda_capability_issues(props: CudaDeviceProperties, dtype: torch.dtype) -> list[CapabilityIssue]:
    """The findings for ``dtype`` on a GPU with ``props`` (a pure function).

    Example::

        >>> k40 = CudaDeviceProperties("Tesla K40m", 3, 5)
        >>> cuda_capability_issues(k40, torch.float16)[0].severity
        'warning'
        >>> cuda_capability_issues(k40, torch.bfloat16)[0].severity
        'error'
    """
    where = f"current GPU is {props.name} with compute capability {props.capability}"
    if dtype == torch.float16:
        if props.is_rocm or (props.major, props.minor) >= (7, 0):
            return []
        return [
            CapabilityIssue(
                "warning",
                f"AMP only supports NVIDIA GPUs with compute capability 7.0 or higher; {where}: expect no speed-up",
            )
        ]
    if dtype == torch.bfloat16:
        native = props.bf16_native
        if native is None:
            native = props.is_rocm or (props.major, props.minor) >= (8, 0)
        if native:
            return []
        return [
            CapabilityIssue(
                "error",
                f"bfloat16 autocast needs native bf16 support (compute capability 8.0 or higher); "
                f"{where}. Use dtype=torch.float16 on this GPU",
            )
        ]
    return []


def read_properties(device_index: int) -> CudaDeviceProperties:
    """Record the properties of GPU ``device_index`` (needs CUDA)."""
    props = torch.cuda.get_device_properties(device_index)
    with torch.cuda.device(device_index):
        try:
            bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch without the keyword
            bf16 = None
    return CudaDeviceProperties(props.name, props.major, props.minor, bf16, torch.version.hip is not None)


def unavailable_reason(
    torch_version: str, cuda_version: str | None, hip_version: str | None, is_available: bool
) -> str | None:
    """Why CUDA cannot run, from recorded facts (a pure function)."""
    if cuda_version is None and hip_version is None:
        return f"this torch build ({torch_version}) has no CUDA support"
    if not is_available:
        return "torch.cuda.is_available() is False: no CUDA device or driver found"
    return None


@hookimpl
def ampcore_backend() -> BackendSpec:
    # O2's master-weight updates on whole tensors: a few multi-tensor kernels per param group
    return BackendSpec(
        name="cuda",
        device_type="cuda",
        dtypes=[torch.float16, torch.bfloat16],
        priority=100,
        master_update_chunk_elements=None,
    )


@hookimpl
def ampcore_unavailable_reason() -> str | None:
    return unavailable_reason(torch.__version__, torch.version.cuda, torch.version.hip, torch.cuda.is_available())


@hookimpl
def ampcore_device_count() -> int:
    return torch.cuda.device_count()


@hookimpl
def ampcore_device_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


@hookimpl
def ampcore_check_capability(dtype: torch.dtype, device_index: int) -> list[CapabilityIssue]:
    return cuda_capability_issues(read_properties(device_index), dtype)
