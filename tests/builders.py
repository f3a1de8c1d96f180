"""Runs the tests build for themselves: from rows, from recorded traces, from counters.

Every run here is written through the store's own writer (chunks, compaction, manifest), so the
tests read it back as they would any run. What each builder makes:

- ``kineto_trace(folder)``: the one recorded Kineto trace in a folder of tests/data/kineto-traces;
  ``simple_add_trace()`` and ``cupti_profiler_trace()`` name the two most used.
- ``write_imported_run(run_dir, trace, ranks)``: a complete run of a recorded trace imported once
  per rank (slices, memory, counters).
- ``import_trace_run(run_dir, trace)``: a complete one-rank run of a trace's slices and its
  ``cuda_profiler_range`` metrics.
- ``write_counter_run(run_dir, kernels)``: ``Kernel`` rows one after another on one stream, with
  the hardware counters each carries (``counters(...)`` builds them; ``HAND_BUILT`` and
  ``COUNTED`` are the shared sets).
- ``op(...)``: one slice row as a dict; ``write_rows_run(directory, slices, memory)``: a complete
  one-rank run of such rows, loaded.
- ``Span`` and ``write_span_run(run_dir, spans)``: slices in milliseconds over several ranks and
  tracks (``NESTED`` and ``SEVERAL_TRACKS`` are the shared sets).
- ``slice_table(rows)``: a slices table of (id, tid, kind, name, start, dur) tuples;
  ``write_uncompacted_run(run_dir)``: a manifest and two chunks, not compacted;
  ``write_small_run(run_dir)``: a complete run of two steps of ops and a counter;
  ``write_killed_run(run_dir)``: a run whose processes were all killed with one save waiting in
  ``pending/`` (a chunk and a recorded torch.profiler trace), for ``dlprof finish``.
- ``imported_tensorflow_run(tf_profile, directory)``: TensorFlow's own profile imported, loaded.
- ``counted_run(out)``: three steps profiled with two CPU counters (skips where perf cannot count).
- ``profile_steps(out)`` and ``add_power(run_dir, watts)``: six steps profiled on the host, then
  NVML power samples covering the run written through the nvml collector's own translation.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.cupti_names import LEGACY_TO_PERFWORKS
from dlprof.collectors.nvml import Readings, readings_table
from dlprof.importers.kineto import KinetoOptions, convert_trace, read_trace
from dlprof.importers.trace_file import import_traces
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.ids import SLOT_IMPORT, id_base
from dlprof.store.manifest import Manifest
from dlprof.store.save_jobs import Cycle, CycleJob, PendingSaves, SaveJob
from dlprof.store.writer import RankWriter
from tests.conftest import KINETO_TRACES

US = 1_000  # nanoseconds
MS = 1_000_000  # nanoseconds
SECOND = 1_000_000_000  # nanoseconds
# The CUPTI counters hand-built kernels carry, by the names the store gives them.
SASS = "cupti:smsp__sass_thread_inst_executed_op_{}_pred_on.sum"
INST, CYCLES, WARPS, GLD = (f"cupti:{LEGACY_TO_PERFWORKS[n]}" for n in
                            ("inst_executed", "active_cycles", "active_warps", "gld_request"))
DRAM = "cupti:dram__bytes.sum"


def kineto_trace(folder: str) -> Path:
    """The one recorded trace in ``folder`` of tests/data/kineto-traces."""
    (found,) = (KINETO_TRACES / folder).glob("*.json.gz")
    return found


def simple_add_trace() -> Path:
    """The recorded A100 trace of HTA's ``critical_path/simple_add``: kernels on two streams,
    memcpy, memset, runtime calls with correlation ids."""
    return kineto_trace("critical_path/simple_add")


def write_imported_run(run_dir: Path, trace_path: Path, ranks: tuple[int, ...]) -> Path:
    """A complete run holding ``trace_path`` imported once for each of ``ranks``."""
    trace = read_trace(trace_path)
    counts: dict[str, int] = {}
    for rank in ranks:
        tables = convert_trace(trace, KinetoOptions(id_base=id_base(rank, SLOT_IMPORT)))
        writer = RankWriter(run_dir, rank)
        writer.write_chunk(StoreTable.SLICES, tables.slices, "import")
        writer.write_chunk(StoreTable.MEMORY, tables.memory, "import")
        writer.write_chunk(StoreTable.COUNTERS, tables.counters, "import")
        rank_counts, _ = writer.compact()
        for table, rows in rank_counts.items():
            counts[table] = counts.get(table, 0) + rows
    Manifest(
        name=run_dir.name,
        command=["python3.10", trace_path.name],
        status=RunStatus.COMPLETE,
        devices=trace.get("deviceProperties", []),
        ranks=list(ranks),
        world_size=len(ranks),
        counts=counts,
    ).write(run_dir)
    return run_dir


def cupti_profiler_trace() -> Path:
    """HTA's ``cupti_profiler`` A100 trace: 77 ``cuda_profiler_range`` events with SASS counters."""
    return kineto_trace("cupti_profiler")


