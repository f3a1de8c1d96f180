"""Rank analysis against raw traces and a hand-built job: compute, communication, overlap and idle
time per rank and step, arrivals at collectives, stragglers, and top's spread over ranks.

The recorded pair is two ranks (0 and 1) of one 128-rank NCCL job on A100s, from Holistic Trace
Analysis's tests; the expected figures are computed here from their raw JSON (``json``, exact
decimals) with a sweep over interval boundaries and ``statistics.median``, not with dlprof's code.
The GPU windows come from the GPU tests' own reference, also computed from the raw JSON.
"""

from __future__ import annotations

import functools
import gzip
import json
import statistics
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.aggregate import PER_RANK_COLUMNS, top
from dlprof.analysis.gpu import ALL, gpu_breakdown
from dlprof.analysis.ranks import (
    ARRIVAL_COLUMNS,
    STEP_COLUMNS,
    SUMMARY_COLUMNS,
    collective_arrivals,
    is_collective_kernel,
    rank_steps,
    rank_summary,
    stragglers,
)
from dlprof.importers.trace_file import import_traces
from dlprof.keys import StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.conftest import EXAMPLES, KINETO_TRACES, dlprof_program
from tests.references import reference, union_length

RANK_TRACES = [KINETO_TRACES / "timeline_analysis" / "sampled_rank-0.json.gz",
               KINETO_TRACES / "trace_filter" / "sampled_rank-1.json.gz"]


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory: pytest.TempPathFactory) -> dlprof.Run:
    """The two recorded ranks imported as one run, as ``dlprof import`` does."""
    run_dir = tmp_path_factory.mktemp("ranks") / "nccl"
    import_traces(RANK_TRACES, run_dir)
    return dlprof.load(run_dir)


# --- the reference, from the raw JSON -----------------------------------------------------


@dataclass
class Kernel:
    name: str
    start: int
    end: int
    launch: int | None


@dataclass
class RawRank:
    steps: list[tuple[int, int, str]]  # start, end, name, in time order
    kernels: list[Kernel]
    copies: list[tuple[int, int]]  # memcpy and memset


def ns(us: int | Decimal) -> int:
    return int(Decimal(us) * 1000)


def raw_rank(path: Path) -> RawRank:
    trace = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    launches = {e["args"]["correlation"]: ns(e["ts"]) for e in spans
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    return RawRank(
        steps=sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]) for e in spans
                     if e["name"].startswith("ProfilerStep#")),
        kernels=[Kernel(e["name"], ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]),
                        launches.get(e["args"].get("correlation"))) for e in spans if e.get("cat") == "kernel"],
        copies=[(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in spans
                if e.get("cat") in ("gpu_memcpy", "gpu_memset")],
    )


def nccl(kernel: Kernel) -> bool:
    return kernel.name.startswith("ncclKernel_")  # what these traces' collectives are called


def clip(intervals: list[tuple[int, int]], low: int, high: int) -> list[tuple[int, int]]:
    return [(max(s, low), min(e, high)) for s, e in intervals]


@functools.cache
def expected_steps(path: Path) -> list[dict[str, Any]]:
    """Each step's split of its GPU window, and its collective kernels in order."""
    raw = raw_rank(path)
    windows = [(row["start_ns"], row["start_ns"] + row["span_ns"]) for row in reference(path)[0]
               if row["step"] != ALL]
    rows = []
    for i, ((start, end, name), (low, high)) in enumerate(zip(raw.steps, windows, strict=True)):
        comm = [(k.start, k.end) for k in raw.kernels if nccl(k)]
        compute = [(k.start, k.end) for k in raw.kernels if not nccl(k)]
        busy = union_length(clip(comm + compute + raw.copies, low, high))
        working = union_length(clip(comm + compute, low, high))
        comm_ns, compute_ns = union_length(clip(comm, low, high)), union_length(clip(compute, low, high))

        def owned(k: Kernel, i: int = i) -> bool:  # launched in this step
            at = k.launch if k.launch is not None else k.start
            return raw.steps[i][0] <= at < raw.steps[i][1]

        rows.append({
            "step": name, "step_ns": end - start, "window_start_ns": low, "span_ns": high - low,
            "compute_ns": compute_ns, "comm_ns": comm_ns, "overlap_ns": compute_ns + comm_ns - working,
            "memory_ns": busy - working, "idle_ns": high - low - busy,
            "arrivals": sorted((k.start, k.name) for k in raw.kernels if nccl(k) and owned(k)),
        })
    return rows


