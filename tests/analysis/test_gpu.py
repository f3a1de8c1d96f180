"""GPU busy/idle time, its split by kind, steps and launch delays, against the raw traces.

The expected figures are computed here straight from the recorded Kineto JSON (``json`` and
``gzip``, exact decimal timestamps), with other algorithms than dlprof's: a sweep over interval
boundaries for the unions, a loop over steps for the windows, ``statistics`` for the quantiles.
A hand-built run with kernels overlapping on two streams checks the definitions number by number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.gpu import ALL, BREAKDOWN_COLUMNS, cpu_steps, device_work, gpu_breakdown
from dlprof.keys import StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.builders import write_imported_run
from tests.conftest import KINETO_TRACES
from tests.references import reference, union_length

# Recorded traces: two A100 benchmarks, three streams with event syncs, two steps of a
# production model on many streams, an MI250 trace with a step that launches nothing, and six
# steps of a model whose GPU runs up to 57 ms behind its CPU, with kernels overlapping on one
# stream and work linked to no runtime call.
TRACES = {
    "simple_add": "critical_path/simple_add",
    "alexnet": "critical_path/alexnet",
    "event_sync": "critical_path/cuda_event_sync_multi_stream",
    "sampled": "timeline_analysis",
    "mi250": "amd_trace",
    "lagging": "trace_diff/test",
}
def trace_file(name: str) -> Path:
    (found,) = (KINETO_TRACES / TRACES[name]).glob("*.json.gz")
    return found


class ImportedRuns(dict[str, Path]):
    """Each trace imported into a run directory (rank 0) by dlprof's importer, when first asked."""

    def __init__(self, parent: Path) -> None:
        super().__init__()
        self.parent = parent

    def __missing__(self, name: str) -> Path:
        self[name] = write_imported_run(self.parent / name, trace_file(name), (0,))
        return self[name]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> ImportedRuns:
    return ImportedRuns(tmp_path_factory.mktemp("gpu-runs"))


# --- the reference, from the raw JSON -----------------------------------------------------


@pytest.mark.parametrize("name", list(TRACES))
def test_breakdown_matches_the_raw_trace(imported: dict[str, Path], name: str) -> None:
    table = gpu_breakdown(dlprof.load(imported[name]))
    expected, _ = reference(trace_file(name))
    assert list(table.columns) == BREAKDOWN_COLUMNS
    assert table[["device", "step"]].values.tolist() == [[r["device"], r["step"]] for r in expected]
    for got, want in zip(table.to_dict("records"), expected, strict=True):
        for column, value in want.items():
            if isinstance(value, float):
                assert got[column] == pytest.approx(value), (got["step"], column)
            else:
                assert got[column] == value, (got["step"], column)
        if not want.get("launches"):
            assert pd.isna(got["delay_mean_ns"]) and pd.isna(got["delay_max_ns"])
        assert got["kernel_ns"] + got["memcpy_ns"] + got["memset_ns"] == got["busy_ns"]
        shares = got["kernel_pct"] + got["memcpy_pct"] + got["memset_pct"]
        assert shares == pytest.approx(100.0 if got["busy_ns"] else 0.0)
        assert got["busy_pct"] == pytest.approx(100.0 * got["busy_ns"] / got["span_ns"])


@pytest.mark.parametrize(("name", "steps"), [("simple_add", 0), ("alexnet", 0), ("event_sync", 0),
                                             ("sampled", 2), ("mi250", 2), ("lagging", 6)])
def test_steps_and_kinds_are_counted(imported: dict[str, Path], name: str, steps: int) -> None:
    table = gpu_breakdown(dlprof.load(imported[name]))
    _, work = reference(trace_file(name))
    assert (table["step"] != ALL).sum() == steps
    whole = table[table["step"] == ALL].iloc[0]
    for kind, column in (("kernel", "kernels"), ("memcpy", "memcpys"), ("memset", "memsets")):
        assert whole[column] == sum(w.kind == kind for w in work)
    assert whole["launches"] == sum(w.kind == "kernel" and w.launch is not None for w in work)
    if steps:  # every piece of work in these traces was launched inside a step
        assert table.loc[table["step"] != ALL, "kernels"].sum() == whole["kernels"]


