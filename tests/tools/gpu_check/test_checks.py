"""The metrics and NVML checks' judgements, on runs written through dlprof's own store and read
back with ``dlprof.load`` and ``dlprof metrics`` as the checks read a live run.

The values are what the check's two CuPy kernels would give on an H100 (a stream kernel at IPC
0.5 with one load in eight instructions, an FMA loop at IPC 3.2 with none); NVML readings go
through the collector's own translation (:func:`dlprof.collectors.nvml.readings_table`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import dlprof
from dlprof.collectors.nvml import Readings, readings_table
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.manifest import CollectorInfo, Manifest
from dlprof.store.reader import Run
from dlprof.store.writer import RankWriter
from tools.gpu_check.checks.cupti_metrics import (
    NO_ROOFLINE,
    derived_parts,
    kernel_named,
    per_kernel_metrics,
    roofline_verdicts,
    torch_kernels_carry_metrics,
)
from tools.gpu_check.checks.nvml_sampler import MATRIX_BYTES, nvml_parts
from tools.gpu_check.report import Status
from tools.gpu_check.runner import ROOT

BASE = 1_700_000_000_000_000_000
KERNELS = {  # name -> (inst_executed, cycles_active, warps_active, global loads) over all its launches
    "stream_scale": (1.0e6, 2.0e6, 4.0e7, 1.25e5),
    "fma_loop": (8.0e7, 2.5e7, 1.0e9, 0.0),
}
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "maxThreadsPerMultiprocessor": 2048, "warpSize": 32}


def metrics_run(run_dir: Path, devices: list[dict[str, Any]], kernels: dict[str, tuple[float, ...]] = KERNELS,
                loads: str = "smsp__inst_executed_op_global_ld.sum") -> Run:
    """Two kernels of two launches each on cuda:0, with the four default PM sampling metrics
    (global loads stored under ``loads``: what the chip sampled)."""
    names = [name for name in kernels for _ in range(2)]
    slices = pa.table({
        "id": list(range(1, len(names) + 1)), "pid": [1] * len(names), "tid": [7] * len(names),
        "device": ["cuda:0"] * len(names), "kind": ["kernel"] * len(names), "name": names,
        "start_ns": [BASE + i * 3_000_000 for i in range(len(names))], "dur_ns": [2_000_000] * len(names),
    })
    metric_names = ("smsp__inst_executed.sum", "sm__cycles_active.sum", "sm__warps_active.sum", loads)
    rows: dict[str, list[Any]] = {"slice_id": [], "metric": [], "value": [], "scope": [], "method": []}
    for slice_id, name in enumerate(names, start=1):
        for metric, total in zip(metric_names, kernels[name], strict=True):
            rows["slice_id"].append(slice_id)
            rows["metric"].append(f"cupti:{metric}")
            rows["value"].append(total / 2)
            rows["scope"].append("kernel")
            rows["method"].append("sampled")
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, slices, "cupti")
    writer.write_chunk(StoreTable.METRICS, pa.table(rows), "pm_sampling")
    counts, _ = writer.compact()
    Manifest(name=run_dir.name, command=["python", "cupy_work.py"], status=RunStatus.COMPLETE, start_ns=BASE,
             end_ns=BASE + 10**9, counts=counts, devices=devices,
             collectors=[CollectorInfo("cupti"), CollectorInfo("cupti_metrics")]).write(run_dir)
    return dlprof.load(run_dir)


def dlprof_metrics(run_dir: Path, *options: str) -> Any:
    """``dlprof metrics RUN --format json ...`` as the check runs it."""
    done = subprocess.run([sys.executable, "-m", "dlprof", "metrics", str(run_dir), "--format", "json", *options],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


ROLES = {"memory-bound": "stream_scale", "compute-bound": "fma_loop"}


def unavailable(run_dir: Path) -> dict[str, str]:
    return {r["name"]: r["reason"] for r in dlprof_metrics(run_dir, "--list") if not r["available"]}


@pytest.mark.slow
def test_plausible_metrics_pass_every_judgement(tmp_path: Path) -> None:
    run = metrics_run(tmp_path / "run", [H100])
    assert per_kernel_metrics(run, ROLES).status is Status.PASSED
    rows = dlprof_metrics(tmp_path / "run", "--limit", "0")
    parts = derived_parts(rows, unavailable(tmp_path / "run"), ROLES)
    assert [(p.what.split(" ")[0], p.status) for p in parts] == [
        ("ipc", Status.PASSED), ("warps_per_inst", Status.PASSED), ("gld_per_inst", Status.PASSED),
        ("achieved_occupancy", Status.PASSED), ("gld_per_inst:", Status.PASSED)]
    occupancy = {r["name"]: r["achieved_occupancy"] for r in rows}
    assert occupancy["stream_scale"] == pytest.approx(100 * 4e7 / 2e6 / 64)


@pytest.mark.slow
def test_a_run_without_device_properties_fails_achieved_occupancy_with_dlprofs_reason(tmp_path: Path) -> None:
    """As a run of the cupti collector alone is today: nothing records the GPU's properties."""
    metrics_run(tmp_path / "run", [])
    rows = dlprof_metrics(tmp_path / "run", "--limit", "0")
    parts = {p.what.split(" ")[0]: p for p in derived_parts(rows, unavailable(tmp_path / "run"), ROLES)}
    assert parts["achieved_occupancy"].status is Status.FAILED
    assert "max_warps_per_sm is unknown" in parts["achieved_occupancy"].detail
    assert parts["ipc"].status is Status.PASSED