def expected_lags(threshold: float) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (step, rank): step lag against the other rank, arrival lag as the time the other
    waited for it less the time it waited for the other, flagged when the arrival lag (the step lag in a step without
    collectives) is positive and over the threshold."""
    steps = {rank: expected_steps(path) for rank, path in enumerate(RANK_TRACES)}
    result: dict[tuple[str, int], dict[str, Any]] = {}
    for position, row in enumerate(steps[0]):
        name = row["step"]
        assert steps[1][position]["step"] == name  # the ranks recorded the same steps
        median_step = statistics.median(steps[r][position]["step_ns"] for r in steps)
        arrivals: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
        for rank in steps:
            seen: dict[str, int] = defaultdict(int)
            for start, kernel in steps[rank][position]["arrivals"]:
                seen[kernel] += 1
                arrivals[(kernel, seen[kernel])][rank] = start
        for rank in steps:
            other = 1 - rank
            met = [(at[rank], at[other]) for at in arrivals.values() if rank in at and other in at]
            lags = [at for at in arrivals.values() if rank in at]
            step_lag = steps[rank][position]["step_ns"] - steps[other][position]["step_ns"]
            # The time the other waited for it, less the time it waited, each wait counted once.
            held = union_length([(theirs, mine) for mine, theirs in met if mine > theirs])
            waited = union_length([(mine, theirs) for mine, theirs in met if mine < theirs])
            arrival_lag = held - waited
            result[(name, rank)] = {
                "step_lag_ns": step_lag, "arrival_lag_ns": arrival_lag,
                # The arrivals decide; the step time only in a step without collectives.
                "straggler": (arrival_lag if lags else step_lag) > max(0.0, threshold / 100 * median_step),
            }
    return result


# --- real traces ---------------------------------------------------------------------------


def test_collective_kernels_are_recognised() -> None:
    for name in ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                 "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 "ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "rcclKernel_AllReduce"):
        assert is_collective_kernel(name), name
    for name in ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
                 "ampere_sgemm_128x64_tn", "Memcpy DtoD (Device -> Device)", "nccl:all_reduce"):
        assert not is_collective_kernel(name), name


def test_split_of_each_step_matches_the_raw_traces(nccl_run: dlprof.Run) -> None:
    table = rank_steps(nccl_run)
    assert list(table.columns) == STEP_COLUMNS
    for rank, path in enumerate(RANK_TRACES):
        mine = table[table["rank"] == rank]
        expected = expected_steps(path)
        assert mine["step"].tolist() == [row["step"] for row in expected]
        assert (mine["measured_on"] == f"cuda:{rank}").all()
        for got, want in zip(mine.to_dict("records"), expected, strict=True):
            for column, value in want.items():
                if column == "arrivals":
                    assert got["collectives"] == len(value)
                else:
                    assert got[column] == value, (rank, got["step"], column)
            assert got["compute_pct"] == pytest.approx(100 * want["compute_ns"] / want["span_ns"])
            assert got["overlap_pct"] == pytest.approx(100 * want["overlap_ns"] / want["comm_ns"])
            covered = got["compute_ns"] + got["comm_ns"] - got["overlap_ns"] + got["memory_ns"]
            assert covered + got["idle_ns"] == got["span_ns"]


def test_windows_are_the_gpu_analysis_windows(nccl_run: dlprof.Run) -> None:
    steps = rank_steps(nccl_run)
    gpu = gpu_breakdown(nccl_run)
    gpu = gpu[gpu["step"] != ALL]
    assert steps["window_start_ns"].tolist() == gpu["start_ns"].tolist()
    assert steps["span_ns"].tolist() == gpu["span_ns"].tolist()


def test_arrivals_and_stragglers_match_the_raw_traces(nccl_run: dlprof.Run) -> None:
    arrivals = collective_arrivals(nccl_run)
    assert list(arrivals.columns) == ARRIVAL_COLUMNS
    # Two ranks: each lags the other's arrival, so the lags of a pair cancel exactly and only
    # the later of the two lags at all.
    pairs = arrivals.groupby(["step", "collective", "occurrence"])["lag_ns"]
    assert (pairs.size() == 2).all() and (pairs.sum() == 0).all()
    assert ((pairs.max() >= 0) & (pairs.min() <= 0)).all()
    for threshold in (0.0, 5.0, 10.0, 20.0):
        expected = expected_lags(threshold)
        table = rank_steps(nccl_run, threshold)
        got = {(row["step"], row["rank"]): row for row in table.to_dict("records")}
        assert set(got) == set(expected)
        for key, want in expected.items():
            assert got[key]["step_lag_ns"] == want["step_lag_ns"], key
            assert got[key]["arrival_lag_ns"] == want["arrival_lag_ns"], key
            assert got[key]["straggler"] == want["straggler"], (threshold, key)
        late = stragglers(nccl_run, threshold)
        assert sorted(zip(late["step"], late["rank"], strict=True)) == sorted(
            key for key, want in expected.items() if want["straggler"])
        # At most one of two ranks held the other up in a step, whatever the threshold.
        assert (late.groupby("step").size() <= 1).all()
    # The recorded job has a straggler at the default threshold: rank 1 reached a collective late.
    assert any(expected_lags(10.0)[key]["straggler"] for key in expected_lags(10.0))


def test_summary_adds_up_the_steps(nccl_run: dlprof.Run) -> None:
    steps = rank_steps(nccl_run)
    summary = rank_summary(nccl_run)
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert summary["rank"].tolist() == [0, 1]
    for row in summary.to_dict("records"):
        mine = steps[steps["rank"] == row["rank"]]
        for column in ("span_ns", "compute_ns", "comm_ns", "overlap_ns", "idle_ns", "collectives"):
            assert row[column] == mine[column].sum()
        assert row["steps"] == 2
        assert row["step_median_ns"] == statistics.median(mine["step_ns"])
        assert row["straggler_steps"] == int(mine["straggler"].sum())
        assert row["max_lag_pct"] == max(mine["step_lag_pct"].max(), mine["arrival_lag_pct"].max())
        assert row["comm_pct"] == pytest.approx(100 * row["comm_ns"] / row["span_ns"])


def test_identical_ranks_have_no_straggler(two_rank_run: Path) -> None:
    """The same trace as two ranks, without steps: one window each, equal, nothing lags."""
    run = dlprof.load(two_rank_run)
    steps = rank_steps(run)
    assert steps["step"].tolist() == [ALL, ALL]
    assert steps.drop(columns="rank").iloc[0].equals(steps.drop(columns="rank").iloc[1])
    assert (steps["step_lag_ns"] == 0).all() and not steps["straggler"].any()
    assert stragglers(run, threshold_pct=0.0).empty
    # Its window is the GPU's whole span, as `dlprof gpu` has it.
    whole = gpu_breakdown(run).iloc[0]
    assert steps["span_ns"].iloc[0] == whole["span_ns"]
    assert steps["compute_ns"].iloc[0] == whole["kernel_ns"]  # no collective kernels in it
    assert rank_summary(run)["steps"].tolist() == [0, 0]


def test_a_gloo_rank_is_measured_on_its_cpu(tmp_path: Path) -> None:
    (path,) = (KINETO_TRACES / "cpu_only").glob("*.json.gz")
    import_traces([path], tmp_path / "gloo")
    run = dlprof.load(tmp_path / "gloo")
    trace = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    base = int(trace["baseTimeNanoseconds"])
    ((start, end),) = [(base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"])) for e in spans
                       if e["name"].startswith("ProfilerStep#")]
    reduces = [(base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"])) for e in spans
               if e["name"] == "gloo:all_reduce"]
    ((row),) = rank_steps(run).to_dict("records")
    assert row["measured_on"] == "cpu" and row["rank"] == 34
    assert row["comm_ns"] == union_length(clip(reduces, start, end)) > 0
    assert row["collectives"] == sum(start <= s < end for s, _ in reduces)
    assert row["idle_ns"] == (end - start) - row["comm_ns"] - row["compute_ns"] + row["overlap_ns"]


# --- a hand-built job ----------------------------------------------------------------------


def span(i: int, kind: str, name: str, start: int, end: int, tid: int = 1) -> dict[str, Any]:
    return {"id": i, "pid": 7, "tid": tid, "device": "cpu", "kind": kind, "name": name,
            "start_ns": start, "dur_ns": end - start}


def write_job(directory: Path, ranks: dict[int, list[dict[str, Any]]]) -> dlprof.Run:
    Manifest(name="job", command=["job"], ranks=list(ranks), world_size=len(ranks)).write(directory)
    for rank, rows in ranks.items():
        table = pa.table({key: [row[key] for row in rows] for key in rows[0]})
        for name in ("kind", "name", "device"):
            table = table.set_column(table.schema.get_field_index(name), name, table.column(name).dictionary_encode())
        writer = RankWriter(directory, rank)
        writer.write_chunk(StoreTable.SLICES, table, "test")
        writer.compact()
    return dlprof.load(directory)


@pytest.fixture
def job(tmp_path: Path) -> dlprof.Run:
    """Two CPU ranks. Rank 0, step 3 [0, 1000]: on thread 1 an op [0, 400] enclosing an all-reduce
    [100, 300] (with a nested record_param_comms); on thread 2 an op [200, 500] running during
    it; a gloo all-reduce on thread 3 [600, 800]. Rank 0 also has a step 4 that rank 1 lacks.
    Rank 1, step 3 [50, 1250]: the same collectives, at 400 and 900."""
    return write_job(tmp_path / "job", {
        0: [
            span(1, "step", "ProfilerStep#3", 0, 1000),
            span(2, "op", "aten::backward", 0, 400),
            span(3, "comm", "c10d::allreduce_", 100, 300),
            span(4, "comm", "record_param_comms", 110, 290),
            span(5, "op", "aten::mm", 200, 500, tid=2),
            span(6, "comm", "gloo:all_reduce", 600, 800, tid=3),
            span(7, "step", "ProfilerStep#4", 1000, 1500),
            span(8, "op", "aten::add", 1100, 1200),
        ],
        1: [
            span(11, "step", "ProfilerStep#3", 50, 1250),
            span(12, "comm", "c10d::allreduce_", 400, 600),
            span(13, "comm", "gloo:all_reduce", 900, 1000, tid=3),
        ],
    })


def test_hand_built_job_figure_by_figure(job: dlprof.Run) -> None:
    table = rank_steps(job).set_index(["rank", "step"])
    columns = ["step_ns", "span_ns", "compute_ns", "comm_ns", "overlap_ns", "memory_ns", "idle_ns", "collectives"]
    # compute: [0, 100] and [300, 400] on thread 1 (not while it waits in the all-reduce), [200, 500]
    # on thread 2: 400. comm: [100, 300] and [600, 800]: 400; overlap [200, 300]: 100.
    assert table.loc[(0, "ProfilerStep#3"), columns].tolist() == [1000, 1000, 400, 400, 100, 0, 300, 2]
    assert table.loc[(0, "ProfilerStep#3"), "overlap_pct"] == pytest.approx(25.0)
    assert table.loc[(0, "ProfilerStep#4"), columns].tolist() == [500, 500, 100, 0, 0, 0, 400, 0]
    assert pd.isna(table.loc[(0, "ProfilerStep#4"), "overlap_pct"])  # nothing to overlap
    assert table.loc[(1, "ProfilerStep#3"), columns].tolist() == [1200, 1200, 0, 300, 0, 0, 900, 2]


def test_hand_built_job_lags(job: dlprof.Run) -> None:
    arrivals = collective_arrivals(job)
    # Outermost collectives only: the record_param_comms inside the all-reduce is no arrival.
    assert sorted(set(arrivals["collective"])) == ["c10d::allreduce_", "gloo:all_reduce"]
    lags = arrivals.set_index(["collective", "rank"])["lag_ns"]
    # Against the latest other arrival: rank 0 waited 300 at each, rank 1 held it up 300 at each.
    assert lags.to_dict() == {("c10d::allreduce_", 0): -300.0, ("c10d::allreduce_", 1): 300.0,
                              ("gloo:all_reduce", 0): -300.0, ("gloo:all_reduce", 1): 300.0}
    table = rank_steps(job, threshold_pct=10.0).set_index(["rank", "step"])
    # Median step 3: 1100. Rank 1: step lag 200 against rank 0's 1000 (18.2%), arrival lag
    # 300 + 300 (54.5%).
    late = table.loc[(1, "ProfilerStep#3")]
    assert late["median_step_ns"] == 1100 and late["step_lag_ns"] == 200
    assert late["step_lag_pct"] == pytest.approx(200 / 11)
    assert late["arrival_lag_ns"] == 600 and late["arrival_lag_pct"] == pytest.approx(600 / 11)
    assert late["late_collective"] == "c10d::allreduce_" and late["late_occurrence"] == 1
    assert late["straggler"]
    early = table.loc[(0, "ProfilerStep#3")]
    assert early["step_lag_ns"] == -200 and early["arrival_lag_ns"] == -600 and not early["straggler"]
    # Step 4 is rank 0's alone: nothing to lag.
    alone = table.loc[(0, "ProfilerStep#4")]
    assert alone["step_lag_ns"] == 0 and pd.isna(alone["arrival_lag_ns"]) and not alone["straggler"]
    assert rank_steps(job, threshold_pct=55.0)["straggler"].sum() == 0
    assert rank_steps(job, threshold_pct=20.0)["straggler"].sum() == 1  # by its arrivals alone
    assert stragglers(job, 9.0)[["step", "rank"]].values.tolist() == [["ProfilerStep#3", 1]]
    summary = rank_summary(job, 10.0).set_index("rank")
    assert summary["straggler_steps"].to_dict() == {0: 0, 1: 1}
    assert summary["steps"].to_dict() == {0: 2, 1: 1}


def meeting_rank(step_ns: int, allreduce_at: int, gloo_at: int) -> list[dict[str, Any]]:
    """One CPU rank's step 1 [0, step_ns] with two collectives it reaches at the times given."""
    return [span(1, "step", "ProfilerStep#1", 0, step_ns),
            span(2, "comm", "c10d::allreduce_", allreduce_at, allreduce_at + 50),
            span(3, "comm", "gloo:all_reduce", gloo_at, gloo_at + 50, tid=3)]


