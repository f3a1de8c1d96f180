"""Whether this machine has an NVIDIA GPU, asked of the CUDA driver itself through ctypes.

    gpus = find_gpus()
    gpus.names, gpus.cuda_version        # ["NVIDIA H100 80GB HBM3"], 12080
    gpus.reason                          # "" or why there is none: "libcuda.so.1 not found ..."

Standard library only: this runs first, in whatever Python the machine has, before anything is
installed. ``cuInit`` starts the driver in this process but creates no context; the checks run
in child processes of their own.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

LIBRARY = "libcuda.so.1"
CUDA_SUCCESS = 0


@dataclass(frozen=True)
class Gpus:
    """The GPUs the driver sees, its CUDA version, or why there are none."""

    names: list[str] = field(default_factory=list)
    cuda_version: int = 0  # cuDriverGetVersion: 1000 * major + 10 * minor (12080 for 12.8)
    reason: str = ""  # why no GPU can be used; "" when there is one

    @property
    def cuda_major(self) -> int:
        return self.cuda_version // 1000

    @property
    def cuda_text(self) -> str:
        """The driver's CUDA version as people write it: "12.8"."""
        return f"{self.cuda_version // 1000}.{self.cuda_version % 1000 // 10}" if self.cuda_version else ""


def _error_name(cuda: Any, code: int) -> str:
    """The driver's name for an error code (CUDA_ERROR_NO_DEVICE), or the number."""
    text = ctypes.c_char_p()
    if cuda.cuGetErrorName(code, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
        return f"{text.value.decode()} ({code})"
    return f"error {code}"


def find_gpus(library: str = LIBRARY) -> Gpus:
    """Ask the CUDA driver for its devices; never raises.

    Args:
        library: the driver library to load (the tests name one that does not exist).
    """
    try:
        cuda = ctypes.CDLL(library)
    except OSError as error:
        return Gpus(reason=f"no NVIDIA driver: {error}")
    code = cuda.cuInit(0)
    if code != CUDA_SUCCESS:
        return Gpus(reason=f"the CUDA driver did not start: cuInit returned {_error_name(cuda, code)}")
    version = ctypes.c_int(0)
    cuda.cuDriverGetVersion(ctypes.byref(version))
    count = ctypes.c_int(0)
    code = cuda.cuDeviceGetCount(ctypes.byref(count))
    if code != CUDA_SUCCESS:
        return Gpus(cuda_version=version.value,
                    reason=f"cuDeviceGetCount returned {_error_name(cuda, code)}")
    if count.value == 0:
        return Gpus(cuda_version=version.value, reason="the CUDA driver sees no device")
    names = []
    for index in range(count.value):
        device = ctypes.c_int(0)
        buffer = ctypes.create_string_buffer(256)
        if (cuda.cuDeviceGet(ctypes.byref(device), index) == CUDA_SUCCESS
                and cuda.cuDeviceGetName(buffer, len(buffer), device) == CUDA_SUCCESS):
            names.append(buffer.value.decode(errors="replace"))
        else:
            names.append(f"device {index}")
    return Gpus(names=names, cuda_version=version.value)
