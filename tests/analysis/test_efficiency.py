"""Efficiency buckets from real timings, their look-up, and estimates that use them."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dlprof.analysis.efficiency import MeasuredEfficiencies, efficiency_buckets, roof_seconds, work_class
from dlprof.analysis.estimate import EqualEfficiency, Method, Treatment, predict_item
from dlprof.analysis.math_modes import MathMode
from dlprof.hardware.calibration import Calibration, EfficiencyBucket, Measurement, OpClass, flops_decade
from dlprof.hardware.devices import Precision, Vendor, device_table
from dlprof.keys import Kind

FP32 = MathMode(Precision.FP32, False)


def measured_cpu(efficiencies: tuple[EfficiencyBucket, ...] = (), name: str = "bench-cpu") -> Calibration:
    return Calibration(name=name, vendor=Vendor.CPU, hostname="bench", cpu_model="a CPU", cores=2, based_on=None,
                       measured_at_ns=1, seconds=1.0, peaks={Precision.FP32: 1e11}, memory_bandwidth=2e10,
                       efficiencies=efficiencies)


@pytest.mark.torch
def test_buckets_of_a_tiny_measured_case() -> None:
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    calls = []
    for n in (32, 128):
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(3):
            start = time.perf_counter()
            torch.mm(a, b)
            calls.append(Measurement(OpClass.GEMM, Precision.FP32, False, 2.0 * n**3, 12.0 * n * n,
                                     time.perf_counter() - start))
    device = measured_cpu().device(device_table())
    buckets = efficiency_buckets(calls, device)
    assert [(b.op_class, b.mode, b.decade) for b in buckets] == [
        (OpClass.GEMM, "fp32", flops_decade(2.0 * 32**3)), (OpClass.GEMM, "fp32", flops_decade(2.0 * 128**3))]
    for bucket, size in zip(buckets, (32, 128), strict=True):
        own = [c for c in calls if c.flops == 2.0 * size**3]
        ratios = [roof_seconds(c.flops, c.bytes, FP32, device) / c.seconds for c in own]  # type: ignore[operator]
        assert bucket.samples == 3 and bucket.median == pytest.approx(float(np.median(ratios)))
        assert bucket.low == min(ratios) and bucket.high == max(ratios)
        assert 0 < bucket.low <= bucket.median <= bucket.high and math.isfinite(bucket.high)


def test_look_up_by_class_mode_and_nearest_decade() -> None:
    buckets = (EfficiencyBucket(OpClass.GEMM, "fp32", 6, 0.3, 0.2, 0.4, 5),
               EfficiencyBucket(OpClass.GEMM, "fp32", 9, 0.9, 0.8, 0.95, 5),
               EfficiencyBucket(OpClass.CONV, "fp32", 9, 0.6, 0.5, 0.7, 5))
    measured = MeasuredEfficiencies([measured_cpu(buckets)])
    device = measured_cpu().device(device_table())
    assert measured.measured_for(device) and not measured.measured_for(device_table().devices[0])
    assert measured.efficiency(device, FP32, OpClass.GEMM, 3e6) == 0.3
    assert measured.efficiency(device, FP32, OpClass.GEMM, 5e12) == 0.9  # above the measured: the largest
    assert measured.efficiency(device, FP32, OpClass.CONV, 1e6) == 0.6
    assert measured.efficiency(device, FP32, OpClass.ELEMENTWISE, 1e6) is None
    assert measured.efficiency(device, MathMode(Precision.BF16, False), OpClass.GEMM, 1e9) is None


def test_work_classes() -> None:
    assert work_class("ampere_sgemm_128x64_nn", "aten::mm") is OpClass.GEMM
    assert work_class("sm80_xmma_fprop_implicit_gemm", "aten::conv2d") is OpClass.CONV
    assert work_class("aten::mkldnn_convolution", "aten::mkldnn_convolution") is OpClass.CONV
    assert work_class("vectorized_elementwise_kernel", "aten::add") is OpClass.ELEMENTWISE


def test_a_calibrated_target_takes_its_roof_time_over_its_measured_efficiency() -> None:
    a100 = device_table().by_name("a100")
    assert a100 is not None
    flops, moved, time_ns = 2.0 * 1024**3, 12.0 * 1024**2, 400_000.0
    efficiency = 0.7
    calibration = measured_cpu((EfficiencyBucket(OpClass.GEMM, "fp32", flops_decade(flops), efficiency, 0.6, 0.8, 4),))
    cpu = calibration.device(device_table())
    item = SimpleNamespace(kind=Kind.KERNEL, name="ampere_sgemm_128x64_nn", op_name="aten::mm", time_ns=time_ns,
                           flops=flops, bytes=moved, mode=FP32, grid="[64,1,1]", block="[256,1,1]",
                           registers=64, shared_memory=0)
    predicted, treatment, _ = predict_item(item, a100, cpu, Method.WAVE, MeasuredEfficiencies([calibration]))
    assert treatment is Treatment.ROOFLINE
    assert predicted == pytest.approx(roof_seconds(flops, moved, FP32, cpu) / efficiency * 1e9)  # type: ignore[operator]
    # Without the calibration: equal efficiency, the ratio of the roofs.
    equal, treatment, _ = predict_item(item, a100, cpu, Method.WAVE, EqualEfficiency())
    assert treatment is Treatment.ROOFLINE
    ratio = roof_seconds(flops, moved, FP32, cpu) / roof_seconds(flops, moved, FP32, a100)  # type: ignore[operator]
    assert equal == pytest.approx(time_ns * ratio)