def test_overlap_on_real_traces_is_counted_once(imported: dict[str, Path]) -> None:
    # The production trace has hundreds of kernels overlapping across its streams.
    for name in ("sampled", "simple_add"):
        _, work = reference(trace_file(name))
        table = gpu_breakdown(dlprof.load(imported[name]))
        whole = table[table["step"] == ALL].iloc[0]
        assert whole["busy_ns"] < sum(w.end - w.start for w in work)
        assert whole["busy_ns"] == union_length([(w.start, w.end) for w in work])
    # Three streams, each kernel after an event sync: despite the streams, nothing overlaps.
    run = dlprof.load(imported["event_sync"])
    work = device_work(run)
    assert sorted(work["stream"].unique().tolist()) == [20, 24, 28]
    whole = gpu_breakdown(run).iloc[-1]
    assert whole["busy_ns"] == int((work["end_ns"] - work["start_ns"]).sum())


def test_a_gpu_behind_its_cpu_gets_windows_that_do_not_overlap(imported: dict[str, Path]) -> None:
    run = dlprof.load(imported["lagging"])
    table = gpu_breakdown(run)
    steps = table[table["step"] != ALL]
    cpu = cpu_steps(run)
    ends = (steps["start_ns"] + steps["span_ns"]).tolist()
    # The GPU finishes step 1009's work 57 ms after the CPU has moved on to step 1010 ...
    assert ends[0] > cpu["start_ns"].iloc[1] + 50_000_000
    # ... so step 1010's window opens only then, and no time is counted in two windows.
    assert steps["start_ns"].iloc[1] == ends[0]
    assert all(later >= end for later, end in zip(steps["start_ns"].iloc[1:], ends[:-1], strict=False))
    # Busy nearly all the time: the wait behind the previous step's work is not idle time.
    assert (steps["busy_pct"] > 95).all()


def test_device_work_links_launches_and_steps(imported: dict[str, Path]) -> None:
    work = device_work(dlprof.load(imported["sampled"]))
    _, raw = reference(trace_file("sampled"))
    assert len(work) == len(raw)
    assert work["launch_ns"].notna().all()
    assert (work["start_ns"] >= work["launch_ns"]).all()  # no kernel starts before its launch
    assert work.groupby("step").size().to_dict() == {"ProfilerStep#551": 602, "ProfilerStep#552": 602}


def test_no_device_activity_gives_an_empty_table(tmp_path: Path) -> None:
    (cpu_only,) = (KINETO_TRACES / "cpu_only").glob("*.json.gz")
    run = dlprof.load(write_imported_run(tmp_path / "cpu", cpu_only, (0,)))
    table = gpu_breakdown(run)
    assert table.empty and list(table.columns) == BREAKDOWN_COLUMNS


# --- a hand-built run ---------------------------------------------------------------------


def slice_row(i: int, kind: str, name: str, start: int, end: int, device: str = "cpu",
              stream: int | None = None, correlation: int | None = None) -> dict[str, Any]:
    return {"id": i, "pid": 1, "tid": stream if stream is not None else 1, "device": device, "kind": kind,
            "name": name, "start_ns": start, "dur_ns": end - start, "correlation_id": correlation,
            "stream": stream}


def write_run(directory: Path, rows: list[dict[str, Any]]) -> dlprof.Run:
    Manifest(name="hand", command=["hand"]).write(directory)
    table = pa.table({key: [row[key] for row in rows] for key in rows[0]})
    for name in ("kind", "name", "device"):
        position = table.schema.get_field_index(name)
        table = table.set_column(position, name, table.column(name).dictionary_encode())
    writer = RankWriter(directory, 0)
    writer.write_chunk(StoreTable.SLICES, table, "test")
    writer.compact()
    return dlprof.load(directory)


def launch(i: int, at: int, correlation: int) -> dict[str, Any]:
    return slice_row(i, "runtime", "cudaLaunchKernel", at, at + 5, correlation=correlation)


def gpu(i: int, kind: str, start: int, end: int, stream: int, correlation: int | None = None,
        device: str = "cuda:0") -> dict[str, Any]:
    return slice_row(i, kind, f"{kind}{i}", start, end, device, stream, correlation)