def flagged(run: dlprof.Run, threshold_pct: float = 0.0) -> list[int]:
    return stragglers(run, threshold_pct)["rank"].tolist()


def test_the_fastest_rank_is_never_a_straggler(tmp_path: Path) -> None:
    # Rank 0 arrives first everywhere and has the shortest step; rank 2 is last at the
    # all-reduce (by 50), rank 1 at the gloo all-reduce (by 60): rank 1 held the others up the
    # longer, net of the time it waited.
    run = write_job(tmp_path / "three", {0: meeting_rank(1000, 100, 500), 1: meeting_rank(1050, 150, 620),
                                         2: meeting_rank(1040, 200, 560)})
    lags = rank_steps(run).set_index("rank")
    assert lags["arrival_lag_ns"].to_dict() == {0: -220.0, 1: 10.0, 2: -10.0}
    # Against the median of the others: 1000 - 1045, 1050 - 1020, 1040 - 1025.
    assert lags["step_lag_ns"].to_dict() == {0: -45.0, 1: 30.0, 2: 15.0}
    assert flagged(run) == [1]


def test_arrival_jitter_that_cancels_flags_no_one(tmp_path: Path) -> None:
    # Two ranks, each last at one collective by the same 100 ns: neither held the other up
    # (against a median of two, each lagged by 50 at one collective and was flagged).
    run = write_job(tmp_path / "jitter", {0: meeting_rank(1000, 100, 600), 1: meeting_rank(1000, 200, 500)})
    assert rank_steps(run)["arrival_lag_ns"].tolist() == [0.0, 0.0]
    assert flagged(run) == []


