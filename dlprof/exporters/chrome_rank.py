"""One rank's events in Kineto's Chrome layout, streamed into a trace file a batch at a time.

:mod:`dlprof.exporters.chrome` writes each rank into its own file (Holistic Trace Analysis's
convention), or every rank into one file (``--merged``); either way a rank's events come from
here. The rank's slices are read in the store's order a row group at a time
(:func:`dlprof.exporters.rank_scan.rank_batches`), after one narrow scan has found its tracks and
flows (:class:`dlprof.exporters.rank_scan.RankIndex`): memory follows the batch::

    events = ChromeRankEvents(EventWriter(file), run, rank=0, base_ns=base, ...)
    events.write(rates)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import orjson

from dlprof.exporters.base import Ticker
from dlprof.exporters.counter_rates import RateTrack
from dlprof.exporters.kineto_layout import SLICE_COLUMNS, kineto_category, slice_args
from dlprof.exporters.rank_scan import RankIndex, distinct, rank_batches
from dlprof.exporters.slice_walks import device_index, flow_key
from dlprof.keys import StoreTable
from dlprof.store.reader import Run

# c10::DeviceType numbers, which Kineto's [memory] events carry as "Device Type".
_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "hip": 6, "xpu": 12, "mps": 13, "mtia": 19}
_PRIVATE_USE = 20
_GPU_SORT_BASE = 0x1000000  # Kineto sorts device processes after every CPU process
# In a file of several ranks, rank r's processes are numbered r * RANK_PID_STRIDE + their own
# number: Linux pids stay below 2**22, so no two ranks share one.
RANK_PID_STRIDE = 10_000_000

_COUNTER_COLUMNS = ["pid", "device", "track", "ts_ns", "value"]
_MEMORY_COLUMNS = ["pid", "device", "ts_ns", "bytes", "total_allocated", "total_reserved", "addr", "slice_id"]


class EventWriter:
    """Appends events to a ``traceEvents`` array, one per line."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self._first = True

    def emit(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        if not self._first:
            self.file.write(b",\n")
        self._first = False
        # One dumps for the batch, then a line per event: each event's first key is "ph", so
        # '},{"ph":' separates two events (a newline anywhere between tokens is still JSON).
        self.file.write(orjson.dumps(events)[1:-1].replace(b'},{"ph":', b'},\n{"ph":'))


@dataclass
class RankNaming:
    """How one rank's processes are numbered and named in the file."""

    program: str  # the process name, as Kineto writes it
    pid_offset: int = 0  # added to every pid (see RANK_PID_STRIDE)
    label_prefix: str = ""  # before each process label ("rank 1 "), in a file of several ranks
    flows_by_rank: bool = False  # flow ids that name the rank too (flow_key), in such a file


class ChromeRankEvents:
    """Writes one rank's metadata, slices, flows, counters and memory instants."""

    def __init__(self, out: EventWriter, run: Run, rank: int, base_ns: int, ticker: Ticker,
                 batch_rows: int, naming: RankNaming) -> None:
        self.out, self.run, self.rank, self.base_ns = out, run, rank, base_ns
        self.ticker, self.batch_rows, self.naming = ticker, batch_rows, naming
        self.columns = SLICE_COLUMNS
        self.index = RankIndex.of(run, rank)

    def us(self, ns: list[int] | np.ndarray) -> list[float]:
        """Epoch nanoseconds as microseconds after the base."""
        return ((np.asarray(ns, dtype=np.int64) - self.base_ns) / 1000.0).tolist()  # type: ignore[no-any-return]

    def pid(self, pid: int, device: str | None) -> int:
        """The file's pid of a CPU process, or of a device (its index), for this rank."""
        own = pid if device in ("cpu", None) else device_index(device)
        return own + self.naming.pid_offset

    def write(self, rates: list[RateTrack]) -> None:
        self.out.emit(self.metadata())
        self.write_slices()
        self.write_counters()
        for track in rates:
            pid = track.pid + self.naming.pid_offset
            self.out.emit([{"ph": "C", "name": track.name, "pid": pid, "ts": ts, "args": {"value": value}}
                           for ts, value in zip(self.us(track.ts_ns), track.values, strict=True)])
        self.write_memory()

    def metadata(self) -> list[dict[str, Any]]:
        """Process and thread names and sort orders, as Kineto names them."""
        ts = self.us([self.index.first_start_ns or self.base_ns])[0]
        events: list[dict[str, Any]] = []
        processes: dict[int, tuple[str, int]] = {}
        wheres = [(pid, device) for pid, device, _ in self.index.tracks]
        wheres += [(row["pid"], row["device"]) for row in distinct(self.run, StoreTable.COUNTERS, self.rank, ["pid", "device"])]
        wheres += [(row["pid"], "cpu") for row in distinct(self.run, StoreTable.MEMORY, self.rank, ["pid"])]
        for pid, device in wheres:
            if device in ("cpu", None):
                processes.setdefault(self.pid(pid, device), ("CPU", pid))
            else:
                index = device_index(device)
                processes.setdefault(self.pid(pid, device), (f"GPU {index}", _GPU_SORT_BASE + index))
        prefix = self.naming.label_prefix
        for pid, (label, sort_index) in sorted(processes.items()):
            events += [
                _meta("process_name", ts, pid, 0, "name", self.naming.program),
                _meta("process_labels", ts, pid, 0, "labels", prefix + label),
                _meta("process_sort_index", ts, pid, 0, "sort_index", sort_index + self.naming.pid_offset),
            ]
        for pid, device, tid in self.index.tracks:
            name = f"thread {tid} ({self.naming.program})" if device == "cpu" else f"stream {tid}"
            events += [
                _meta("thread_name", ts, self.pid(pid, device), tid, "name", name),
                _meta("thread_sort_index", ts, self.pid(pid, device), tid, "sort_index", tid),
            ]
        return events

    def write_slices(self) -> None:
        categories: dict[tuple[str, str | None], str] = {}
        for batch in rank_batches(self.run, StoreTable.SLICES, self.rank, self.columns, self.batch_rows):
            ts = self.us(batch["start_ns"])
            dur = (np.asarray(batch["dur_ns"], dtype=np.int64) / 1000.0).tolist()
            args = slice_args(batch)
            sources, targets = self.index.flows.marks(batch["id"])
            events: list[dict[str, Any]] = []
            for i, name in enumerate(batch["name"]):
                device, tid = batch["device"][i], batch["tid"][i]
                pid = self.pid(batch["pid"][i], device)
                key = (batch["kind"][i], batch["category"][i])
                category = categories.get(key) or categories.setdefault(key, kineto_category(*key))
                event = {"ph": "X", "cat": category, "name": name, "pid": pid, "tid": tid, "ts": ts[i],
                         "dur": dur[i]}
                if args[i]:
                    event["args"] = args[i]
                events.append(event)
                if sources[i] or targets[i]:
                    flow = batch["correlation_id"][i]
                    if self.naming.flows_by_rank:
                        flow = flow_key(self.rank, flow)
                    events.append(_flow(sources[i], flow, pid, tid, ts[i]))
            self.out.emit(events)
            self.ticker.advance(len(batch["id"]))

    def write_counters(self) -> None:
        """Counters as ``C`` events; a track ``host.rss`` is counter ``host``, series ``rss``."""
        for batch in rank_batches(self.run, StoreTable.COUNTERS, self.rank, _COUNTER_COLUMNS, self.batch_rows):
            ts = self.us(batch["ts_ns"])
            events = []
            for i, track in enumerate(batch["track"]):
                if batch["value"][i] is None:
                    continue  # a missed sample; a null counter value breaks JSON readers
                name, _, series = track.rpartition(".")
                events.append({"ph": "C", "name": name or track, "pid": self.pid(batch["pid"][i], batch["device"][i]),
                               "ts": ts[i], "args": {series if name else "value": batch["value"][i]}})
            self.out.emit(events)
            self.ticker.advance(len(batch["ts_ns"]))

    def write_memory(self) -> None:
        """Allocations and frees as Kineto's ``[memory]`` instants, on the allocating thread."""
        for batch in rank_batches(self.run, StoreTable.MEMORY, self.rank, _MEMORY_COLUMNS, self.batch_rows):
            # Memory rows carry no thread; the slice they belong to does. Unowned: main thread.
            tid = self.index.owner_tid(batch["slice_id"], batch["pid"])
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
                               "pid": batch["pid"][i] + self.naming.pid_offset, "tid": tid[i], "ts": ts[i],
                               "args": {k: v for k, v in args.items() if v is not None}})
            self.out.emit(events)
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