@pytest.fixture
def hand_run(tmp_path: Path) -> dlprof.Run:
    """Three steps; on cuda:0, kernels overlapping on streams 7 and 8, a copy over a kernel, a
    memset under the copy, a step whose kernel runs after its CPU end, unlinked work; one kernel
    on cuda:1."""
    return write_run(tmp_path / "hand", [
        slice_row(1, "step", "ProfilerStep#0", 0, 1000),
        slice_row(2, "step", "ProfilerStep#1", 1000, 2000),
        slice_row(3, "step", "ProfilerStep#2", 2000, 3000),
        launch(10, 50, 1), launch(11, 60, 2), launch(12, 70, 3), launch(13, 80, 4),
        launch(14, 90, 7), launch(15, 1100, 5), launch(16, 2100, 6),
        gpu(20, "kernel", 100, 400, 7, 1),
        gpu(21, "kernel", 300, 600, 8, 2),  # overlaps kernel 20 on the other stream
        gpu(22, "memcpy", 550, 700, 7, 3),  # overlaps kernel 21: only 600-700 is the copy's
        gpu(23, "memset", 650, 680, 8, 4),  # entirely under the copy
        gpu(24, "kernel", 2100, 2500, 7, 5),  # step 1's, running after step 1 ended on the CPU
        gpu(25, "memset", 1500, 1550, 8),  # no correlation: belongs where it starts
        gpu(26, "kernel", 2500, 2600, 7, 6),
        gpu(27, "kernel", 2900, 2950, 8, 99),  # a correlation with no runtime call
        gpu(28, "kernel", 3100, 3200, 7),  # after every step
        gpu(29, "kernel", 200, 300, 1, 7, device="cuda:1"),
    ])


def test_hand_built_run_figure_by_figure(hand_run: dlprof.Run) -> None:
    table = gpu_breakdown(hand_run).set_index(["device", "step"])
    columns = ["start_ns", "span_ns", "busy_ns", "idle_ns", "kernel_ns", "memcpy_ns", "memset_ns",
               "kernels", "memcpys", "memsets", "launches"]
    expected = {
        # window [0, 1000]: busy = [100, 700]; kernels [100, 600]; the copy adds 600-700.
        ("cuda:0", "ProfilerStep#0"): [0, 1000, 600, 400, 500, 100, 0, 2, 1, 1, 2],
        # window runs on to the end of its kernel at 2500; the unlinked memset counts here.
        ("cuda:0", "ProfilerStep#1"): [1000, 1500, 450, 1050, 400, 0, 50, 1, 0, 1, 1],
        # starts where step 1's window ended, not at its CPU start (2000).
        ("cuda:0", "ProfilerStep#2"): [2500, 500, 150, 350, 150, 0, 0, 2, 0, 0, 1],
        ("cuda:0", ALL): [100, 3100, 1300, 1800, 1150, 100, 50, 6, 1, 2, 4],
        ("cuda:1", "ProfilerStep#0"): [0, 1000, 100, 900, 100, 0, 0, 1, 0, 0, 1],
        ("cuda:1", "ProfilerStep#1"): [1000, 1000, 0, 1000, 0, 0, 0, 0, 0, 0, 0],
        ("cuda:1", "ProfilerStep#2"): [2000, 1000, 0, 1000, 0, 0, 0, 0, 0, 0, 0],
        ("cuda:1", ALL): [200, 100, 100, 0, 100, 0, 0, 1, 0, 0, 1],
    }
    assert list(table.index) == list(expected)
    for key, values in expected.items():
        assert table.loc[key, columns].tolist() == values, key
    delays = table[["delay_mean_ns", "delay_p50_ns", "delay_p95_ns", "delay_max_ns"]]
    assert delays.loc[("cuda:0", "ProfilerStep#0")].tolist() == pytest.approx([145.0, 145.0, 230.5, 240.0])
    assert delays.loc[("cuda:0", "ProfilerStep#1")].tolist() == [1000.0] * 4
    assert delays.loc[("cuda:0", ALL)].tolist() == pytest.approx([422.5, 320.0, 910.0, 1000.0])
    assert delays.loc[("cuda:1", "ProfilerStep#1")].isna().all()
    # Kernel 26 (launched at 2100) waits behind kernel 24 until 2500: all of its delay is queueing;
    # kernel 24's stream was free (the copy ended at 700) when it was launched at 1100.
    waits = table[["queued", "queue_mean_ns", "queue_max_ns", "launch_mean_ns", "launch_max_ns"]]
    assert waits.loc[("cuda:0", "ProfilerStep#0")].tolist() == [0, 0.0, 0.0, 145.0, 240.0]
    assert waits.loc[("cuda:0", "ProfilerStep#1")].tolist() == [0, 0.0, 0.0, 1000.0, 1000.0]
    assert waits.loc[("cuda:0", "ProfilerStep#2")].tolist() == [1, 400.0, 400.0, 0.0, 0.0]
    assert waits.loc[("cuda:0", ALL)].tolist() == [1, 100.0, 400.0, 322.5, 1000.0]
    assert table.loc[("cuda:0", "ProfilerStep#0"), "busy_pct"] == pytest.approx(60.0)
    assert table.loc[("cuda:0", "ProfilerStep#0"), "kernel_pct"] == pytest.approx(500 / 6)


