"""Native Perfetto traces: the run as protobuf TracePackets, for ui.perfetto.dev and TraceProcessor.

Built with the ``perfetto`` package's own protobuf classes and streamed: packets are serialised
a few thousand at a time as fields of a ``Trace`` message, which is exactly the file format
(each packet is field 1, tag ``0x0A``, its length as a varint, then its bytes)::

    PerfettoExporter().export(dlprof.load("runs/cnn"), Path("cnn.perfetto-trace"))

Layout:

* one timeline for the whole job, every rank on rank 0's clock: a process track per (rank, pid)
  and a thread track per CPU thread under it; a track per device (``cuda:0``), holding one child
  track per stream, inside the rank's main process (its lowest pid), so that each rank is one
  group of tracks;
* slices as ``TYPE_SLICE_BEGIN``/``TYPE_SLICE_END`` pairs in depth-first order per track, so a
  slice ends before its next sibling begins; names, categories (Kineto's, as the Chrome
  exporter writes them) and argument names are interned on the one packet sequence;
* flows from each runtime call to the device work it launched (by correlation id);
* each rank's slices streamed from the store in its order, a row group at a time, after one
  narrow scan found its tracks and flows (:mod:`dlprof.exporters.rank_scan`);
* counter tracks for the counters table, and for the memory allocated (and reserved) per
  process and device;
* a counter track per CPU counter metric and process, ``perf:task-clock`` (and
  ``perf:task-clock (regions)``), unit ``/s``: at each step's start, the counter's delta over
  the step as a rate per second (see :mod:`dlprof.exporters.counter_rates`).

Timestamps are the store's epoch nanoseconds on Perfetto's default clock, which a clock
snapshot declares equal to wall-clock time. Perfetto keys
processes and threads by pid and tid across the whole trace, so ids that would collide between
ranks (or that Perfetto reserves, such as 0) are replaced by fresh ones; names keep the real id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from dlprof.exporters.base import Exporter, Ticker, atomic_output
from dlprof.exporters.chrome import program_name
from dlprof.exporters.counter_rates import RATE_UNIT, RateTrack, counter_rate_tracks
from dlprof.exporters.kineto_layout import SLICE_COLUMNS, kineto_category, slice_args
from dlprof.exporters.rank_scan import Flows, RankIndex, distinct, rank_batches
from dlprof.exporters.slice_walks import flow_key
from dlprof.keys import StoreTable
from dlprof.store import scan
from dlprof.store.reader import Run

_SEQUENCE_ID = 1  # one writer, so one trusted packet sequence carries every packet
_PACKETS_PER_WRITE = 4096
_FIRST_SYNTHETIC_ID = 1 << 30  # above Linux's pid_max, so never a real pid or tid
_INT32_MAX = (1 << 31) - 1
_INT64 = range(-(1 << 63), 1 << 63)

_BEGIN = pb.TrackEvent.TYPE_SLICE_BEGIN
_END = pb.TrackEvent.TYPE_SLICE_END
_COUNTER = pb.TrackEvent.TYPE_COUNTER


class PerfettoExporter(Exporter):
    """The run as one native Perfetto protobuf trace, every rank in it."""

    format_name = "perfetto"
    file_extension = ".perfetto-trace"
    binary = True
    description = "native Perfetto protobuf trace (ui.perfetto.dev)"

    def write(self, run: Run, path: Path, ticker: Ticker) -> list[Path]:
        ranks = scan.ranks(run, StoreTable.SLICES)
        rates = counter_rate_tracks(run)
        indexes = {rank: RankIndex.of(run, rank) for rank in ranks}
        tracks = _Tracks.of(run, indexes, rates)
        with atomic_output(path) as file:
            packets = _PacketStream(file)
            tracks.describe(packets)
            _declare_wall_clock(packets, scan.column_min(run, StoreTable.SLICES, "start_ns") or 0)
            for rank, index in indexes.items():
                _write_slices(packets, run, rank, tracks, index.flows, ticker, self.batch_rows)
            for rank in scan.ranks(run, StoreTable.COUNTERS):
                _write_counters(packets, run, rank, tracks, ticker, self.batch_rows)
            for rank in scan.ranks(run, StoreTable.MEMORY):
                _write_memory(packets, run, rank, tracks, ticker, self.batch_rows)
            for rate in rates:
                uuid = tracks.counters[(rate.rank, rate.pid, "cpu", rate.name)]
                for ts, value in zip(rate.ts_ns, rate.values, strict=True):
                    _count(packets, uuid, ts, value)
            packets.flush()
        return [path]


class _PacketStream:
    """Packets on one trusted sequence, serialised in batches, with names interned."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._trace = pb.Trace()
        self._first = True
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}

    def packet(self, timestamp: int | None = None, interned: bool = False) -> pb.TracePacket:
        """A new packet on the sequence; ``interned`` when it refers to interned names."""
        if len(self._trace.packet) >= _PACKETS_PER_WRITE:
            self.flush()  # every packet handed out before this one is complete
        packet = self._trace.packet.add()
        packet.trusted_packet_sequence_id = _SEQUENCE_ID
        if timestamp is not None:
            packet.timestamp = timestamp
        if self._first:
            # Readers drop interned references until the sequence says its state starts here.
            packet.first_packet_on_sequence = True
            packet.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self._first = False
        if interned:
            packet.sequence_flags |= pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        return packet

    def flush(self) -> None:
        if len(self._trace.packet):
            self._file.write(self._trace.SerializeToString())
            self._trace = pb.Trace()

    # Each looks its table up first: a name is interned once and then used millions of times.
    def name_iid(self, packet: pb.TracePacket, name: str) -> int:
        iid = self._names.get(name)
        return iid if iid is not None else _intern(self._names, name, packet.interned_data.event_names.add)

    def category_iid(self, packet: pb.TracePacket, name: str) -> int:
        iid = self._categories.get(name)
        return iid if iid is not None else _intern(
            self._categories, name, packet.interned_data.event_categories.add)

    def arg_name_iid(self, packet: pb.TracePacket, name: str) -> int:
        iid = self._arg_names.get(name)
        return iid if iid is not None else _intern(
            self._arg_names, name, packet.interned_data.debug_annotation_names.add)