def test_the_rank_waited_for_is_the_straggler_not_the_one_that_waited(tmp_path: Path) -> None:
    # Rank 1 reaches both collectives 400 ns late; rank 0 waits for it and so has the longer
    # step. Rank 1 alone is flagged, whose step lag is negative.
    run = write_job(tmp_path / "slow", {0: meeting_rank(1500, 100, 600), 1: meeting_rank(1400, 500, 1000)})
    lags = rank_steps(run).set_index("rank")
    assert lags["step_lag_ns"].to_dict() == {0: 100.0, 1: -100.0}
    assert lags["arrival_lag_ns"].to_dict() == {0: -800.0, 1: 800.0}
    assert flagged(run) == [1] and flagged(run, 55.0) == [1] and flagged(run, 56.0) == []


def test_a_run_without_slices_gives_empty_tables(tmp_path: Path) -> None:
    Manifest(name="empty", command=["python"]).write(tmp_path)
    RankWriter(tmp_path, 0).compact()
    run = dlprof.load(tmp_path)
    assert rank_steps(run).empty and list(rank_steps(run).columns) == STEP_COLUMNS
    assert rank_summary(run).empty and list(rank_summary(run).columns) == SUMMARY_COLUMNS
    assert collective_arrivals(run).empty and stragglers(run).empty


