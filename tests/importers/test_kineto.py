"""Kineto traces recorded on real GPUs (A100, V100, MI250) through the translation layer.

These are the ground truth for the GPU half of the torch collector while this machine has no GPU:
the collector feeds Kineto's own trace of each cycle through the same ``convert_trace``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlprof.importers.flops import estimate_flops
from dlprof.importers.kineto import KinetoOptions, clock_offset, convert_trace, read_trace
from tests.conftest import KINETO_TRACES as TRACES


def trace_files() -> list[Path]:
    return sorted(TRACES.rglob("*.json.gz"))


@pytest.mark.parametrize("path", trace_files(), ids=lambda p: p.parent.name)
def test_every_recorded_trace_translates(path: Path) -> None:
    trace = read_trace(path)
    tables = convert_trace(trace, KinetoOptions(id_base=1000))
    slices = tables.slices.to_pandas()
    complete = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    assert len(slices) == len(complete), "every complete event becomes a slice, unknown categories too"
    assert slices["id"].is_unique and slices["id"].min() == 1000
    assert (slices["dur_ns"] >= 0).all()
    base = trace.get("baseTimeNanoseconds", 0)
    first = min(complete, key=lambda e: e["ts"])
    assert slices["start_ns"].min() == base + round(first["ts"] * 1000)


def test_a100_kernels_land_on_device_streams_linked_to_their_launch() -> None:
    (path,) = (TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    trace = read_trace(path)
    tables = convert_trace(trace, KinetoOptions(id_base=0, device_pid=4242))
    slices = tables.slices.to_pandas()
    kernels = slices[slices["kind"] == "kernel"]
    assert len(kernels) == 79
    assert set(kernels["device"]) == {"cuda:0"} and (kernels["pid"] == 4242).all()
    assert (kernels["tid"] == kernels["stream"]).all()
    assert kernels["grid"].notna().all() and kernels["registers"].notna().all()
    launches = slices[slices["kind"] == "runtime"]
    linked = kernels.merge(launches, on="correlation_id", suffixes=("", "_launch"))
    assert len(linked) == len(kernels), "each kernel pairs with the runtime call that launched it"
    assert (linked["start_ns"] >= linked["start_ns_launch"]).all()
    memcpy = slices[slices["kind"] == "memcpy"]
    assert len(memcpy) == 16 and (memcpy["bytes"] > 0).all()
    assert tables.devices and "name" in tables.devices[0]


def test_triton_kernel_keeps_its_launch_shape() -> None:
    trace = read_trace(TRACES / "triton_example" / "triton_example.json.gz")
    slices = convert_trace(trace, KinetoOptions(id_base=0)).slices.to_pandas()
    (kernel,) = slices[slices["kind"] == "kernel"].itertuples()
    source = next(e for e in trace["traceEvents"] if e.get("cat") == "kernel")["args"]
    assert kernel.registers == source["registers per thread"]
    assert kernel.grid == str(source["grid"]).replace(" ", "")


def test_flops_formulas_follow_torch() -> None:
    assert estimate_flops("aten::addmm", [[10], [64, 1568], [1568, 10], [], []]) == 2 * 64 * 1568 * 10
    assert estimate_flops("aten::mm", [[3, 4], [4, 5]]) == 120
    assert estimate_flops("aten::bmm", [[2, 3, 4], [2, 4, 5]]) == 240
    conv = estimate_flops("aten::conv2d", [[64, 1, 28, 28], [16, 1, 3, 3], [16], [], [], [], []],
                          ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"])
    assert conv == 14450688  # torch's own figure for this call
    strided = estimate_flops("aten::conv2d", [[1, 3, 32, 32], [8, 3, 3, 3], [8], [], [], [], []],
                             ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "1"])
    assert strided == 2 * 15 * 15 * 9 * 3 * 8
    assert estimate_flops("aten::relu", [[4]]) is None
    assert estimate_flops("aten::mm", [[3], [4, 5]]) is None


def test_convolution_backward_flops_follow_torch_flop_counter() -> None:
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch.utils.flop_counter import FlopCounterMode

    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    inputs = torch.randn(2, 3, 16, 16, requires_grad=True)
    output = conv(inputs)
    with FlopCounterMode(display=False) as counter:
        output.sum().backward()
    grads = ["", "", "", "[8]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    both = estimate_flops("aten::convolution_backward", [[2, 8, 16, 16], [2, 3, 16, 16], [8, 3, 3, 3]],
                          [*grads, "[True, True, True]"])
    assert both == counter.get_total_flops()
    weight_only = estimate_flops("aten::convolution_backward", [[2, 8, 16, 16], [2, 3, 16, 16], [8, 3, 3, 3]],
                                 [*grads, "[False, True, True]"])
    assert weight_only is not None and 2 * weight_only == both
    # Grouped, by hand: each gradient costs the forward, 2 * N * H * W * kh * kw * (C_in / groups)
    # * C_out (torch's counter takes all 4 input channels for the weight gradient instead of 2).
    grouped_args = [*grads[:9], "2", "[True, True, True]"]
    forward = 2 * 2 * 16 * 16 * 3 * 3 * 2 * 8
    assert estimate_flops("aten::convolution_backward", [[2, 8, 16, 16], [2, 4, 16, 16], [8, 2, 3, 3]],
                          grouped_args) == 2 * forward


def test_clock_offset_keeps_zero_when_consistent_and_moves_when_not() -> None:
    assert clock_offset((105, 110), (100, 120)) == (0, (-10, 5))
    offset, (low, high) = clock_offset((1105, 1110), (100, 120))
    assert low <= offset <= high and offset == low


def small_trace() -> dict[str, object]:
    """A trace in Kineto's layout with an op, a memcpy it launched, a step and allocations."""
    return {"baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": "Host", "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "Host", "tid": 1, "ts": 10.0, "dur": 50.0,
         "args": {"Input Dims": [[2, 3], [3, 4]], "flops": 999}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 20.0, "dur": 5.0,
         "args": {"device": 0, "stream": 7, "bytes": 4096, "correlation": 3}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": "Host", "tid": 1, "ts": 20.0,
         "args": {"Bytes": 64, "Total Allocated": 64, "Total Reserved": 0, "Addr": 1, "Device Id": -1, "Device Type": 0}},
    ]}