def _intern(table: dict[str, int], name: str, add: Callable[..., Any]) -> int:
    """A new iid for ``name``, defined in the packet that first uses it."""
    iid = table[name] = len(table) + 1
    add(iid=iid, name=name)
    return iid


class _Ids:
    """Perfetto pids or tids: the real id where it is free and valid, a fresh one otherwise."""

    def __init__(self) -> None:
        self._used: set[int] = set()
        self._next = _FIRST_SYNTHETIC_ID

    def take(self, real: int) -> int:
        if 0 < real <= _INT32_MAX and real not in self._used:
            self._used.add(real)
            return real
        while self._next in self._used:
            self._next += 1
        self._used.add(self._next)
        return self._next


@dataclass
class _Tracks:
    """Every track of the trace and its uuid, decided before the first event is written."""

    program: str
    many_ranks: bool
    # Each rank's main process (its lowest CPU pid): its devices are drawn inside it, so that a
    # rank's threads, streams and counters make one group in the timeline.
    main_pids: dict[int, int] = field(default_factory=dict)
    processes: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, pid)
    threads: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (rank, pid, tid)
    devices: dict[tuple[int, str], int] = field(default_factory=dict)  # (rank, device)
    streams: dict[tuple[int, int, str, int], int] = field(default_factory=dict)
    counters: dict[tuple[int, int, str, str], int] = field(default_factory=dict)
    lanes: dict[tuple[int, int], int] = field(default_factory=dict)  # (stream uuid, lane)
    _descriptors: list[pb.TrackDescriptor] = field(default_factory=list)
    _pids: _Ids = field(default_factory=_Ids)
    _tids: _Ids = field(default_factory=_Ids)

    @classmethod
    def of(cls, run: Run, indexes: dict[int, RankIndex], rates: list[RateTrack]) -> _Tracks:
        ranks = set(indexes) | set(run.manifest.ranks)
        tracks = cls(program=program_name(run), many_ranks=len(ranks) > 1)
        for rank, index in indexes.items():
            cpu_pids = [pid for pid, device, _ in index.tracks if device == "cpu"]
            tracks.main_pids[rank] = min(cpu_pids) if cpu_pids else 0
        for rank, index in indexes.items():
            for pid, device, tid in index.tracks:
                if device == "cpu":
                    tracks.thread(rank, pid, tid)
                else:
                    tracks.stream(rank, pid, device, tid)
        for rank in scan.ranks(run, StoreTable.COUNTERS):
            for row in distinct(run, StoreTable.COUNTERS, rank, ["pid", "device", "track", "unit"]):
                tracks.counter(rank, row["pid"], row["device"] or "cpu", row["track"], row["unit"] or "")
        for rank in scan.ranks(run, StoreTable.MEMORY):
            reserved = any(row["total_reserved"] for row in
                           distinct(run, StoreTable.MEMORY, rank, ["total_reserved"]))
            for row in distinct(run, StoreTable.MEMORY, rank, ["pid", "device"]):
                where = (rank, row["pid"])
                tracks.counter(*where, "cpu", f"memory.allocated ({row['device']})", "bytes")
                if reserved:
                    tracks.counter(*where, "cpu", f"memory.reserved ({row['device']})", "bytes")
        for rate in rates:
            tracks.counter(rate.rank, rate.pid, "cpu", rate.name, RATE_UNIT)
        return tracks

    def _add(self, descriptor: pb.TrackDescriptor) -> int:
        uuid = len(self._descriptors) + 1
        descriptor.uuid = uuid
        self._descriptors.append(descriptor)
        return uuid

    def process(self, rank: int, pid: int) -> int:
        uuid = self.processes.get((rank, pid))
        if uuid is None:
            name = f"{self.program} (rank {rank})" if self.many_ranks else self.program
            uuid = self.processes[(rank, pid)] = self._add(pb.TrackDescriptor(
                process=pb.ProcessDescriptor(pid=self._pids.take(pid), process_name=name)))
        return uuid

    def thread(self, rank: int, pid: int, tid: int) -> int:
        parent = self.process(rank, pid)
        uuid = self.threads.get((rank, pid, tid))
        if uuid is None:
            pid_out = self._by_uuid(parent).process.pid
            uuid = self.threads[(rank, pid, tid)] = self._add(pb.TrackDescriptor(
                parent_uuid=parent, thread=pb.ThreadDescriptor(
                    pid=pid_out, tid=self._tids.take(tid), thread_name=f"thread {tid}")))
        return uuid

    def device(self, rank: int, device: str) -> int:
        uuid = self.devices.get((rank, device))
        if uuid is None:
            name = f"{device} (rank {rank})" if self.many_ranks else device
            parent = self.process(rank, self.main_pids.get(rank, 0))
            uuid = self.devices[(rank, device)] = self._add(pb.TrackDescriptor(
                parent_uuid=parent, name=name, child_ordering=pb.TrackDescriptor.EXPLICIT))
        return uuid

    def stream(self, rank: int, pid: int, device: str, tid: int) -> int:
        key = (rank, pid, device, tid)
        uuid = self.streams.get(key)
        if uuid is None:
            parent = self.device(rank, device)
            # Streams are described in ascending order (unique_rows sorts them), so the count
            # so far shows a device's streams in numeric order, not "stream 20" before "7".
            rank_in_device = sum(1 for k in self.streams if k[0] == rank and k[2] == device)
            uuid = self.streams[key] = self._add(pb.TrackDescriptor(
                parent_uuid=parent, name=f"stream {tid}", sibling_order_rank=rank_in_device))
        return uuid

    def counter(self, rank: int, pid: int, device: str, track: str, unit: str) -> int:
        key = (rank, pid, device, track)
        uuid = self.counters.get(key)
        if uuid is None:
            parent = self.process(rank, pid) if device == "cpu" else self.device(rank, device)
            descriptor = pb.CounterDescriptor()
            if unit == "bytes":
                descriptor.unit = pb.CounterDescriptor.UNIT_SIZE_BYTES
            elif unit:
                descriptor.unit_name = unit
            uuid = self.counters[key] = self._add(pb.TrackDescriptor(
                parent_uuid=parent, name=track, counter=descriptor))
        return uuid

    def lane(self, stream: int, lane: int, packets: _PacketStream) -> int:
        """A track beside a stream for work that overlaps the stream's own (lane 0 is the stream).

        Perfetto nests the slices of one track; a source that times two kernels of one stream
        as overlapping gets the later one drawn on a lane of its own, durations untouched.
        """
        if lane == 0:
            return stream
        uuid = self.lanes.get((stream, lane))
        if uuid is None:
            base = self._by_uuid(stream)
            uuid = self.lanes[(stream, lane)] = self._add(pb.TrackDescriptor(
                parent_uuid=base.parent_uuid, name=f"{base.name} (overlap {lane})",
                sibling_order_rank=base.sibling_order_rank))
            # Written now: the descriptors were all written before the first event.
            packets.packet().track_descriptor.CopyFrom(self._by_uuid(uuid))
        return uuid

    def _by_uuid(self, uuid: int) -> pb.TrackDescriptor:
        return self._descriptors[uuid - 1]

    def describe(self, packets: _PacketStream) -> None:
        """Write every track descriptor, before any event refers to one."""
        for descriptor in self._descriptors:
            packets.packet().track_descriptor.CopyFrom(descriptor)