# --- top over ranks ------------------------------------------------------------------------


def raw_totals(path: Path) -> dict[str, int]:
    """Total time per CPU op name in one raw trace."""
    trace = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    totals: dict[str, int] = defaultdict(int)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and not e["name"].startswith(
                ("c10d::", "record_param_comms")):  # collectives are comm slices, not ops
            totals[e["name"]] += ns(e["dur"])
    return totals


def test_top_of_one_rank_and_spread_over_ranks(nccl_run: dlprof.Run) -> None:
    per_rank = [raw_totals(path) for path in RANK_TRACES]
    one = top(nccl_run, limit=None, rank=1)
    assert dict(zip(one["name"], one["total_ns"], strict=True)) == per_rank[1]
    spread = top(nccl_run, limit=None, per_rank=True)
    assert list(spread.columns[-len(PER_RANK_COLUMNS):]) == PER_RANK_COLUMNS
    for row in spread.to_dict("records"):
        totals = [ranks.get(row["name"], 0) for ranks in per_rank]
        assert row["total_ns"] == sum(totals)
        assert [row["rank_min_ns"], row["rank_max_ns"]] == [min(totals), max(totals)]
        assert row["rank_median_ns"] == statistics.median(totals)
        assert row["max_rank"] == totals.index(max(totals))
    # Rows only one rank has: the other counts zero.
    assert (spread["rank_min_ns"] == 0).any()
    # The table is the same with and without the spread, which only adds columns.
    plain = top(nccl_run, limit=None)
    assert spread[plain.columns].equals(plain)
    assert top(nccl_run, limit=None, rank=0, per_rank=True)["max_rank"].eq(0).all()