def test_a_kernel_without_its_metrics_fails(tmp_path: Path) -> None:
    run = metrics_run(tmp_path / "run", [H100], {**KERNELS, "fma_loop": (8.0e7, 2.5e7, 1.0e9, 0.0)})
    assert per_kernel_metrics(run, {**ROLES, "compute-bound": None}).status is Status.FAILED
    starved = metrics_run(tmp_path / "starved", [H100], {**KERNELS, "stream_scale": (0.0, 2.0e6, 4.0e7, 0.0)})
    part = per_kernel_metrics(starved, ROLES)
    assert part.status is Status.FAILED
    assert part.detail == "missing, negative or zero: memory-bound smsp__inst_executed.sum"


@pytest.mark.slow
def test_the_sass_global_load_count_a_gh100_samples_stands_in_for_the_refused_one(tmp_path: Path) -> None:
    """On the H200 the chip refused smsp__inst_executed_op_global_ld.sum; its SASS count is stored
    instead, and the check and dlprof metrics read it as the global loads."""
    sass = "smsp__sass_inst_executed_op_global_ld.sum"
    run = metrics_run(tmp_path / "run", [H100], loads=sass)
    part = per_kernel_metrics(run, ROLES)
    assert part.status is Status.PASSED, part.detail
    assert part.figures["sampled as"] == {"smsp__inst_executed_op_global_ld.sum": sass}
    parts = derived_parts(dlprof_metrics(tmp_path / "run", "--limit", "0"), unavailable(tmp_path / "run"), ROLES)
    assert all(p.status is Status.PASSED for p in parts), [p.detail for p in parts]


def test_torch_kernels_pass_when_nearly_all_carry_every_metric(tmp_path: Path) -> None:
    run = metrics_run(tmp_path / "run", [H100])
    assert torch_kernels_carry_metrics(run).status is Status.PASSED
    writer = RankWriter(tmp_path / "more", 0)
    more = dlprof.load(tmp_path / "run")
    slices = pa.Table.from_pandas(more.slices.drop(columns=["rank"]), preserve_index=False)
    extra = slices.slice(0, 1).set_column(0, "id", pa.array([99], pa.int64()))  # a kernel with no metric
    writer.write_chunk(StoreTable.SLICES, pa.concat_tables([slices, extra]), "torch")
    writer.write_chunk(StoreTable.METRICS, pa.Table.from_pandas(more.metrics.drop(columns=["rank"]),
                                                                preserve_index=False), "pm")
    counts, _ = writer.compact()
    Manifest(name="more", command=["python"], status=RunStatus.COMPLETE, start_ns=BASE, end_ns=BASE + 10**9,
             counts=counts).write(tmp_path / "more")
    part = torch_kernels_carry_metrics(dlprof.load(tmp_path / "more"))
    assert part.status is Status.FAILED and part.detail.startswith("4 of 5 kernels (80 %, needed 95 %)")