def test_small_trace_keeps_its_flops_sizes_steps_and_numbers() -> None:
    first = convert_trace(small_trace(), KinetoOptions(id_base=0)).slices.to_pandas().set_index("name")
    assert first.loc["aten::mm", "flops"] == 999, "the trace's own FLOPs win over the estimate"
    assert first.loc["Memcpy HtoD", "bytes"] == 4096
    assert first.loc["ProfilerStep#7", "kind"] == "step"
    again = convert_trace(small_trace(), KinetoOptions(id_base=0)).slices.to_pandas().set_index("name")
    assert first.loc["aten::mm", "pid"] == again.loc["aten::mm", "pid"], "string pids number stably"
    dropped = convert_trace(small_trace(), KinetoOptions(id_base=0, drop_steps=True)).slices.to_pandas()
    assert "ProfilerStep#7" not in set(dropped["name"])


def test_profiler_range_counters_become_metrics_of_their_range() -> None:
    (path,) = (TRACES / "cupti_profiler").glob("*.json.gz")
    trace = read_trace(path)
    tables = convert_trace(trace, KinetoOptions(id_base=0))
    ranges = [e for e in trace["traceEvents"] if e.get("cat") == "cuda_profiler_range"]
    metrics = tables.metrics.to_pandas()
    expected = sum(
        1 for e in ranges for v in e["args"].values() if isinstance(v, (int, float)) and not isinstance(v, bool)
    )
    assert len(metrics) == expected > 0
    slices = tables.slices.to_pandas().set_index("id")
    owners = slices.loc[metrics["slice_id"].unique()]
    assert set(owners["kind"]) == {"cuda_profiler_range"}
    ffma = metrics[metrics["metric"] == "cupti:smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]
    assert ffma["value"].sum() == sum(e["args"]["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] for e in ranges)
