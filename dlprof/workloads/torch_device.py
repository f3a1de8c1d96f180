"""Where a workload runs: the CPU, or the first CUDA device when there is one.

    device = torch_device(DeviceType.CUDA)   # ValueError in one line when there is no GPU
    synchronize(device)                      # before reading a clock after GPU work
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class DeviceType(StrEnum):
    """``--device-type``: the kind of device a workload runs on."""

    CPU = "cpu"
    CUDA = "cuda"


def torch_device(kind: DeviceType) -> torch.device:
    """The torch device for ``kind``.

    Raises:
        ValueError: CUDA was asked for and this PyTorch sees no CUDA device (the message says why).
    """
    import torch

    if kind is DeviceType.CUDA and not torch.cuda.is_available():
        built = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ValueError(f"--device-type cuda: no CUDA device is available (torch {torch.__version__}, {built})")
    return torch.device("cuda" if kind is DeviceType.CUDA else "cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a clock read after it counts it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_properties(device: torch.device) -> dict[str, object]:
    """A CUDA device's properties under the names Kineto records (``deviceProperties``), so the
    device table resolves it as it resolves a run's GPU; empty for the CPU."""
    import torch

    if device.type != "cuda":
        return {}
    found = torch.cuda.get_device_properties(device)
    return {"name": found.name, "computeMajor": found.major, "computeMinor": found.minor,
            "numSms": found.multi_processor_count, "totalGlobalMem": found.total_memory, "warpSize": 32}