def import_trace_run(run_dir: Path, trace_path: Path) -> Path:
    """A complete one-rank run of a Kineto trace: slices AND its cuda_profiler_range metrics."""
    tables = convert_trace(read_trace(trace_path), KinetoOptions(id_base=id_base(0, SLOT_IMPORT)))
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, tables.slices, "import")
    writer.write_chunk(StoreTable.METRICS, tables.metrics, "import")
    counts, _ = writer.compact()
    Manifest(name=run_dir.name, command=["import", trace_path.name], status=RunStatus.COMPLETE,
             devices=tables.devices, counts=counts).write(run_dir)
    return run_dir


A100 = {"id": 0, "name": "NVIDIA A100", "numSms": 108, "maxThreadsPerMultiprocessor": 2048,
        "warpSize": 32, "regsPerMultiprocessor": 65536}


@dataclass(frozen=True)
class Kernel:
    """One slice of a hand-built GPU run, with the counters measured over it."""

    name: str
    dur_us: int
    counters: dict[str, float] = field(default_factory=dict)
    kind: str = "kernel"
    grid: str | None = None
    registers: int | None = None
    occupancy: float | None = None
    flops: int | None = None


def write_counter_run(
    run_dir: Path, kernels: list[Kernel], devices: tuple[dict[str, Any], ...] = (A100,)
) -> Path:
    """``kernels`` one after another on one stream of cuda:0, as a complete run with counters."""
    base = id_base(0, SLOT_IMPORT)
    starts = np.cumsum([0] + [k.dur_us + 10 for k in kernels])[:-1]
    slices = pa.table({
        "id": pa.array([base + i for i in range(len(kernels))], pa.int64()),
        "pid": pa.array([0] * len(kernels), pa.int64()),
        "tid": pa.array([7] * len(kernels), pa.int64()),
        "device": ["cuda:0"] * len(kernels),
        "kind": [k.kind for k in kernels],
        "name": [k.name for k in kernels],
        "start_ns": pa.array([int(s) * US for s in starts], pa.int64()),
        "dur_ns": pa.array([k.dur_us * US for k in kernels], pa.int64()),
        "grid": pa.array([k.grid for k in kernels], pa.string()),
        "registers": pa.array([k.registers for k in kernels], pa.int32()),
        "occupancy": pa.array([k.occupancy for k in kernels], pa.float32()),
        "flops": pa.array([k.flops for k in kernels], pa.int64()),
        "stream": pa.array([7] * len(kernels), pa.int64()),
    })
    rows = [(base + i, metric, value) for i, k in enumerate(kernels) for metric, value in k.counters.items()]
    metrics = pa.table({
        "slice_id": pa.array([r[0] for r in rows], pa.int64()),
        "metric": pa.array([r[1] for r in rows], pa.string()),
        "value": pa.array([r[2] for r in rows], pa.float64()),
        "scope": pa.array(["kernel"] * len(rows), pa.string()),
        "method": pa.array(["exact"] * len(rows), pa.string()),
    })
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, slices, "test")
    writer.write_chunk(StoreTable.METRICS, metrics, "test")
    counts, _ = writer.compact()
    Manifest(name=run_dir.name, command=["hand-built"], status=RunStatus.COMPLETE,
             devices=list(devices), counts=counts).write(run_dir)
    return run_dir