def test_hand_built_device_work(hand_run: dlprof.Run) -> None:
    work = device_work(hand_run).set_index("id")
    # The copy (launched at 70) queues behind kernel 20 until 400; the memset (80) behind kernel 21.
    assert work.loc[[20, 21, 22, 23, 26], "queue_ns"].tolist() == [0, 0, 330, 520, 400]
    assert work.loc[[20, 21, 22, 23, 26], "launch_cost_ns"].tolist() == [50, 240, 150, 50, 0]
    assert pd.isna(work.loc[25, "queue_ns"]) and pd.isna(work.loc[27, "launch_cost_ns"])
    assert work.loc[24, "step"] == "ProfilerStep#1" and work.loc[24, "launch_ns"] == 1100
    assert work.loc[25, "step"] == "ProfilerStep#1" and pd.isna(work.loc[25, "launch_ns"])
    assert work.loc[27, "step"] == "ProfilerStep#2" and pd.isna(work.loc[27, "launch_ns"])
    assert pd.isna(work.loc[28, "step"])
    assert work.loc[29, "device"] == "cuda:1"


def test_rank_filter_and_a_run_without_steps(tmp_path: Path) -> None:
    run = dlprof.load(write_imported_run(tmp_path / "two", trace_file("simple_add"), (0, 1)))
    both = gpu_breakdown(run)
    assert both["rank"].tolist() == [0, 1] and both["step"].tolist() == [ALL, ALL]
    # The same trace on both ranks, equal correlation ids: each rank links only its own calls.
    assert both.drop(columns="rank").iloc[0].equals(both.drop(columns="rank").iloc[1])
    one = gpu_breakdown(run, rank=1)
    assert one["rank"].tolist() == [1]
    assert gpu_breakdown(run, rank=7).empty


# --- the H200 run -------------------------------------------------------------------------


def test_queueing_and_launch_cost_add_up_to_the_delay_per_kernel(h200_run: Path) -> None:
    run = dlprof.load(h200_run)
    work = device_work(run).set_index("id")
    # Independently: each kernel's runtime call by correlation id, and each stream's work in order.
    slices = run.slices
    calls = slices[slices["kind"] == "runtime"].dropna(subset=["correlation_id"])
    on_device = slices[slices["device"] != "cpu"].sort_values(["tid", "start_ns", "dur_ns"])
    free: dict[int, int] = {}
    expected: dict[int, tuple[int, int]] = {}
    launched_at = dict(zip(calls["correlation_id"].astype("int64"), calls["start_ns"], strict=True))
    for row in on_device.itertuples():
        launch = launched_at.get(int(row.correlation_id)) if pd.notna(row.correlation_id) else None
        if row.kind == "kernel" and launch is not None:
            delay = row.start_ns - launch
            queue = min(max(free.get(row.tid, launch) - launch, 0), max(delay, 0))
            expected[int(row.id)] = (delay, queue)
        free[row.tid] = max(free.get(row.tid, row.start_ns), row.start_ns + row.dur_ns)
    kernels = work.loc[list(expected)]
    delays = (kernels["start_ns"] - kernels["launch_ns"]).astype("int64")
    assert len(expected) == 12_472
    assert (kernels["queue_ns"] + kernels["launch_cost_ns"] == delays).all()
    assert kernels["queue_ns"].tolist() == [queue for _, queue in expected.values()]
    assert delays.tolist() == [delay for delay, _ in expected.values()]
    # The kernels that waited over a millisecond were queued: their launches cost microseconds.
    long = kernels[delays > 1_000_000]
    assert len(long) == 2_312 and (long["launch_cost_ns"] < 5_000).mean() > 0.95
    whole = gpu_breakdown(run).iloc[-1]
    assert whole["delay_mean_ns"] == pytest.approx(whole["launch_mean_ns"] + whole["queue_mean_ns"])
    assert whole["launch_p95_ns"] < 50_000 < 5_000_000 < whole["queue_p95_ns"]
