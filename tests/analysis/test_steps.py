"""Step statistics, warm-up and partial steps, and the per-step breakdown, on real PyTorch runs fed
by a DataLoader (and a Keras fit with validation): figures checked against the step slices."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import dlprof
from dlprof.analysis.steps import StepPart, StepStatus, excluded_steps, step_report
from dlprof.importers.data_wait import DATALOADER_ITERATION
from dlprof.keys import Kind
from tests.conftest import profile_dataloader_loop
from tests.references import union_length

PARTS = [f"{part}_ns" for part in StepPart]


def step_slices(run: dlprof.Run) -> pd.DataFrame:
    slices = run.slices
    steps = slices[slices["kind"] == Kind.STEP].sort_values("start_ns").reset_index(drop=True)
    return steps.assign(end_ns=steps["start_ns"] + steps["dur_ns"])


@pytest.mark.torch
def test_statistics_are_those_of_the_counted_step_slices(dataloader_run: Path) -> None:
    run = dlprof.load(dataloader_run)
    steps = step_slices(run)
    # Six batches: ProfilerStep#0..#5 ended by prof.step(), #6 open at the stop (the evaluation).
    assert steps["name"].tolist() == [f"ProfilerStep#{i}" for i in range(7)]
    counted = steps["dur_ns"].to_numpy()[1:-1].astype(float)
    report = step_report(run)
    (row,) = report.statistics.to_dict("records")
    assert (row["steps"], row["warmup"], row["partial"]) == (5, 1, 1)
    assert row["mean_ns"] == pytest.approx(counted.mean())
    assert row["median_ns"] == pytest.approx(np.median(counted))
    assert row["p90_ns"] == pytest.approx(np.percentile(counted, 90))
    assert row["p99_ns"] == pytest.approx(np.percentile(counted, 99))
    assert row["std_ns"] == pytest.approx(counted.std(ddof=1))
    assert (row["min_ns"], row["max_ns"]) == (counted.min(), counted.max())


@pytest.mark.torch
def test_the_step_open_at_stop_is_flagged_partial_and_holds_the_evaluation(dataloader_run: Path) -> None:
    run = dlprof.load(dataloader_run)
    assert run.manifest.partial_step == "ProfilerStep#6"
    report = step_report(run)
    assert report.steps["status"].tolist() == [StepStatus.WARMUP, *[StepStatus.COUNTED] * 5, StepStatus.PARTIAL]
    left_out = excluded_steps(report)
    assert left_out[["step", "status"]].values.tolist() == [
        ["ProfilerStep#0", StepStatus.WARMUP], ["ProfilerStep#6", StepStatus.PARTIAL]]
    # The evaluation's two forwards of the whole model ran after the loop: inside the partial step.
    slices = run.slices
    last = step_slices(run).iloc[-1]
    model_forwards = slices[(slices["kind"] == Kind.MODULE) & (slices["name"] == "Sequential (Sequential) forward")]
    inside = model_forwards[(model_forwards["start_ns"] >= last["start_ns"]) & (model_forwards["start_ns"] < last["end_ns"])]
    assert len(model_forwards) == 6 + 2 and len(inside) == 2


@pytest.mark.torch
def test_the_breakdown_parts_add_up_to_each_step(dataloader_run: Path) -> None:
    report = step_report(dlprof.load(dataloader_run))
    steps = report.steps
    assert (steps[PARTS].sum(axis=1) == steps["dur_ns"]).all()
    assert (steps[PARTS] >= 0).all().all()
    counted = steps[steps["status"] == StepStatus.COUNTED]
    for part in (StepPart.DATA_WAIT, StepPart.FORWARD, StepPart.BACKWARD, StepPart.OPTIMIZER):
        assert (counted[f"{part}_ns"] > 0).all(), part
    assert (counted["communication_ns"] == 0).all()  # one process: no collectives
    # The mean breakdown is over the counted steps, and its shares make the whole step.
    breakdown = report.breakdown.set_index("part")
    assert breakdown["step_pct"].sum() == pytest.approx(100.0)
    for part in StepPart:
        assert breakdown.loc[str(part), "mean_ns"] == pytest.approx(counted[f"{part}_ns"].mean())


@pytest.mark.torch
def test_the_wait_for_a_batch_is_data_wait_and_lies_in_the_breakdown(dataloader_run: Path) -> None:
    run = dlprof.load(dataloader_run)
    slices = run.slices
    iterations = slices[slices["name"].str.startswith(DATALOADER_ITERATION)]
    # One wait per batch and one more that found the loader empty: training's and evaluation's.
    assert len(iterations) == (6 + 1) + (2 + 1)
    assert set(iterations["kind"]) == {Kind.DATA_WAIT}
    steps = step_report(run).steps
    first = step_slices(run).iloc[1]
    waits = iterations[(iterations["start_ns"] >= first["start_ns"]) & (iterations["start_ns"] < first["end_ns"])]
    assert steps.loc[1, "data_wait_ns"] == waits["dur_ns"].sum() > 0


@pytest.mark.torch
@pytest.mark.slow
def test_with_a_worker_the_loop_waits_and_the_worker_fetches(tmp_path: Path) -> None:
    run = dlprof.load(profile_dataloader_loop(tmp_path / "worker", num_workers=1,
                                              collectors=("torch", "layers", "dataloader")))
    slices = run.slices
    waits, fetches = slices[slices["kind"] == Kind.DATA_WAIT], slices[slices["kind"] == Kind.DATALOADER]
    main_pid = int(step_slices(run)["pid"].iloc[0])
    assert len(waits) >= 6 and set(waits["pid"]) == {main_pid}
    # The six training batches are fetched in the worker; the evaluation's loader has none.
    assert (fetches["pid"] != main_pid).sum() == 6 and (fetches["pid"] == main_pid).sum() == 2
    steps = step_report(run).steps
    assert (steps[PARTS].sum(axis=1) == steps["dur_ns"]).all()
    assert (steps.loc[steps["status"] == StepStatus.COUNTED, "data_wait_ns"] > 0).all()


@pytest.mark.tf
@pytest.mark.slow
def test_keras_validation_falls_outside_every_training_step(tmp_path: Path) -> None:
    from tests.tensorflow_runs import BATCH, example_model, keras_example

    keras = keras_example().keras
    validations: list[tuple[int, int]] = []

    class ValidationTimes(keras.callbacks.Callback):  # type: ignore[misc]
        def on_test_begin(self, logs: Any = None) -> None:
            validations.append((time.time_ns(), 0))

        def on_test_end(self, logs: Any = None) -> None:
            validations[-1] = (validations[-1][0], time.time_ns())

    model, x, y = example_model()
    with dlprof.profile(out=tmp_path / "keras", collectors=("tensorflow", "keras_steps")):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, validation_split=0.25,
                  callbacks=[ValidationTimes()])
    run = dlprof.load(tmp_path / "keras")
    batches = 2 * int(len(x) * 0.75) // BATCH
    report = step_report(run)
    assert len(validations) == 2
    assert report.steps["status"].tolist() == [StepStatus.WARMUP, *[StepStatus.COUNTED] * (batches - 1),
                                               StepStatus.PARTIAL]
    trained = report.steps[report.steps["status"] != StepStatus.PARTIAL]
    for begin, end in validations:
        overlapping = trained[(trained["start_ns"] < end) & (trained["start_ns"] + trained["dur_ns"] > begin)]
        assert overlapping.empty, overlapping
    (row,) = report.statistics.to_dict("records")
    assert row["steps"] == batches - 1 and 0 < row["min_ns"] <= row["median_ns"] <= row["max_ns"]


# --- across threads, on GPUs, and dlprof's own pauses ---------------------------------------


def clipped_union(starts: pd.Series, ends: pd.Series, low: int, high: int) -> int:
    return union_length([(max(int(a), low), min(int(b), high)) for a, b in zip(starts, ends, strict=True)
                         if min(int(b), high) > max(int(a), low)])


def backward_slices(slices: pd.DataFrame) -> pd.DataFrame:
    """What autograd ran: the layers' backward slices and the engine's evaluate_function ops."""
    layers = (slices["kind"] == Kind.MODULE) & slices["name"].str.endswith(" backward")
    nodes = (slices["kind"] == Kind.OP) & slices["name"].str.startswith("autograd::engine::evaluate_function:")
    return slices[layers | nodes]


def test_backward_on_autograds_thread_has_its_share_on_the_host_and_the_gpu(h200_run: Path) -> None:
    run = dlprof.load(h200_run)
    report = step_report(run)
    slices = run.slices
    main = int(slices.loc[slices["kind"] == Kind.STEP, "tid"].iloc[0])
    backward = backward_slices(slices)
    assert set(backward["tid"]) == {6494} != {main}  # CUDA's backward runs on autograd's own thread
    ends = backward["start_ns"] + backward["dur_ns"]
    # The kernels launched from inside what autograd ran, by their runtime calls.
    calls = slices[(slices["kind"] == Kind.RUNTIME) & slices["correlation_id"].notna()]
    inside = [any((backward["tid"] == c.tid) & (backward["start_ns"] <= c.start_ns) & (ends > c.start_ns))
              for c in calls.itertuples()]
    launched = calls[inside]["correlation_id"]
    work = slices[(slices["device"] != "cpu") & slices["correlation_id"].isin(launched)]
    assert len(work) > 6_000
    devices = report.device_steps.set_index("step")
    for step in report.steps.itertuples():
        low, high = int(step.start_ns), int(step.start_ns + step.dur_ns)
        assert step.backward_ns == clipped_union(backward["start_ns"], ends, low, high), step.step
        assert devices.loc[step.step, "backward_ns"] == clipped_union(
            work["start_ns"], work["start_ns"] + work["dur_ns"], low, high), step.step
    parts = report.breakdown.set_index("part")["step_pct"]
    assert parts["backward"] > 25 and parts["forward"] > 50 and parts["other"] < 5
    assert (report.steps[PARTS].sum(axis=1) == report.steps["dur_ns"]).all()
    gpu = report.device_steps
    assert (gpu[[*PARTS, "idle_ns"]].sum(axis=1) == gpu["dur_ns"]).all()
    assert (gpu[[*PARTS, "idle_ns"]] >= 0).all().all()
    shares = report.device_breakdown.set_index("part")["step_pct"]
    assert shares.sum() == pytest.approx(100.0) and 70 < shares["idle"] < 85


def test_a_pause_of_dlprofs_on_a_gpu_run_is_neither_the_users_step_nor_the_gpus_idle_time(
        h200_run: Path, h200_paused_run: Path) -> None:
    """The save inside ProfilerStep#16, marked as the pause it was: the host's breakdown gives it
    to profiler, and so does the GPU's, which sat idle because dlprof held the program."""
    before, after = step_report(dlprof.load(h200_run)), step_report(dlprof.load(h200_paused_run))
    run = dlprof.load(h200_paused_run)
    ((start, dur),) = run.query("SELECT start_ns, dur_ns FROM slices WHERE kind = 'profiler'").rows
    work = run.slices[run.slices["device"] != "cpu"]
    busy = clipped_union(work["start_ns"], work["start_ns"] + work["dur_ns"], start, start + dur)
    host = {name: r.set_index("step").loc["ProfilerStep#16"] for name, r in (("old", before.steps),
                                                                              ("new", after.steps))}
    assert host["new"]["profiler_ns"] == dur and host["old"]["profiler_ns"] == 0
    assert host["old"]["forward_ns"] - host["new"]["forward_ns"] == dur  # it held a GELU's forward
    gpu = {name: r.set_index("step").loc["ProfilerStep#16"] for name, r in (("old", before.device_steps),
                                                                             ("new", after.device_steps))}
    assert gpu["new"]["profiler_ns"] == dur - busy > 0.99 * dur
    assert gpu["old"]["idle_ns"] - gpu["new"]["idle_ns"] == dur - busy
    assert (after.device_steps[[*PARTS, "idle_ns"]].sum(axis=1) == after.device_steps["dur_ns"]).all()
    # The user's steps: the longest is 810 ms with the pause, under 80 ms without it.
    assert before.statistics["max_ns"].item() > 800e6 > 80e6 > after.statistics["max_ns"].item()


