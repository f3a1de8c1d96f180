"""Chrome Trace Event JSON in the PyTorch profiler's (Kineto's) layout, one file per rank.

Holistic Trace Analysis, Perfetto, chrome://tracing and :mod:`dlprof.importers.kineto` read it
as they read ``torch.profiler``'s own traces::

    ChromeExporter().export(dlprof.load("runs/cnn"), Path("cnn.json"))
    # a run of several ranks: cnn.rank0.json, cnn.rank1.json, ...

Layout, as Kineto writes it:

* ``X`` slices with Kineto's categories (:func:`kineto_category`) and argument names
  (``External id``, ``Input Dims``, ``correlation``, ``grid``, ...). Device slices go under the
  pid of their device index with the stream as tid; CPU slices keep their pid and thread. Two
  arguments are dlprof's, not Kineto's: ``flops`` and ``bytes`` on ops and layers (Kineto
  readers ignore them; dlprof's importer reads them back).
* ``s``/``f`` flows named ``ac2g`` from each runtime call to the device work it launched.
* ``C`` counters, ``i`` ``[memory]`` instants, ``M`` process and thread names.
* CPU counters per step (and per region) as ``C`` events named after the metric
  (``perf:task-clock``, ``perf:task-clock (regions)``) with one ``value``: the counter's delta
  over the step as a rate per second, set at the step's start (see
  :mod:`dlprof.exporters.counter_rates`).
* The header as Kineto writes it: one key per line, in Kineto's order, a space after each colon
  (Holistic Trace Analysis finds each file's rank by that spacing; see :func:`kineto_header`).
* Times are microseconds (three decimals at most) after ``baseTimeNanoseconds``. Kineto floors
  the profiler's start to a 7,889,238-second interval; this exporter floors the run's earliest
  timestamp to a whole second instead, so that ``ts`` stays small enough for a double to carry
  every nanosecond and a round trip gives back the same integers. One base serves every rank,
  so the ranks' files line up.

Events are written in batches as they are made, never held for the whole run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.exporters.base import Exporter, Ticker, atomic_output
from dlprof.exporters.counter_rates import RateTrack, counter_rate_tracks
from dlprof.exporters.slice_walks import (
    Flows,
    device_index,
    launch_flows,
    slices_of,
    sorted_slice_batches,
    table_batches,
    unique_rows,
)
from dlprof.keys import Kind, StoreTable
from dlprof.store.reader import Run

# Kineto's activity categories (libkineto ActivityType names), kept as they are.
KINETO_CATEGORIES = frozenset(
    {
        "cpu_op", "user_annotation", "gpu_user_annotation", "python_function", "kernel",
        "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cuda_sync",
        "cuda_profiler_range", "cpu_instant_event", "overhead", "collective_comm",
        "external_correlation", "mtia_runtime", "mtia_ccp_events", "hpu_op", "xpu_runtime",
        "xpu_driver", "privateuse1_runtime", "privateuse1_driver", "glow_runtime",
    }
)

# The Kineto category of each dlprof kind, for slices whose own category is not Kineto's.
CATEGORY_OF_KIND: dict[str, str] = {
    Kind.STEP: "user_annotation",  # Kineto records ProfilerStep#N as a user annotation
    Kind.REGION: "user_annotation",  # a dlprof region is a record_function range
    Kind.USER_ANNOTATION: "user_annotation",
    # Kineto's own module scopes (with_modules, with_stack) are python_function events, where
    # TensorBoard's module view and HTA's call stacks look for them; as user annotations they
    # would crowd the annotations HTA analyses.
    Kind.MODULE: "python_function",
    Kind.PYTHON: "python_function",
    Kind.OP: "cpu_op",
    Kind.COMM: "cpu_op",  # collectives are cpu_op events (nccl:*, record_param_comms)
    Kind.KERNEL: "kernel",
    Kind.MEMCPY: "gpu_memcpy",
    Kind.MEMSET: "gpu_memset",
    Kind.RUNTIME: "cuda_runtime",
}

# c10::DeviceType numbers, which Kineto's [memory] events carry as "Device Type".
_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "hip": 6, "xpu": 12, "mps": 13, "mtia": 19}
_PRIVATE_USE = 20
_GPU_SORT_BASE = 0x1000000  # Kineto sorts device processes after every CPU process

# (Kineto argument name, slice column, parse): the typed columns written back as arguments.
_ARG_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("External id", "external_id", False),
    ("Sequence number", "sequence_nr", False),
    ("correlation", "correlation_id", False),
    ("Input Dims", "input_shapes", True),
    ("Input type", "input_dtypes", True),
    ("flops", "flops", False),
    ("bytes", "bytes", False),
    ("registers per thread", "registers", False),
    ("shared memory", "shared_memory", False),
    ("blocks per SM", "blocks_per_sm", False),
    ("warps per SM", "warps_per_sm", False),
    ("grid", "grid", True),
    ("block", "block", True),
    ("est. achieved occupancy %", "occupancy", False),
)
SLICE_COLUMNS = [
    "id", "pid", "tid", "device", "kind", "category", "name", "start_ns", "dur_ns", "stream",
    "args", *(column for _, column, _ in _ARG_COLUMNS),
]


def kineto_category(kind: str, category: str | None) -> str:
    """The category a slice carries in Kineto's layout.

    Args:
        kind: the slice's dlprof kind.
        category: the category its source gave it (``dlprof_module`` for dlprof's own).

    Returns:
        The source's category when it is one of Kineto's, else the Kineto category of the
        kind, else (a foreign trace's own category) the category unchanged.
    """
    if category in KINETO_CATEGORIES:
        return category
    return CATEGORY_OF_KIND.get(kind, category or kind)


def slice_args(batch: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Kineto's ``args`` of each slice of a batch.

    Device slices get ``device`` (the index) and ``stream`` (the stream, else the tid), which is
    how Kineto readers tell them from CPU slices. A foreign trace's extra ``args`` come after
    the typed columns, which win where both name the same argument.

    Args:
        batch: slices as :func:`~dlprof.exporters.base.sorted_slice_batches` gives them, with
            at least the columns of :data:`SLICE_COLUMNS`.

    Returns:
        One dict per slice, in batch order, empty where a slice has no arguments.
    """
    args: list[dict[str, Any]] = [{} for _ in batch["id"]]
    _add_args(args, batch, _ARG_COLUMNS[:1])  # Kineto puts "External id" first
    for i, device in enumerate(batch["device"]):
        if device != "cpu":
            stream = batch["stream"][i]
            args[i]["device"] = device_index(device)
            args[i]["stream"] = stream if stream is not None else batch["tid"][i]
    _add_args(args, batch, _ARG_COLUMNS[1:])
    for i, extra in enumerate(batch["args"]):
        parsed = orjson.loads(extra) if extra else None
        if isinstance(parsed, dict):
            for key, value in parsed.items():
                args[i].setdefault(key, value)
    return args


def _add_args(args: list[dict[str, Any]], batch: dict[str, list[Any]],
              columns: tuple[tuple[str, str, bool], ...]) -> None:
    for key, column, parse in columns:
        parsed: dict[str, Any] = {}  # shapes repeat: parse each distinct text once
        for i, value in enumerate(batch[column]):
            if value is None:
                continue
            if parse:
                text = value
                value = parsed.get(text)
                if value is None:
                    value = parsed[text] = orjson.loads(text)
            args[i][key] = value


def base_time_ns(run: Run) -> int:
    """The time base of every rank's file.

    Args:
        run: the run to export.

    Returns:
        The run's earliest timestamp (any rank, any table) floored to a whole second, in epoch
        nanoseconds; 0 for a run with no timestamps at all.
    """
    earliest = [
        pc.min(run.arrow(table).column(column)).as_py()
        for table, column in (
            (StoreTable.SLICES, "start_ns"),
            (StoreTable.COUNTERS, "ts_ns"),
            (StoreTable.MEMORY, "ts_ns"),
        )
    ]
    known = [value for value in earliest if value is not None]
    return (min(known) // 1_000_000_000) * 1_000_000_000 if known else 0


def kineto_header(devices: list[dict[str, Any]], rank: int, world_size: int, base_ns: int) -> bytes:
    """The trace's opening, up to and with the ``traceEvents`` array's bracket, as Kineto writes it.

    Kineto writes one key per line in this order, and the ``distributedInfo`` object as torch's
    ``json.dumps`` makes it, a space after each colon. Holistic Trace Analysis finds a file's
    rank with the pattern ``"rank":\\s+(\\d+)`` on the first line that has it: without the space
    every rank reads as rank 0.

    Args:
        devices: the manifest's device properties.
        rank: the rank this file holds.
        world_size: the job's number of ranks.
        base_ns: the file's time base (see :func:`base_time_ns`).

    Returns:
        The header's bytes, ending in a newline after ``"traceEvents": [``.
    """
    fields = (
        ("schemaVersion", 1),
        ("deviceProperties", devices),
        ("distributedInfo", {"rank": rank, "world_size": world_size}),
        ("displayTimeUnit", "ms"),
        ("baseTimeNanoseconds", base_ns),
    )
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in fields]
    return ("{\n" + "\n".join(lines) + '\n  "traceEvents": [\n').encode()


def program_name(run: Run) -> str:
    """What Kineto calls the process: the file name of the program the run recorded.

    Args:
        run: the run to export.

    Returns:
        The manifest command's first word without its directory, or ``python``.
    """
    return Path(run.manifest.command[0]).name if run.manifest.command else "python"


class ChromeExporter(Exporter):
    """Kineto-layout Chrome Trace Event JSON, one file per rank."""

    format_name = "chrome"
    file_extension = ".json"
    binary = False
    description = "Chrome trace JSON in PyTorch profiler layout (HTA, Perfetto)"

    def output_paths(self, run: Run, path: Path) -> list[Path]:
        ranks = _ranks(run)
        if len(ranks) == 1 and run.manifest.world_size <= 1:
            return [path]
        return [path.with_name(f"{path.stem}.rank{rank}{path.suffix}") for rank in ranks]

    def write(self, run: Run, path: Path, ticker: Ticker) -> list[Path]:
        base = base_time_ns(run)
        flows = launch_flows(slices_of(run))
        rates = counter_rate_tracks(run)
        paths = self.output_paths(run, path)
        for rank, out in zip(_ranks(run), paths, strict=True):
            with atomic_output(out) as file:
                rank_file = _RankFile(file, run, rank, base, ticker, self.batch_rows)
                rank_file.write(flows, out.name, [t for t in rates if t.rank == rank])
        return paths


def _ranks(run: Run) -> list[int]:
    return sorted(pc.unique(run.arrow(StoreTable.SLICES).column("rank")).to_pylist())


def _of_rank(table: pa.Table, rank: int) -> pa.Table:
    return table.filter(pc.equal(table.column("rank"), rank))


class _RankFile:
    """One rank's trace file, written event batch by event batch."""

    def __init__(self, file: IO[bytes], run: Run, rank: int, base_ns: int, ticker: Ticker,
                 batch_rows: int) -> None:
        self.file = file
        self.batch_rows = batch_rows
        self.run = run
        self.rank = rank
        self.base_ns = base_ns
        self.ticker = ticker
        self.slices = _of_rank(slices_of(run), rank)
        self.counters = _of_rank(run.arrow(StoreTable.COUNTERS), rank)
        self.memory = _of_rank(run.arrow(StoreTable.MEMORY), rank)
        self.program = program_name(run)
        self._first = True

    def us(self, ns: list[int] | np.ndarray) -> list[float]:
        """Epoch nanoseconds as microseconds after the base."""
        return ((np.asarray(ns, dtype=np.int64) - self.base_ns) / 1000.0).tolist()  # type: ignore[no-any-return]

    def emit(self, events: list[dict[str, Any]]) -> None:
        """Append events to ``traceEvents``, one per line."""
        if not events:
            return
        if not self._first:
            self.file.write(b",\n")
        self._first = False
        self.file.write(b",\n".join(map(orjson.dumps, events)))

    def write(self, flows: Flows, trace_name: str, rates: list[RateTrack]) -> None:
        manifest = self.run.manifest
        self.file.write(kineto_header(manifest.devices, self.rank, manifest.world_size, self.base_ns))
        self.emit(self.metadata())
        self.write_slices(flows)
        self.write_counters()
        for track in rates:
            self.emit([{"ph": "C", "name": track.name, "pid": track.pid, "ts": ts,
                        "args": {"value": value}}
                       for ts, value in zip(self.us(track.ts_ns), track.values, strict=True)])
        self.write_memory()
        self.file.write(b'\n  ],\n  "traceName": ' + json.dumps(trace_name).encode() + b"\n}\n")

    def metadata(self) -> list[dict[str, Any]]:
        """Process and thread names and sort orders, as Kineto names them."""
        ts = self.us([pc.min(self.slices.column("start_ns")).as_py()])[0]
        events: list[dict[str, Any]] = []
        processes: dict[int, tuple[str, int]] = {}
        for table in (self.slices, self.counters, self.memory):
            for row in unique_rows(table, ["pid", "device"]):
                if row["device"] in ("cpu", None) or table is self.memory:
                    processes.setdefault(row["pid"], ("CPU", row["pid"]))
                else:
                    index = device_index(row["device"])
                    processes.setdefault(index, (f"GPU {index}", _GPU_SORT_BASE + index))
        for pid, (label, sort_index) in sorted(processes.items()):
            events += [
                _meta("process_name", ts, pid, 0, "name", self.program),
                _meta("process_labels", ts, pid, 0, "labels", label),
                _meta("process_sort_index", ts, pid, 0, "sort_index", sort_index),
            ]
        for row in unique_rows(self.slices, ["pid", "device", "tid"]):
            tid = row["tid"]
            if row["device"] == "cpu":
                pid, name = row["pid"], f"thread {tid} ({self.program})"
            else:
                pid, name = device_index(row["device"]), f"stream {tid}"
            events += [
                _meta("thread_name", ts, pid, tid, "name", name),
                _meta("thread_sort_index", ts, pid, tid, "sort_index", tid),
            ]
        return events

    def write_slices(self, flows: Flows) -> None:
        categories: dict[tuple[str, str | None], str] = {}
        for batch in sorted_slice_batches(self.slices, SLICE_COLUMNS, self.batch_rows):
            ts = self.us(batch["start_ns"])
            dur = (np.asarray(batch["dur_ns"], dtype=np.int64) / 1000.0).tolist()
            args = slice_args(batch)
            events: list[dict[str, Any]] = []
            for i, slice_id in enumerate(batch["id"]):
                device, tid = batch["device"][i], batch["tid"][i]
                pid = batch["pid"][i] if device == "cpu" else device_index(device)
                key = (batch["kind"][i], batch["category"][i])
                category = categories.get(key) or categories.setdefault(key, kineto_category(*key))
                event = {"ph": "X", "cat": category, "name": batch["name"][i], "pid": pid,
                         "tid": tid, "ts": ts[i], "dur": dur[i]}
                if args[i]:
                    event["args"] = args[i]
                events.append(event)
                if slice_id in flows.sources or slice_id in flows.targets:
                    events.append(_flow(slice_id in flows.sources, batch["correlation_id"][i],
                                        pid, tid, ts[i]))
            self.emit(events)
            self.ticker.advance(len(batch["id"]))

    def write_counters(self) -> None:
        """Counters as ``C`` events; a track ``host.rss`` is counter ``host``, series ``rss``."""
        for batch in table_batches(self.counters, self.batch_rows):
            ts = self.us(batch["ts_ns"])
            events = []
            for i, track in enumerate(batch["track"]):
                if batch["value"][i] is None:
                    continue  # a missed sample; a null counter value breaks JSON readers
                name, _, series = track.rpartition(".")
                device = batch["device"][i]
                pid = batch["pid"][i] if device in ("cpu", None) else device_index(device)
                events.append({"ph": "C", "name": name or track, "pid": pid, "ts": ts[i],
                               "args": {series if name else "value": batch["value"][i]}})
            self.emit(events)
            self.ticker.advance(len(batch["ts_ns"]))

    def write_memory(self) -> None:
        """Allocations and frees as Kineto's ``[memory]`` instants, on the allocating thread."""
        ids = self.slices.column("id").to_numpy()
        order = np.argsort(ids)
        ids, tids = ids[order], self.slices.column("tid").to_numpy()[order]
        for batch in table_batches(self.memory, self.batch_rows):
            owner = np.asarray([-1 if s is None else s for s in batch["slice_id"]], dtype=np.int64)
            at = np.minimum(np.searchsorted(ids, owner), len(ids) - 1)
            # Memory rows carry no thread; the slice they belong to does. Unowned: main thread.
            tid = np.where(ids[at] == owner, tids[at], np.asarray(batch["pid"], dtype=np.int64))
            ts = self.us(batch["ts_ns"])
            events = []
            for i, device in enumerate(batch["device"]):
                device = device or "cpu"
                kind = device.partition(":")[0]
                args = {
                    "Total Reserved": batch["total_reserved"][i],
                    "Total Allocated": batch["total_allocated"][i],
                    "Bytes": batch["bytes"][i],
                    "Device Id": device_index(device),
                    "Device Type": _DEVICE_TYPES.get(kind, _PRIVATE_USE),
                    "Addr": batch["addr"][i],
                }
                events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                               "pid": batch["pid"][i], "tid": int(tid[i]), "ts": ts[i],
                               "args": {k: v for k, v in args.items() if v is not None}})
            self.emit(events)
            self.ticker.advance(len(batch["ts_ns"]))


def _meta(event: str, ts: float, pid: int, tid: int, key: str, value: Any) -> dict[str, Any]:
    return {"ph": "M", "name": event, "ts": ts, "pid": pid, "tid": tid, "args": {key: value}}


def _flow(start: bool, correlation: int, pid: int, tid: int, ts: float) -> dict[str, Any]:
    """One end of an ``ac2g`` flow; the ``f`` end binds to the slice it points into."""
    event: dict[str, Any] = {"ph": "s" if start else "f", "id": correlation, "pid": pid,
                             "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"}
    if not start:
        event["bp"] = "e"
    return event
