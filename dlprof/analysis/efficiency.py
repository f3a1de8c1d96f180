"""Efficiency (roof time / measured time) per op class, math mode and decade of FLOPs.

    buckets = efficiency_buckets(measurements, device)     # from dlprof calibrate's timings
    measured = MeasuredEfficiencies(read_calibrations(calibration_path()))
    measured.efficiency(device, MathMode(Precision.FP32, False), OpClass.GEMM, 2e9)   # 0.83, or None

A kernel's efficiency is how close it came to its roof: min(peak of its math mode, bandwidth x
intensity) over its achieved rate, or equally the roof's time over its time. It is grouped by the
kind of work (GEMM, convolution, elementwise), the math mode and the decade of its FLOPs, because
a small GEMM reaches a smaller share of the peak than a large one. :class:`MeasuredEfficiencies`
answers :class:`dlprof.analysis.estimate.Efficiencies` from stored calibrations, so an estimate
for a calibrated device uses what was measured there instead of assuming equal efficiency.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from dlprof.analysis.math_modes import MathMode
from dlprof.hardware.calibration import Calibration, EfficiencyBucket, Measurement, OpClass, flops_decade
from dlprof.hardware.devices import Device, normalised

_GEMM_KERNEL = re.compile(r"gemm|conv|cutlass|cudnn|xmma|gmma|wgrad|dgrad|fprop|implicit", re.IGNORECASE)
_CONV = re.compile(r"conv|wgrad|dgrad|fprop|implicit", re.IGNORECASE)
_GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                       "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution",
                       "aten::_convolution", "aten::cudnn_convolution", "aten::convolution_backward",
                       "aten::mkldnn_convolution"})


def is_gemm(kernel: str, op: str | None) -> bool:
    """Whether a kernel is matrix-product or convolution work, by its name or its op's."""
    return bool(_GEMM_KERNEL.search(kernel)) or (op in _GEMM_OPS)


def work_class(kernel: str, op: str | None) -> OpClass:
    """The op class of a kernel (or a CPU op: pass its name twice) for efficiency look-ups."""
    if not is_gemm(kernel, op):
        return OpClass.ELEMENTWISE
    return OpClass.CONV if _CONV.search(kernel) or _CONV.search(op or "") else OpClass.GEMM


def roof_seconds(flops: float, moved: float, mode: MathMode, device: Device) -> float | None:
    """The least time ``device`` can do the work in: max(FLOPs / peak, bytes / bandwidth).

    Returns:
        Seconds, or None when the device has no peak for the mode or no bandwidth.
    """
    peak = mode.peak(device)
    if not peak or not device.memory_bandwidth:
        return None
    return max(flops / peak, moved / device.memory_bandwidth if moved == moved else 0.0)


def efficiency_buckets(measurements: Iterable[Measurement], device: Device) -> tuple[EfficiencyBucket, ...]:
    """Group timed calls into buckets of efficiency against ``device``'s roof.

    Args:
        measurements: timed calls (every repeat is a sample).
        device: the row whose roof the efficiencies are measured against (the measured row).

    Returns:
        One bucket per op class, math mode and decade of FLOPs, with the median efficiency and
        the lowest and highest sample; calls whose mode has no peak on the device are left out.
    """
    samples: dict[tuple[OpClass, str, int], list[float]] = defaultdict(list)
    for call in measurements:
        mode = MathMode(call.precision, call.tensor_core)
        roof = roof_seconds(call.flops, call.bytes, mode, device)
        if roof is not None and call.seconds > 0:
            samples[(call.op_class, mode.label, flops_decade(call.flops))].append(roof / call.seconds)
    return tuple(
        EfficiencyBucket(op_class, mode, decade, float(np.median(values)), min(values), max(values), len(values))
        for (op_class, mode, decade), values in sorted(samples.items())
    )


class MeasuredEfficiencies:
    """Efficiencies from stored calibrations, for the devices that have one."""

    def __init__(self, calibrations: Iterable[Calibration]) -> None:
        self._buckets: dict[str, tuple[EfficiencyBucket, ...]] = {
            normalised(c.name): c.efficiencies for c in calibrations}

    def measured_for(self, device: Device) -> bool:
        """Whether ``device`` was calibrated."""
        return bool(self._buckets.get(normalised(device.name)))

    def efficiency(self, device: Device, mode: MathMode, op_class: OpClass, flops: float) -> float | None:
        """The median efficiency measured on ``device`` for this class and mode, in the decade of
        ``flops`` or, outside the measured decades, the nearest one; None where nothing was
        measured for the class and mode."""
        kept = [b for b in self._buckets.get(normalised(device.name), ())
                if b.op_class is op_class and b.mode == mode.label]
        if not kept:
            return None
        wanted = flops_decade(flops)
        return min(kept, key=lambda b: (abs(b.decade - wanted), b.decade)).median