def counters(inst: float, cycles: float, warps: float, gld: float,
             flop: tuple[float, float, float] = (0, 0, 0), dram: float | None = None) -> dict[str, float]:
    """Counters of one kernel; ``flop`` is (fadd, fmul, ffma), every other precision zero."""
    found = {INST: inst, CYCLES: cycles, WARPS: warps, GLD: gld}
    for precision in "dfh":
        for operation, value in zip(("add", "mul", "fma"), flop, strict=True):
            found[SASS.format(precision + operation)] = value if precision == "f" else 0.0
    if dram is not None:
        found[DRAM] = dram
    return found


# "gemm" runs twice with very different ratios, so that the ratio of sums (ParaProf's way) and
# the mean of the ratios differ.
HAND_BUILT = [
    Kernel("gemm", 100, counters(1000, 500, 16_000, 100, (10, 20, 300), dram=4096)),
    Kernel("gemm", 300, counters(9000, 1500, 96_000, 900, (30, 40, 700), dram=8192)),
    Kernel("relu", 20, counters(400, 800, 12_800, 200, (50, 0, 0), dram=1024)),
]


# Three kernels with counters: "gemm" takes the time, "relu" has the worst ratios, "copy" none.
COUNTED = [
    *HAND_BUILT,
    Kernel("copy", 50, grid="[4,1,1]", occupancy=10.0, registers=32),
]


def op(i: int, name: str, start: int, dur: int, tid: int = 1, kind: str = "op", **extra: object) -> dict[str, object]:
    """One slice row on pid 1, device cpu, for ``write_rows_run``."""
    return {"id": i, "pid": 1, "tid": tid, "device": "cpu", "kind": kind, "name": name,
            "start_ns": start, "dur_ns": dur, "input_shapes": None, "flops": None, "bytes": None,
            "correlation_id": None, **extra}


def write_rows_run(directory: Path, slices: list[dict[str, object]],
                   memory: list[dict[str, object]] | None = None) -> dlprof.Run:
    """A complete one-rank run of the given slice (and memory) rows."""
    Manifest(name="t", command=["t"]).write(directory)
    writer = RankWriter(directory, 0)
    for table, rows in ((StoreTable.SLICES, slices), (StoreTable.MEMORY, memory or [])):
        if rows:
            writer.write_chunk(table, pa.table({key: [row.get(key) for row in rows] for key in rows[0]}), "test")
    writer.compact()
    return dlprof.load(directory)


def imported_tensorflow_run(tf_profile: Path, directory: Path) -> dlprof.Run:
    """TensorFlow's own profile of a Keras model, imported: ops carry their types and scopes."""
    import_traces([tf_profile], directory)
    return dlprof.load(directory)


@dataclass(frozen=True)
class Span:
    """One slice of a hand-built run; times in milliseconds."""

    name: str
    start_ms: int
    dur_ms: int
    tid: int = 1
    pid: int = 100
    device: str = "cpu"
    rank: int = 0
    kind: str = "op"


def write_span_run(run_dir: Path, spans: list[Span]) -> Path:
    """Write ``spans`` as a complete run through the store's writer; returns the run directory."""
    run_dir.mkdir(parents=True, exist_ok=True)
    ranks = sorted({s.rank for s in spans})
    for rank in ranks:
        mine = [s for s in spans if s.rank == rank]
        base = id_base(rank, SLOT_IMPORT)
        table = pa.table(
            {
                "id": pa.array([base + i for i in range(len(mine))], pa.int64()),
                "pid": pa.array([s.pid for s in mine], pa.int64()),
                "tid": pa.array([s.tid for s in mine], pa.int64()),
                "device": [s.device for s in mine],
                "kind": [s.kind for s in mine],
                "name": [s.name for s in mine],
                "start_ns": pa.array([s.start_ms * MS for s in mine], pa.int64()),
                "dur_ns": pa.array([s.dur_ms * MS for s in mine], pa.int64()),
            }
        )
        writer = RankWriter(run_dir, rank)
        writer.write_chunk(StoreTable.SLICES, table, "test")
        writer.compact()
    Manifest(
        name=run_dir.name,
        command=["hand-built"],
        status=RunStatus.COMPLETE,
        ranks=ranks or [0],
        world_size=max(1, len(ranks)),
    ).write(run_dir)
    return run_dir


# main encloses a (twice, the first with b inside) and c; "late" runs after main, so the thread's
# wall time (0..150 ms) is longer than its longest slice (100 ms).
NESTED = [
    Span("main", 0, 100),
    Span("a", 10, 30),
    Span("b", 15, 10),
    Span("a", 50, 20),
    Span("c", 80, 5),
    Span("late", 120, 30),
]


