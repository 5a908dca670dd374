"""The device module (``torch.<name>``): what torch and ampcore ask a device type."""

from __future__ import annotations

import torch

__all__ = ["DeviceModule"]


class DeviceModule:
    """``torch.<name>`` of the test device: one device, always available, host-synchronous.

    ``get_amp_supported_dtype`` is what ``torch.autocast(<name>)`` requires of a
    PrivateUse1 device.
    """

    def __init__(self, name: str, dtypes: list[torch.dtype]) -> None:
        self.name = name
        self.dtypes = dtypes

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        if index != 0:
            raise RuntimeError(f"{self.name} has one device (index 0); got {index}")

    def synchronize(self, device: object = None) -> None:
        """Nothing to wait for: every kernel runs on the host, synchronously."""

    def manual_seed(self, seed: int) -> None:
        """Random numbers come from the CPU generator (seeded by ``torch.manual_seed``)."""

    def manual_seed_all(self, seed: int) -> None:
        """See :meth:`manual_seed`."""

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return list(self.dtypes)
