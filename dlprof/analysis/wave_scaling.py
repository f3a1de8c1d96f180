"""Habitat's wave scaling: a kernel's time on one GPU predicted from its time on another.

    wave_scaled_ns(120_000, a100, v100, launch, intensity=0.25, precision=Precision.FP32)

Yu et al., "Habitat: A Runtime-Based Computational Performance Predictor for Deep Neural Network
Training" (USENIX ATC 2021). A kernel runs as waves of thread blocks; a memory-bound kernel's
waves take time in proportion to memory bandwidth, a compute-bound kernel's in proportion to the
clock and the number of SMs working at once. With gamma the kernel's memory-boundedness,

    t_target = t_origin x (BW_o / BW_t)^gamma x (clock_o / clock_t x SMs_o / SMs_t)^(1 - gamma)

and gamma follows the kernel's arithmetic intensity x against the target's ridge point R:
1 - x / (2R) below it, R / (2x) above (1 for pure traffic, 1/2 at the ridge, towards 0 far
above). A kernel whose grid fits in one wave on the origin (fewer blocks than its SMs hold at
once) does not fill the GPU, so neither bandwidth nor SM count scale it: it gets the clock ratio,
times the waves it needs on the target (more than one when the target holds fewer blocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlprof.hardware.devices import Device, Precision

MAX_BLOCKS_PER_SM = 32  # CUDA's limit of resident blocks per SM from compute capability 5.0 on


@dataclass(frozen=True)
class Launch:
    """A kernel's launch configuration, as the store's grid/block/registers/shared_memory hold it."""

    blocks: int  # thread blocks in the grid
    threads_per_block: int
    registers_per_thread: int = 0
    shared_memory_per_block: int = 0  # bytes


def gamma(intensity: float | None, ridge: float | None) -> float:
    """How memory-bound a kernel is, in [0, 1]: Habitat's rule over its intensity and the target's
    ridge point; 1 (all memory) when either is unknown."""
    if intensity is None or ridge is None or ridge <= 0 or not math.isfinite(intensity):
        return 1.0
    if intensity < ridge:
        return 1.0 - intensity / (2 * ridge)
    return ridge / (2 * intensity)


def blocks_per_sm(device: Device, launch: Launch) -> int:
    """Thread blocks one SM of ``device`` holds at once: the least that threads, registers and
    shared memory allow (at least one, as a kernel that launched at all fits)."""
    limits = [MAX_BLOCKS_PER_SM]
    if device.threads_per_sm and launch.threads_per_block:
        limits.append(device.threads_per_sm // launch.threads_per_block)
    if device.registers_per_sm and launch.registers_per_thread and launch.threads_per_block:
        limits.append(device.registers_per_sm // (launch.registers_per_thread * launch.threads_per_block))
    if device.shared_memory_per_sm and launch.shared_memory_per_block:
        limits.append(device.shared_memory_per_sm // launch.shared_memory_per_block)
    return max(1, min(limits))


def waves(device: Device, launch: Launch) -> int:
    """Waves of blocks the grid takes on ``device``."""
    return max(1, math.ceil(launch.blocks / (blocks_per_sm(device, launch) * max(device.sms, 1))))


def is_sub_wave(device: Device, launch: Launch) -> bool:
    """Whether the grid fits in one wave on ``device``: fewer blocks than its SMs hold at once."""
    return launch.blocks <= blocks_per_sm(device, launch) * device.sms


def wave_scaled_ns(time_ns: float, origin: Device, target: Device, launch: Launch,
                   intensity: float | None, precision: Precision = Precision.FP32) -> float:
    """A kernel's predicted time on ``target`` from its time on ``origin``.

    Args:
        time_ns: the kernel's measured time on ``origin``.
        origin: the device it ran on.
        target: the device to predict for.
        launch: its launch configuration.
        intensity: its FLOPs per byte (None: unknown, taken as memory-bound).
        precision: the format whose peak sets the target's ridge point.

    Returns:
        The predicted time in nanoseconds.
    """
    clock = origin.clock_hz / target.clock_hz
    if is_sub_wave(origin, launch):
        return time_ns * clock * waves(target, launch)
    g = gamma(intensity, target.ridge_point(precision))
    memory = origin.memory_bandwidth / target.memory_bandwidth
    compute = clock * origin.sms / target.sms
    return float(time_ns * memory**g * compute ** (1 - g))