# --- a real gloo job -----------------------------------------------------------------------


@pytest.mark.torch
def test_a_real_two_rank_gloo_job(two_rank_gloo_run: Path) -> None:
    """DDP on two CPU processes: both ranks measured on their CPU threads, their collectives
    matched one to one, the communication time the union of their comm slices in each step."""
    run = dlprof.load(two_rank_gloo_run)
    steps = rank_steps(run)
    slices = run.slices
    assert sorted(steps["rank"].unique()) == [0, 1] and (steps["measured_on"] == "cpu").all()
    for row in steps.to_dict("records"):
        comm = slices[(slices["rank"] == row["rank"]) & (slices["kind"] == "comm")]
        intervals = list(zip(comm["start_ns"], comm["start_ns"] + comm["dur_ns"], strict=True))
        low, high = row["window_start_ns"], row["window_start_ns"] + row["span_ns"]
        assert row["comm_ns"] == union_length(clip(intervals, low, high))
        assert 0 <= row["overlap_ns"] <= min(row["comm_ns"], row["compute_ns"])
    # Every training step all-reduces the same gradients on both ranks: each collective of a
    # step on one rank has its partner on the other.
    arrivals = collective_arrivals(run)
    training = arrivals[arrivals["collective"].str.contains("all_reduce|allreduce")]
    assert len(training) and (training.groupby(["step", "collective", "occurrence"]).size() == 2).all()
    summary = rank_summary(run)
    assert (summary["comm_ns"] > 0).all() and (summary["compute_ns"] > 0).all()
    assert (summary["steps"] == steps.groupby("rank").size().to_numpy()).all()
    # However the two processes were scheduled, at most one of them held the other up in a
    # step, and a rank that waited for the other (a negative arrival lag) is never flagged.
    late = stragglers(run, threshold_pct=0.0)
    assert (late.groupby("step").size() <= 1).all()
    assert (late["arrival_lag_ns"].fillna(late["step_lag_ns"]) > 0).all()
    pairs = steps.groupby("step")["arrival_lag_ns"]
    assert (pairs.sum().abs() < 1e-6).all()  # two ranks: one's lag is the other's wait


