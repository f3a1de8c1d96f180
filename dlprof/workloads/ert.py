"""ERT-style ceilings: time GEMMs, convolutions and streams of growing size on one device.

    found = measure(torch_device(DeviceType.CPU), Budget.QUICK)
    found.peaks[Precision.FP32], found.memory_bandwidth    # FLOP/s, bytes/s
    found.measurements                                     # every timed call, for efficiencies

As the Empirical Roofline Toolkit does, the ceilings are the best rates reached: the fastest GEMM
per number format (fp32 always; bf16 and fp16 where the device computes them natively) and the
fastest triad (a = b + s c, STREAM's kernel) over arrays larger than the caches. Each kernel is
timed over a ladder of sizes, every call a :class:`~dlprof.hardware.calibration.Measurement`,
so that efficiency can be read per op class and size. A :class:`Budget` bounds the time: each
size is timed for a fixed time, and a ladder stops before a size whose one call would exceed
several times that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from dlprof.hardware.calibration import Measurement, OpClass
from dlprof.hardware.devices import Precision
from dlprof.workloads.torch_device import synchronize

if TYPE_CHECKING:
    import torch

# Most calls timed for one size: enough for a spread, few enough that fast sizes stay cheap.
MAX_CALLS = 30
CONV_BATCH = 8
TRIAD_SCALAR = 3.0
# A ladder stops before a size whose one call would take this many times the time per size.
SLOW_CALL = 4.0


@dataclass(frozen=True)
class Budget:
    """How long a calibration may take: the time per size and the largest sizes."""

    seconds_per_size: float  # timing one size of one kernel
    largest_gemm: int  # n of the largest n x n x n GEMM
    largest_channels: int  # channels in and out of the largest 3x3 convolution
    conv_side: int  # the convolution's image side
    stream_elements: int  # elements of each triad array (larger than the caches)

    @classmethod
    def default(cls) -> Budget:
        """About 20 to 40 seconds on a two-core CPU."""
        return cls(0.25, 2048, 128, 32, 1 << 23)

    @classmethod
    def quick(cls) -> Budget:
        """About a second: for tests; the ceilings are rough."""
        return cls(0.01, 256, 16, 8, 1 << 16)


@dataclass(frozen=True)
class Ceilings:
    """What one calibration measured."""

    peaks: dict[Precision, float]  # best GEMM FLOP/s per number format
    memory_bandwidth: float  # best triad bytes/s
    measurements: tuple[Measurement, ...]
    left_out: dict[Precision, str] = field(default_factory=dict)  # formats not kept, with why


@dataclass(frozen=True)
class _Kernel:
    """One size of one calibration kernel, ready to time."""

    op_class: OpClass
    precision: Precision
    label: str  # for the progress bar
    flops: float
    bytes: float
    growth: float  # how many times more work the next size of the ladder does
    call: Callable[[], object]


_DTYPES = {Precision.FP32: "float32", Precision.BF16: "bfloat16", Precision.FP16: "float16"}


def precisions(device: torch.device) -> list[Precision]:
    """The number formats to measure: fp32, and bf16 and fp16 where the device has native units
    for them (on a CPU, oneDNN says so; elsewhere they would be emulated and no ceiling)."""
    import torch

    if device.type == "cuda":
        return [Precision.FP32, *([Precision.BF16] if torch.cuda.is_bf16_supported() else []), Precision.FP16]
    native = {Precision.BF16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
              Precision.FP16: torch.ops.mkldnn._is_mkldnn_fp16_supported()}
    return [Precision.FP32, *(p for p, ok in native.items() if ok)]


def _ladder(first: int, last: int, factor: int = 2) -> list[int]:
    sizes = [first]
    while sizes[-1] * factor <= last:
        sizes.append(sizes[-1] * factor)
    return sizes


def _gemms(device: torch.device, precision: Precision, budget: Budget) -> Iterator[_Kernel]:
    import torch

    dtype = getattr(torch, _DTYPES[precision])
    for n in _ladder(64, budget.largest_gemm):
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        yield _Kernel(OpClass.GEMM, precision, f"gemm {precision} {n}", 2.0 * n**3, 3.0 * n * n * a.element_size(), 8.0,
                      partial(torch.mm, a, b))


def _convolutions(device: torch.device, precision: Precision, budget: Budget) -> Iterator[_Kernel]:
    import torch

    dtype = getattr(torch, _DTYPES[precision])
    side = budget.conv_side
    for channels in _ladder(8, budget.largest_channels):
        image = torch.randn(CONV_BATCH, channels, side, side, device=device, dtype=dtype)
        weight = torch.randn(channels, channels, 3, 3, device=device, dtype=dtype)
        flops = 2.0 * CONV_BATCH * channels * channels * 9 * side * side
        moved = (2 * image.numel() + weight.numel()) * image.element_size()
        yield _Kernel(OpClass.CONV, precision, f"conv {precision} {channels}ch", flops, float(moved), 4.0,
                      partial(torch.nn.functional.conv2d, image, weight, padding=1))


def _streams(device: torch.device, precision: Precision, budget: Budget) -> Iterator[_Kernel]:
    import torch

    dtype = getattr(torch, _DTYPES[precision])
    for n in _ladder(1 << 12, budget.stream_elements, 4):
        a, b, c = (torch.empty(n, device=device, dtype=dtype).uniform_() for _ in range(3))
        yield _Kernel(OpClass.ELEMENTWISE, precision, f"triad {precision} {n}", 2.0 * n, 3.0 * n * a.element_size(), 4.0,
                      partial(torch.add, b, c, alpha=TRIAD_SCALAR, out=a))


def planned(device: torch.device, budget: Budget) -> int:
    """How many sizes :func:`measure` times at most (for a progress bar's total)."""
    per_precision = (len(_ladder(64, budget.largest_gemm)) + len(_ladder(8, budget.largest_channels))
                     + len(_ladder(1 << 12, budget.stream_elements, 4)))
    return per_precision * len(precisions(device))


def _timed(kernel: _Kernel, device: torch.device, seconds: float) -> list[float]:
    """Seconds per call: one warm-up, then calls until ``seconds`` have passed (two at least)."""
    kernel.call()
    synchronize(device)
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < 2 or (time.perf_counter() - began < seconds and len(times) < MAX_CALLS):
        start = time.perf_counter()
        kernel.call()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def native_formats(peaks: dict[Precision, float], measurements: list[Measurement]
                   ) -> tuple[dict[Precision, float], list[Measurement], dict[Precision, str]]:
    """Leave out the formats whose GEMMs ran slower than fp32's: a format without units of its
    own here (emulated), or one measured only at sizes too small to show its rate, would make a
    wrong roof. Returns the peaks and calls kept, and each format left out with why."""
    fp32 = peaks.get(Precision.FP32, 0.0)
    left_out: dict[Precision, str] = {
        precision: f"its GEMMs peaked at {peak / 1e9:.3g} GFLOP/s, below fp32's {fp32 / 1e9:.3g} GFLOP/s: "
                   "emulated here, or measured only at small sizes"
        for precision, peak in peaks.items() if precision is not Precision.FP32 and peak < fp32}
    return ({precision: peak for precision, peak in peaks.items() if precision not in left_out},
            [call for call in measurements if call.precision not in left_out], left_out)


def measure(device: torch.device, budget: Budget, advance: Callable[[str], None] = lambda _: None) -> Ceilings:
    """Time every calibration kernel on ``device`` within ``budget``.

    Args:
        device: where to run (a torch device).
        budget: the time per size and the largest sizes.
        advance: called with a label after each size (timed or skipped), for a progress bar.

    Returns:
        The ceilings and every timed call.
    """
    measurements: list[Measurement] = []
    for precision in precisions(device):
        tensor_core = device.type == "cuda" and precision is not Precision.FP32
        for ladder in (_gemms, _convolutions, _streams):
            too_slow = False
            previous: float | None = None
            for kernel in ladder(device, precision, budget):
                if not too_slow:
                    times = _timed(kernel, device, budget.seconds_per_size)
                    measurements += [Measurement(kernel.op_class, precision, tensor_core, kernel.flops, kernel.bytes, t)
                                     for t in times]
                    # Stop the ladder where one call of the next size would take several times
                    # the budget, predicted from this size's best call (which noise only slows)
                    # grown as much as it grew from the last size, at most as the work does: a
                    # call that costs the same at every small size (a library's fixed cost, as
                    # oneDNN's for small bf16 GEMMs) goes on to the sizes where the work shows.
                    best = min(times)
                    growth = kernel.growth if previous is None else min(kernel.growth, max(best / previous, 1.0))
                    too_slow = previous is not None and best * growth > SLOW_CALL * budget.seconds_per_size
                    previous = best
                advance(kernel.label)
    peaks = {call.precision: 0.0 for call in measurements if call.op_class is OpClass.GEMM}
    for call in measurements:
        if call.op_class is OpClass.GEMM:
            peaks[call.precision] = max(peaks[call.precision], call.flops / call.seconds)
    peaks, measurements, left_out = native_formats(peaks, measurements)
    largest = max(call.bytes for call in measurements if call.op_class is OpClass.ELEMENTWISE)
    bandwidth = max(call.bytes / call.seconds for call in measurements
                    if call.op_class is OpClass.ELEMENTWISE and call.bytes == largest)
    return Ceilings(peaks, bandwidth, tuple(measurements), left_out)