def test_an_imported_trace_with_phase_ranges_reads_its_phases(tmp_path: Path) -> None:
    """HTA's A100 trace: ``## forward ##``, ``## backward ##`` and ``## optimizer ##`` ranges on
    the main thread, autograd's ops on another; once nearly all of it read as other."""
    from tests.builders import write_imported_run
    from tests.conftest import KINETO_TRACES

    (trace,) = (KINETO_TRACES / "trace_diff" / "control").glob("*.json.gz")
    report = step_report(dlprof.load(write_imported_run(tmp_path / "a100", trace, (3,))))
    shares = report.breakdown.set_index("part")["step_pct"]
    assert shares["forward"] > 20 and shares["backward"] > 40 and shares["optimizer"] > 3
    assert shares["communication"] > 1 and shares["other"] < 30
    gpu = report.device_breakdown.set_index("part")["step_pct"]
    assert gpu["communication"] > 30 and gpu["backward"] > 20  # NCCL kernels, launched from collectives


def test_parts_across_threads_and_dlprofs_pauses(tmp_path: Path) -> None:
    from tests.builders import op, write_rows_run

    run = write_rows_run(tmp_path / "hand", [
        op(1, "ProfilerStep#0", 0, 1000, kind="step"),
        op(2, "ProfilerStep#1", 1000, 1000, kind="step"),
        op(3, "ProfilerStep#2", 2000, 1000, kind="step"),
        op(4, "model (Net) forward", 1000, 300, kind="module"),
        op(5, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1100, 50, kind="data_wait"),
        # The main thread waits in backward; autograd's thread runs it, a collective in it.
        op(6, "model (Net) backward", 1300, 400, tid=2, kind="module"),
        op(7, "autograd::engine::evaluate_function: MmBackward0", 1350, 100, tid=2),
        op(8, "c10d::allreduce_", 1500, 100, tid=2, kind="comm"),
        op(9, "Optimizer.step#SGD.step", 1750, 200, kind="user_annotation"),
        # dlprof saving in the middle of the optimizer's step; a fetch on another thread is no wait.
        op(10, "dlprof::save", 1800, 60, kind="profiler"),
        op(11, "fetch", 1200, 300, tid=3, kind="dataloader"),
        op(12, "model (Net) forward", 2000, 100, kind="module"),
        # torch.compile compiling the forward it is called in: set-up, carved out of the forward.
        op(13, "inductor_compile", 1010, 30, kind="compile"),
    ])
    report = step_report(run)
    step = report.steps.set_index("step").loc["ProfilerStep#1"]
    assert {p: int(step[f"{p}_ns"]) for p in StepPart} == {
        "data_wait": 50, "forward": 220, "backward": 300, "optimizer": 140, "communication": 100,
        "compile": 30, "profiler": 60, "other": 100}
    (row,) = report.statistics.to_dict("records")
    # #0 is the warm-up; #1 and #2 count (no manifest names a partial step), and #1's user time
    # leaves dlprof's 60 ns out.
    assert row["steps"] == 2 and row["min_ns"] == 1000 - 60
    assert report.device_steps.empty and report.device_breakdown.empty