SEVERAL_TRACKS = [
    Span("x", 0, 10, tid=1),
    Span("y", 20, 10, tid=1),
    Span("x", 5, 30, tid=2),  # a second thread of the same process, starting later
    Span("kernel", 2, 4, tid=7, device="cuda:0", kind="kernel"),  # a GPU stream
    Span("x", 0, 50, tid=1, rank=1),
]


def slice_table(rows: list[tuple[int, int, str, str, int, int]]) -> pa.Table:
    """Rows of (id, tid, kind, name, start_ns, dur_ns) on pid 1, device cpu."""
    ids, tids, kinds, names, starts, durs = zip(*rows, strict=True)
    return pa.table({
        "id": pa.array(ids, pa.int64()), "pid": pa.array([1] * len(rows), pa.int64()),
        "tid": pa.array(tids, pa.int64()), "device": pa.array(["cpu"] * len(rows)).dictionary_encode(),
        "kind": pa.array(kinds).dictionary_encode(), "name": pa.array(names).dictionary_encode(),
        "start_ns": pa.array(starts, pa.int64()), "dur_ns": pa.array(durs, pa.int64()),
        "depth": pa.nulls(len(rows), pa.int16()), "parent_id": pa.nulls(len(rows), pa.int64()),
        "self_ns": pa.nulls(len(rows), pa.int64()),
    })


def write_uncompacted_run(run_dir: Path, status: RunStatus = RunStatus.COMPLETE,
                          pid: int | None = None) -> RankWriter:
    """A manifest and two slice chunks ("a": a step, "b": an op in it), not compacted; returns the
    rank's writer."""
    Manifest(name="t", command=["t"], status=status, writer_pid=pid or os.getpid()).write(run_dir)
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, slice_table([(1, 1, "step", "s", 0, 100)]), "a")
    writer.write_chunk(StoreTable.SLICES, slice_table([(2, 1, "op", "o", 10, 20)]), "b")
    return writer


def write_small_run(run_dir: Path) -> Path:
    """A complete one-rank run: two steps of ops on one thread, and a counter."""
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, slice_table([
        (1, 7, "step", "ProfilerStep#0", 0, 1000), (6, 7, "module", "Linear", 90, 320),
        (2, 7, "op", "aten::mm", 100, 300),
        (3, 7, "op", "aten::add", 500, 200), (4, 7, "step", "ProfilerStep#1", 1000, 1000),
        (5, 7, "op", "aten::mm", 1100, 300),
    ]), "test")
    writer.write_chunk(StoreTable.COUNTERS, pa.table({
        "pid": pa.array([1, 1], pa.int64()), "track": pa.array(["cpu %", "cpu %"]).dictionary_encode(),
        "ts_ns": pa.array([0, 1000], pa.int64()), "value": pa.array([10.0, 20.0]),
    }), "test")
    counts, _ = writer.compact()
    Manifest(name=run_dir.name, command=["python", "train.py"], status=RunStatus.COMPLETE,
             start_ns=SECOND, end_ns=2 * SECOND, exit_code=0, counts=counts).write(run_dir)
    return run_dir


def write_killed_run(run_dir: Path) -> Path:
    """A run whose processes were all killed before its one save was made final.

    As a session leaves it: the session's slices as a chunk, a torch.profiler cycle (the recorded
    A100 trace of ``simple_add``) in ``kineto/rank=0/``, the save's job in ``pending/rank=0/``
    naming both (paths relative to the run), and a manifest still ``running`` whose writer is
    gone, so the run reads as killed.
    """
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, slice_table([
        (1, 7, "step", "ProfilerStep#0", 0, 1000), (2, 7, "region", "forward", 100, 600),
    ]), "session")
    trace = run_dir / "kineto" / "rank=0" / "cycle-00000.json"
    trace.parent.mkdir(parents=True)
    trace.write_bytes(gzip.decompress(simple_add_trace().read_bytes()))
    cycle = CycleJob(trace=trace, rank=0, cycle=0, pid=1, marker_window_ns=None)
    PendingSaves(run_dir, 0).put(SaveJob(run_dir=run_dir, rank=0, number=0, metadata={},
                                         chunks=writer.take_written(), cycles=[Cycle("torch", cycle)]))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout
    Manifest(name=run_dir.name, command=["python", "train.py"], status=RunStatus.RUNNING, start_ns=SECOND,
             writer_pid=int(gone)).write(run_dir)
    return run_dir