def test_kernels_are_found_by_name_or_by_a_decorated_name() -> None:
    assert kernel_named(["fma_loop", "x"], "fma_loop") == "fma_loop"
    assert kernel_named(["cupy_stream_scale_float32"], "stream_scale") == "cupy_stream_scale_float32"
    assert kernel_named(["x"], "fma_loop") is None


def test_roofline_verdicts_are_read_where_a_roofline_names_them() -> None:
    rows = [{"name": "stream_scale", "bound": "memory"}, {"name": "fma_loop", "bound": "compute"}]
    assert roofline_verdicts(rows, ROLES).status is Status.PASSED
    swapped = [{"name": "stream_scale", "bound": "compute"}, {"name": "fma_loop", "bound": "compute"}]
    assert roofline_verdicts(swapped, ROLES).status is Status.FAILED
    unnamed = roofline_verdicts([{"name": "fma_loop", "flops": 1.0}], ROLES)
    assert unnamed.status is Status.COULD_NOT_RUN and "columns: name, flops" in unnamed.detail
    assert NO_ROOFLINE == "no roofline command yet"


SECOND = 1_000_000_000


def nvml_run(run_dir: Path, busy_power: float, busy_util: float) -> tuple[Run, dict[str, Any]]:
    """0.1 s NVML samples of cuda:0 over 2.5 s idle, 5 s busy and 2.5 s idle again."""
    phases = {"idle": [BASE, BASE + 25 * SECOND // 10], "busy": [BASE + 25 * SECOND // 10, BASE + 75 * SECOND // 10],
              "after": [BASE + 75 * SECOND // 10, BASE + 10 * SECOND]}
    samples = []
    for tick in range(100):
        ts = BASE + tick * SECOND // 10
        busy = phases["busy"][0] + SECOND // 2 <= ts <= phases["busy"][1]  # NVML lags the work
        samples.append((ts, 0, Readings(busy_util if busy else 0.0, 30.0 if busy else 0.0,
                                        2.0e9 if busy else 0.5e9, busy_power if busy else 70.0, 1980.0, 40.0)))
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.COUNTERS, readings_table(samples, pid=1), "nvml")
    counts, _ = writer.compact()
    Manifest(name=run_dir.name, command=["python", "gpu_busy.py"], status=RunStatus.COMPLETE, start_ns=BASE,
             end_ns=BASE + 10 * SECOND, counts=counts, collectors=[CollectorInfo("nvml")]).write(run_dir)
    return dlprof.load(run_dir), phases


def test_nvml_gauges_that_move_with_the_work_pass(tmp_path: Path) -> None:
    run, phases = nvml_run(tmp_path / "run", busy_power=450.0, busy_util=100.0)
    parts = nvml_parts(run, "cuda:0", phases)
    assert [p.status for p in parts] == [Status.PASSED] * 4, [p.detail for p in parts]
    assert parts[1].figures["idle_mean"] == 70.0 and parts[1].figures["busy_mean"] == 450.0
    assert parts[2].figures["busy_mean"] - parts[2].figures["idle_mean"] >= MATRIX_BYTES * 0.9
    assert parts[3].figures["samples"]["nvml.temperature"] == 100


def test_nvml_gauges_that_stay_flat_fail(tmp_path: Path) -> None:
    run, phases = nvml_run(tmp_path / "run", busy_power=80.0, busy_util=5.0)
    statuses = [p.status for p in nvml_parts(run, "cuda:0", phases)]
    assert statuses == [Status.FAILED, Status.FAILED, Status.PASSED, Status.PASSED]
    gone = [p for p in nvml_parts(run, "cuda:1", phases)]  # another GPU's samples: none at all
    assert all(p.status is Status.FAILED for p in gone)
    assert gone[3].detail.startswith("absent: nvml.gpu_util, nvml.mem_util")
