"""Estimates from dlprof's own H200 run: host-bound steps stay host-bound, bf16 on a V100 has
no tensor cores, and a GEMM far below its roof is not scaled by the roof."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.critical_path import ready_times, replay
from dlprof.analysis.efficiency import roof_seconds
from dlprof.analysis.estimate import (
    LOW_EFFICIENCY,
    EqualEfficiency,
    Estimate,
    Method,
    estimate,
    predict_items,
)
from dlprof.analysis.run_device import named_device, run_device
from dlprof.analysis.work_items import work_items


@pytest.fixture(scope="module")
def on_v100(h200_run: Path) -> Estimate:
    return estimate(dlprof.load(h200_run), named_device("v100"))


def test_a_host_bound_step_stays_host_bound_on_a_gpu_as_fast(h200_run: Path) -> None:
    """The GPU is busy 30-48% of each step: an H100 (a little less bandwidth than the H200)
    slows the kernels, and the idle GPU absorbs it; the old model added every kernel's change
    to the step."""
    found = estimate(dlprof.load(h200_run), named_device("h100"))
    steps = found.steps
    assert (steps["bound"] == "host").all() and (steps["target_bound"] == "host").mean() > 0.8
    assert found.median_target_step_ns == pytest.approx(found.median_step_ns, rel=0.01)
    device_change = float(found.ops["target_ns"].sum() - found.ops["source_ns"].sum())
    assert device_change > 0  # the kernels do take longer...
    assert steps["target_ns"].sum() - steps["source_ns"].sum() < 0.2 * device_change  # ...off the critical path


def test_a_slower_gpu_fills_the_idle_time_before_the_step_grows(on_v100: Estimate) -> None:
    counted = on_v100.steps.iloc[1:-1]
    assert (counted["target_ns"] >= counted["source_ns"]).all()
    # A step grows by less than its device time grows: part of the growth fills idle gaps.
    assert on_v100.median_target_step_ns is not None and on_v100.median_step_ns is not None
    grown = on_v100.median_target_step_ns - on_v100.median_step_ns
    per_step_change = (on_v100.ops["target_ns"].sum() - on_v100.ops["source_ns"].sum()) / 20
    assert 0 < grown < per_step_change
    assert (counted["target_bound"] == "GPU").mean() > 0.8


def test_bf16_on_a_v100_is_said_to_run_without_tensor_cores(on_v100: Estimate, h200_run: Path) -> None:
    assert any(line.startswith("bf16: V100 SXM2 has no bf16 tensor cores") for line in on_v100.warnings)
    a100 = estimate(dlprof.load(h200_run), named_device("a100"))
    assert not any("bf16" in line for line in a100.warnings)


def test_the_align1_gemms_are_not_scaled_by_the_roof(h200_run: Path) -> None:
    """CUTLASS's sm75 align1 kernels run at about a tenth of the H200's bf16 roof: what holds
    them is not the roof, so an A100's roof ratio does not predict them."""
    run = dlprof.load(h200_run)
    items = work_items(run).table
    align1 = items[items["name"].str.contains("align1")]
    source, a100 = run_device(run), named_device("a100")
    predicted = predict_items(align1, source, a100, Method.WAVE, EqualEfficiency())
    for row in predicted.itertuples():
        roof = roof_seconds(float(row.flops), float(row.bytes), row.mode, source)
        assert roof is not None and roof / (row.time_ns / 1e9) < LOW_EFFICIENCY
        assert row.treatment != "roofline"


def test_replay_keeps_the_host_launches_and_queues_behind_earlier_work() -> None:
    # Two kernels: the first waited on the host (the stream idled), the second was queued.
    start, launch = [100.0, 150.0], [90.0, 120.0]
    import numpy as np

    ready = ready_times(np.array(start), np.array([-np.inf, 150.0]), np.array(launch))
    assert list(ready) == [100.0, 120.0]
    assert list(replay(ready, np.array([20.0, 20.0]))) == [120.0, 140.0]  # faster: the queue drains sooner
    assert list(replay(ready, np.array([80.0, 80.0]))) == [180.0, 260.0]