def counted_run(out: Path) -> Path:
    """Three steps (and a region in each) with two CPU counters, each step doing more work."""
    from dlprof.support.perf_event import PerfCounters

    probe = PerfCounters(["task-clock", "page-faults"])
    probe.close()
    if probe.failed:
        pytest.skip(f"perf_event_open cannot count here: {probe.failed}")
    with dlprof.profile(out=out, collectors=("host",), counters=["task-clock", "page-faults"]) as prof:
        for size in (1, 2, 3):
            with dlprof.region("work"):
                sum(range(100_000 * size))
            prof.step()
    return out


POWER_INTERVAL_NS = 3_000_000  # an NVML sample every 3 ms: step windows cut sampling intervals


def profile_steps(out: Path) -> Path:
    """Six steps on the host, each a 10 ms ``forward`` region and 5 ms outside it."""
    with dlprof.profile(out=out, collectors=["host"]) as prof:
        for _ in range(6):
            with dlprof.region("forward"):
                time.sleep(0.01)
            time.sleep(0.005)
            prof.step()
    return out


def add_power(run_dir: Path, watts: Callable[[float], Sequence[float]]) -> int:
    """Write NVML samples covering the run into it, as the nvml collector would: ``watts(t)``
    gives each GPU's power (``cuda:0``, ``cuda:1``...) ``t`` seconds after the run's start.

    Returns:
        The time (ns) the samples count seconds from.
    """
    run = dlprof.load(run_dir)
    origin, end = run.manifest.start_ns, run.manifest.end_ns + 10 * POWER_INTERVAL_NS
    samples = []
    for ts in range(origin, end, POWER_INTERVAL_NS):
        for index, power in enumerate(watts((ts - origin) / 1e9)):
            samples.append((ts, index, Readings(50.0, 10.0, 1e9, power, 1410.0, 60.0)))
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.COUNTERS, readings_table(samples, pid=1), "nvml")
    writer.compact()
    return origin


def longest_stall(run: dlprof.Run) -> tuple[int, int, int, int]:
    """The longest time inside a step but the first (the program's set-up) with no op running on
    the step's thread: ``(pid, tid, start_ns, dur_ns)``. In a run recorded before dlprof timed its
    pauses, a save inside a step."""
    ((pid, tid),) = run.query("SELECT DISTINCT pid, tid FROM slices WHERE kind = 'step'").rows
    ops = run.sql(f"SELECT start_ns, start_ns + dur_ns AS end_ns FROM slices WHERE kind = 'op' AND tid = {tid} "
                  "ORDER BY start_ns")
    reach = ops["end_ns"].cummax().shift().to_numpy()
    starts = ops["start_ns"].to_numpy()
    steps = run.sql("SELECT start_ns, start_ns + dur_ns AS end_ns FROM slices WHERE kind = 'step' ORDER BY start_ns")
    inside = np.zeros(len(starts), dtype=bool)
    for low, high in steps.iloc[1:].itertuples(index=False):
        inside |= (reach >= low) & (starts <= high)
    gaps = np.where(inside, starts - reach, 0)
    widest = int(np.nanargmax(gaps))
    return int(pid), int(tid), int(reach[widest]), int(gaps[widest])


def add_pauses(run_dir: Path, pauses: Sequence[tuple[int, int, int, int]]) -> None:
    """Write dlprof pauses (``(pid, tid, start_ns, dur_ns)``) into a run, as a recording that times
    them holds them: :attr:`Kind.PROFILER` slices on the CPU thread they held, made final."""
    run = dlprof.load(run_dir)
    first = int(run.query("SELECT max(id) FROM slices").rows[0][0]) + 1
    rows = [{"id": first + i, "pid": pid, "tid": tid, "device": "cpu", "kind": "profiler", "name": "dlprof::save",
             "start_ns": start, "dur_ns": dur} for i, (pid, tid, start, dur) in enumerate(pauses)]
    writer = RankWriter(Path(run_dir), 0)
    writer.write_chunk(StoreTable.SLICES, pa.table({key: [row[key] for row in rows] for key in rows[0]}), "session")
    writer.compact()
