"""Roofline rows, FLOPs against torch's own counter, math modes and wave scaling, on real and
hand-built runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.estimate import EqualEfficiency, Method, Treatment, estimate, predict_items
from dlprof.analysis.math_modes import MathMode, math_mode
from dlprof.analysis.roofline import Bound, RooflineKey, roofline
from dlprof.analysis.wave_scaling import Launch, blocks_per_sm, gamma, wave_scaled_ns, waves
from dlprof.analysis.work_items import work_items
from dlprof.hardware.devices import Precision, device_table
from dlprof.keys import StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.references import recorded_devices

SQUARE = "[[1024,1024],[1024,1024]]"
FLOATS = '["float","float"]'


def slice_row(i: int, name: str, start: int, dur: int, kind: str = "op", **extra: object) -> dict[str, object]:
    return {"id": i, "pid": 1, "tid": 1, "device": "cpu", "kind": kind, "name": name, "start_ns": start,
            "dur_ns": dur, "input_shapes": None, "input_dtypes": None, "flops": None, "bytes": None,
            "correlation_id": None, "grid": None, "block": None, "registers": None, **extra}


def launched(i: int, op: str, start: int, kernel: str, kernel_ns: int, **op_columns: object) -> list[dict[str, object]]:
    """An op, the runtime call inside it and the kernel it launched on cuda:0."""
    return [
        slice_row(i, op, start, 50_000, **op_columns),
        slice_row(i + 1, "cudaLaunchKernel", start + 10, 20, kind="runtime", correlation_id=i),
        slice_row(i + 2, kernel, start + 100, kernel_ns, kind="kernel", device="cuda:0", tid=7, correlation_id=i,
                  grid="[1024,1,1]", block="[256,1,1]", registers=32),
    ]


def gpu_run(directory: Path, rows: list[dict[str, object]], devices: list[dict[str, object]]) -> dlprof.Run:
    Manifest(name="t", command=["t"], devices=devices).write(directory)
    table = pa.table({key: [row.get(key) for row in rows] for key in rows[0]})
    for name in ("kind", "name", "device", "input_shapes", "input_dtypes", "grid", "block"):
        table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(pa.string())
                                 .dictionary_encode())
    writer = RankWriter(directory, 0)
    writer.write_chunk(StoreTable.SLICES, table, "test")
    writer.compact()
    return dlprof.load(directory)


def test_bound_and_percent_of_roof_on_a_hand_built_a100_run(tmp_path: Path) -> None:
    matmul_flops, add_flops = 2 * 1024**3, 1024**2
    run = gpu_run(tmp_path, [
        *launched(10, "aten::mm", 0, "cutlass_80_tensorop_s1688gemm_128x128", 1_000_000,
                  input_shapes=SQUARE, input_dtypes=FLOATS, flops=matmul_flops),
        *launched(20, "aten::add", 2_000_000, "vectorized_elementwise_kernel", 40_000,
                  input_shapes=SQUARE, input_dtypes=FLOATS, flops=add_flops),
        *launched(30, "aten::unknown_thing", 3_000_000, "mystery_kernel", 60_000),
    ], recorded_devices("trace_diff/control")[:1])
    found = roofline(run, RooflineKey.OP)
    a100 = device_table().by_name("A100 SXM4 40GB")
    assert a100 is not None and found.device == a100
    rows = found.table.set_index("name")
    moved = 3 * 1024 * 1024 * 4  # two float inputs and one output of 1024 x 1024
    mm = rows.loc["aten::mm"]
    assert mm["flops"] == matmul_flops and mm["bytes"] == moved and mm["mode"] == "tf32 tensor core"
    assert mm["bound"] == Bound.COMPUTE  # intensity 171 FLOP/B, above the TF32 ridge of 100
    assert mm["roof_pct"] == pytest.approx(100 * (matmul_flops / 1e-3) / a100.peaks[Precision.TF32])
    add = rows.loc["aten::add"]
    assert add["bound"] == Bound.MEMORY and add["mode"] == "fp32"
    intensity = add_flops / moved
    assert add["intensity"] == pytest.approx(intensity)
    assert add["roof_pct"] == pytest.approx(100 * (add_flops / 40e-6) / (a100.memory_bandwidth * intensity))
    assert rows.loc["aten::unknown_thing", "flops_source"] == "none"
    assert found.coverage == pytest.approx(1_040_000 / 1_100_000)


def test_an_unknown_gpu_is_a_clear_error_naming_device(tmp_path: Path) -> None:
    from dlprof.cli.main import main

    odd = {"id": 0, "name": "Prototype X", "computeMajor": 12, "computeMinor": 3, "numSms": 999,
           "totalGlobalMem": 1, "warpSize": 32}
    run = gpu_run(tmp_path / "odd", launched(10, "aten::mm", 0, "k", 1000), [odd])
    with pytest.raises(ValueError, match="--device"):
        roofline(run)
    assert roofline(run, device_name="h100").device.name == "H100 SXM5 80GB"
    assert main(["roofline", str(run.path)]) == 2


@pytest.mark.torch
def test_flops_of_matmul_addmm_bmm_and_conv_match_torch_flop_counter(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    conv, linear = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.Linear(48, 20)
    x, a, b = torch.randn(4, 3, 16, 16), torch.randn(6, 48), torch.randn(5, 7, 9)
    c, d = torch.randn(48, 33), torch.randn(5, 9, 11)

    def work() -> None:
        conv(x)
        linear(a)
        torch.mm(a, c)
        torch.bmm(b, d)

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        work()
    expected = {str(op).split(".")[1]: n for op, n in counter.get_flop_counts()["Global"].items()}
    with torch.no_grad(), dlprof.profile(out=tmp_path / "run", collectors=("torch",)):
        work()
    items = work_items(dlprof.load(tmp_path / "run")).table.groupby("op_name")["flops"].sum()
    assert items["aten::conv2d"] == expected["convolution"]
    assert items["aten::addmm"] == expected["addmm"]
    assert items["aten::mm"] == expected["mm"]
    assert items["aten::bmm"] == expected["bmm"]


@pytest.mark.torch
def test_cpu_run_is_measured_against_the_nominal_cpu_row(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    found = roofline(run, RooflineKey.LAYER)
    assert found.device.origin == "nominal" and found.device.sms == run.manifest.host.cpu_cores
    assert 0 < found.coverage <= 1
    assert (found.table["flops"] > 0).all() and set(found.table["bound"]) <= {"memory", "compute"}


def test_math_modes_from_kernel_names_and_types() -> None:
    assert math_mode("cutlass_80_tensorop_s1688gemm_64x64", "float") == MathMode(Precision.TF32, True)
    assert math_mode("volta_h884gemm_256x128_ldg8_nn", "c10::Half") == MathMode(Precision.FP16, True)
    assert math_mode("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize", None).precision is Precision.BF16
    assert math_mode("ampere_sgemm_128x64_nn", "float") == MathMode(Precision.FP32, False)
    assert math_mode("vectorized_elementwise_kernel", "double") == MathMode(Precision.FP64, False)
    v100 = device_table().by_name("v100")
    assert v100 is not None  # TF32 work runs on a V100's CUDA cores
    assert MathMode(Precision.TF32, True).on(v100) == MathMode(Precision.FP32, False)


def test_wave_scaling_on_hand_computed_cases() -> None:
    table = device_table()
    a100, v100 = table.by_name("A100 SXM4 40GB"), table.by_name("V100 SXM2")
    assert a100 is not None and v100 is not None
    assert gamma(0.0, 10.0) == 1.0 and gamma(10.0, 10.0) == 0.5 and gamma(40.0, 10.0) == 0.125
    assert gamma(None, 10.0) == 1.0
    launch = Launch(blocks=100_000, threads_per_block=256, registers_per_thread=64)
    assert blocks_per_sm(a100, launch) == 4  # 65536 registers / (64 x 256)
    assert waves(v100, launch) == -(-100_000 // (4 * 80))
    # Memory-bound (intensity 0): the bandwidth ratio alone.
    assert wave_scaled_ns(1000.0, a100, v100, launch, 0.0) == pytest.approx(1000 * 1555 / 900)
    # At the ridge, half bandwidth, half clock x SMs.
    ridge = v100.ridge_point(Precision.FP32)
    expected = 1000 * (1555 / 900) ** 0.5 * (1410 / 1530 * 108 / 80) ** 0.5
    assert wave_scaled_ns(1000.0, a100, v100, launch, ridge) == pytest.approx(expected)
    # One wave on the A100 (216 blocks of 1024 threads: 2 per SM), two on the V100's 80 SMs x 2.
    small = Launch(blocks=216, threads_per_block=1024)
    assert wave_scaled_ns(1000.0, a100, v100, small, 0.0) == pytest.approx(1000 * 1410 / 1530 * 2)


def _sgemm_on_a_v100(tmp_path: Path, flops: int) -> Any:
    """An A100 SGEMM of 1 ms doing ``flops``, predicted on a V100."""
    run = gpu_run(tmp_path, launched(10, "aten::mm", 0, "ampere_sgemm_128x64_nn", 1_000_000, input_shapes=SQUARE,
                                     input_dtypes=FLOATS, flops=flops), recorded_devices("trace_diff/control")[:1])
    table = device_table()
    a100, v100 = table.by_name("a100"), table.by_name("v100")
    assert a100 is not None and v100 is not None
    (row,) = predict_items(work_items(run).table, a100, v100, Method.WAVE, EqualEfficiency()).itertuples()
    return row


def test_gemm_in_the_same_math_mode_scales_by_the_roof(tmp_path: Path) -> None:
    row = _sgemm_on_a_v100(tmp_path, 10 * 1024**3)  # 10.7 GFLOPs in 1 ms: 55% of an A100's fp32 roof
    assert row.treatment == Treatment.ROOFLINE  # fp32 SIMT on both: equal efficiency holds
    assert row.target_ns == pytest.approx(1_000_000 * 19.5 / 15.7)


def test_a_gemm_far_below_its_roof_is_not_scaled_by_the_roof(tmp_path: Path) -> None:
    # 2.1 GFLOPs in 1 ms: 11% of an A100's fp32 roof, held by something else than the roof.
    row = _sgemm_on_a_v100(tmp_path, 2 * 1024**3)
    assert row.treatment != Treatment.ROOFLINE
    assert row.target_ns != pytest.approx(1_000_000 * 19.5 / 15.7)


def test_estimate_of_a_recorded_a100_trace_on_a_v100(gpu_run: Path) -> None:
    run = dlprof.load(gpu_run)
    v100 = device_table().by_name("v100")
    assert v100 is not None
    found = estimate(run, v100)
    assert found.source.name == "A100 SXM4 40GB" and 0 < found.coverage <= 1
    assert found.ops["target_ns"].sum() > found.ops["source_ns"].sum()  # a V100 is slower at everything here
    assert any("equal GEMM efficiency" in line for line in found.assumptions)


def test_estimate_cli_json_and_one_line_errors(gpu_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.cli.main import main

    assert main(["estimate", str(gpu_run), "--device", "h100", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["target"] == "H100 SXM5 80GB" and document["ops"] and document["assumptions"]
    assert main(["estimate", str(gpu_run), "--device", "nosuch"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("dlprof: error: unknown device 'nosuch'") and "\n" not in error
    assert main(["estimate", str(gpu_run)]) == 2  # --device is required
    assert "--device" in capsys.readouterr().err


@pytest.mark.torch
def test_estimate_refuses_a_cpu_run_in_one_line(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.cli.main import main

    assert main(["estimate", str(cnn_run), "--device", "a100"]) == 2
    error = capsys.readouterr().err.strip()
    assert "estimate needs a GPU run" in error and "\n" not in error


def test_roofline_cli_formats_and_one_line_errors(gpu_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.cli.main import main

    assert main(["roofline", str(gpu_run), "--by", "kernel", "--format", "json", "-n", "0"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    expected = roofline(dlprof.load(gpu_run), RooflineKey.KERNEL).table
    assert [r["name"] for r in rows] == expected["name"].tolist()
    assert captured.err.startswith("coverage: ")
    assert main(["roofline", str(gpu_run), "--by", "layer"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("dlprof: error: ") and "no work inside a layer" in error and "\n" not in error
    assert main(["roofline", str(gpu_run), "--device", "nosuch"]) == 2
    assert "known: A100 SXM4 40GB" in capsys.readouterr().err