SLOWED_STEPS = (4, 6)  # the optimizer's zero_grad calls (from 1) rank 1 sleeps in
SLEEP_S = 1.0  # longer than the ranks' skew at start-up on a loaded machine


@pytest.fixture(scope="module")
def slowed_job(tmp_path_factory: pytest.TempPathFactory) -> dlprof.Run:
    """The DDP example on two gloo ranks, rank 1 sleeping at the start of two steps, before
    the backward pass whose all-reduce rank 0 then waits in."""
    directory = tmp_path_factory.mktemp("slowed")
    script = directory / "slowed.py"
    script.write_text(
        "import os, runpy, sys, time, torch\n"
        "if os.environ['RANK'] == '1':\n"
        "    real, calls = torch.optim.SGD.zero_grad, [0]\n"
        "    def zero_grad(self, *a, **k):\n"
        "        calls[0] += 1\n"
        f"        if calls[0] in {SLOWED_STEPS!r}:\n"
        f"            time.sleep({SLEEP_S})\n"
        "        return real(self, *a, **k)\n"
        "    torch.optim.SGD.zero_grad = zero_grad\n"
        "sys.argv = ['ddp_train.py', '--steps', '8', '--workers', '0']\n"
        f"runpy.run_path({str(EXAMPLES / 'ddp_train.py')!r}, run_name='__main__')\n"
    )
    out = directory / "run"
    done = subprocess.run([*dlprof_program(), "run", "--nproc", "2", "-o", str(out), "--top", "0", str(script)],
                          check=False, capture_output=True, text=True, timeout=300, cwd=directory)
    assert done.returncode == 0, done.stderr[-3000:]
    return dlprof.load(out)


@pytest.mark.torch
@pytest.mark.slow
def test_a_rank_made_slow_is_the_straggler_in_the_steps_it_was_slow(slowed_job: dlprof.Run) -> None:
    steps = rank_steps(slowed_job)
    long_lags = steps[steps["arrival_lag_ns"] > SLEEP_S * 1e9 * 0.7]
    # Two steps, as far apart as the slowed zero_grad calls, in each of which rank 1 kept rank 0
    # waiting, and rank 0 waited as long.
    assert long_lags["rank"].tolist() == [1, 1]
    numbers = long_lags["step_number"].tolist()
    assert numbers[1] - numbers[0] == SLOWED_STEPS[1] - SLOWED_STEPS[0]
    late = stragglers(slowed_job)
    for number in numbers:
        assert late.loc[late["step_number"] == number, "rank"].tolist() == [1]
        waited = steps[(steps["step_number"] == number) & (steps["rank"] == 0)]["arrival_lag_ns"]
        assert float(waited.iloc[0]) < -SLEEP_S * 1e9 * 0.7
    # The sleep is counted once, though each wait shows in c10d::allreduce_ and gloo:all_reduce.
    assert (long_lags["arrival_lag_ns"] < SLEEP_S * 1e9 * 1.5).all()
    # Rank 0 never held rank 1 up by as much.
    assert (steps.loc[steps["rank"] == 0, "arrival_lag_ns"].fillna(0) < SLEEP_S * 1e9 * 0.7).all()