def _declare_wall_clock(packets: _PacketStream, timestamp: int) -> None:
    """Say that the trace's clock reads wall-clock time, so the UI can show dates and times.

    Packets carry no clock id, so readers take their times on the default trace clock
    (BOOTTIME); a snapshot in which BOOTTIME and REALTIME read the same maps one onto the other.
    """
    snapshot = packets.packet().clock_snapshot
    for clock in (pb.BUILTIN_CLOCK_BOOTTIME, pb.BUILTIN_CLOCK_REALTIME):
        snapshot.clocks.add(clock_id=clock, timestamp=timestamp)


def _write_slices(packets: _PacketStream, run: Run, rank: int, tracks: _Tracks, flows: Flows,
                  ticker: Ticker, batch_rows: int) -> None:
    """Each track's slices depth-first: a slice's end before its next sibling's begin."""
    categories: dict[tuple[str, str | None], str] = {}
    # Per thread track, the end times of its open slices, innermost last: the store's windows
    # give a track's slices window after window, other tracks' between them.
    open_ends: dict[int, list[int]] = {}
    lane_ends: dict[int, list[int]] = {}  # per stream: when each of its lanes is free again
    for batch in rank_batches(run, StoreTable.SLICES, rank, SLICE_COLUMNS, batch_rows):
        args = slice_args(batch)
        sources, targets = flows.marks(batch["id"])
        for i, name in enumerate(batch["name"]):
            pid, tid, device = batch["pid"][i], batch["tid"][i], batch["device"][i]
            start = batch["start_ns"][i]
            end = start + batch["dur_ns"][i]
            if device == "cpu":
                uuid = tracks.threads[(rank, pid, tid)]
                stack = open_ends.setdefault(uuid, [])
                _close(packets, uuid, stack, start)
                # The store clips children to their parent; clip here too so that an unnested
                # store (an old or foreign run) still gives well-formed begin/end pairs.
                if stack:
                    end = min(end, stack[-1])
            else:
                # Work on a stream never nests: it ends before the next begins on its lane.
                stream = tracks.streams[(rank, pid, device, tid)]
                ends = lane_ends.setdefault(stream, [])
                lane = next((k for k, free in enumerate(ends) if free <= start), len(ends))
                if lane == len(ends):
                    ends.append(end)
                ends[lane] = end
                uuid = tracks.lane(stream, lane, packets)
            packet = packets.packet(start, interned=True)
            event = packet.track_event
            event.type = _BEGIN
            event.track_uuid = uuid
            event.name_iid = packets.name_iid(packet, name)
            key = (batch["kind"][i], batch["category"][i])
            category = categories.get(key) or categories.setdefault(key, kineto_category(*key))
            event.category_iids.append(packets.category_iid(packet, category))
            if args[i]:
                add = event.debug_annotations.add
                for arg, value in args[i].items():
                    _annotate(add(), packets.arg_name_iid(packet, arg), value)
            if sources[i]:
                # +1: a flow id of 0 would read as "no flow".
                event.flow_ids.append(flow_key(rank, batch["correlation_id"][i]) + 1)
            elif targets[i]:
                event.terminating_flow_ids.append(flow_key(rank, batch["correlation_id"][i]) + 1)
            if device == "cpu":
                stack.append(end)
            else:
                _close(packets, uuid, [end], None)
        ticker.advance(len(batch["id"]))
    for uuid, stack in open_ends.items():
        _close(packets, uuid, stack, None)


def _close(packets: _PacketStream, track: int, open_ends: list[int], until: int | None) -> None:
    """End the open slices that end by ``until`` (all of them for None), innermost first."""
    while open_ends and (until is None or open_ends[-1] <= until):
        packet = packets.packet(open_ends.pop())
        packet.track_event.type = _END
        packet.track_event.track_uuid = track


def _annotate(annotation: pb.DebugAnnotation, name_iid: int, value: Any) -> None:
    annotation.name_iid = name_iid
    kind = type(value)  # exact types, most frequent first (bool is a subclass of int)
    if kind is int and value in _INT64:
        annotation.int_value = value
    elif kind is float:
        annotation.double_value = value
    elif kind is str:
        annotation.string_value = value
    elif kind is bool:
        annotation.bool_value = value
    else:  # shapes, grids, a foreign trace's nested arguments
        annotation.legacy_json_value = orjson.dumps(value).decode()


def _write_counters(packets: _PacketStream, run: Run, rank: int, tracks: _Tracks, ticker: Ticker,
                    batch_rows: int) -> None:
    columns = ["pid", "device", "track", "ts_ns", "value"]
    for batch in rank_batches(run, StoreTable.COUNTERS, rank, columns, batch_rows):
        for pid, device, track, ts, value in zip(batch["pid"], batch["device"], batch["track"],
                                                 batch["ts_ns"], batch["value"], strict=True):
            if value is not None:
                _count(packets, tracks.counters[(rank, pid, device or "cpu", track)], ts, value)
        ticker.advance(len(batch["ts_ns"]))


def _write_memory(packets: _PacketStream, run: Run, rank: int, tracks: _Tracks, ticker: Ticker,
                  batch_rows: int) -> None:
    """The memory table as the running totals it carries, per process and device."""
    columns = ["pid", "device", "ts_ns", "total_allocated", "total_reserved"]
    for batch in rank_batches(run, StoreTable.MEMORY, rank, columns, batch_rows):
        for i, device in enumerate(batch["device"]):
            where = (rank, batch["pid"][i], "cpu")
            for total in ("allocated", "reserved"):
                uuid = tracks.counters.get((*where, f"memory.{total} ({device})"))
                value = batch[f"total_{total}"][i]
                if uuid is not None and value is not None:
                    _count(packets, uuid, batch["ts_ns"][i], value)
        ticker.advance(len(batch["ts_ns"]))


def _count(packets: _PacketStream, uuid: int, ts: int, value: float) -> None:
    packet = packets.packet(ts)
    packet.track_event.type = _COUNTER
    packet.track_event.track_uuid = uuid
    packet.track_event.double_counter_value = float(value)
